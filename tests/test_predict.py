# bench/predict.py: the predicted peak memory of a config on a model too big for this machine.
# Independent references: the memory terms written out by hand (micro-batches, grad checkpointing, GQA's
# key/value width); the parameter counts of transformers' own Qwen2 model built from the same config.json
# fields on the meta device; the LoRA count written out as r * (in + out) per adapted projection.
import json

import pytest

from bench import memory as bench_memory
from bench import predict
from configurator import UserError


def test_micro_batches_checkpointing_and_kv_width_by_hand():
    # n_params 10, N 4 rows, prompt 3 + 4 new tokens, V 5, 2 layers, 2 wide, bf16, group 2:
    # T = 4, S = 7; c = 19 (bf16); micro M = 2: M*T*V = 40
    base = bench_memory.predicted_memory(10, 4, 3, 4, 5, 2, 2, 2, False, group=2)
    # KV 2*2*4*7*2*2 = 448; sampling 448 * 1.5 + 3*4*5*4 = 912; act 2*4*7*2*19*2 = 4256; N*T*V = 80
    assert (base["sampling"], base["reference"], base["policy_backward"]) == (912, 160, 4256 + 3 * 80 * 2)
    micro = bench_memory.predicted_memory(10, 4, 3, 4, 5, 2, 2, 2, False, group=2, micro=2)
    # the passes take 2 rows at a time: act 2*2*7*2*19*2 = 2128, logits 40; sampling keeps every row
    assert (micro["sampling"], micro["reference"], micro["policy_backward"]) == (912, 80, 2128 + 3 * 40 * 2)
    ckpt = bench_memory.predicted_memory(10, 4, 3, 4, 5, 2, 2, 2, False, group=2, micro=2, grad_checkpoint=True)
    # block inputs 2*2*7*2*2 = 112, one block's insides 2*7*2*19*2 = 1064
    assert ckpt["policy_backward"] == 112 + 1064 + 240
    gqa = bench_memory.predicted_memory(10, 4, 3, 4, 5, 2, 2, 2, False, group=2, kv_dim=1)
    assert gqa["sampling"] == 224 * 1.5 + 240                              # keys and values half as wide


@pytest.mark.parametrize("name", sorted(predict.PUBLISHED))
def test_parameter_counts_match_transformers(name, tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch
    fields = {**predict.COMMON, **predict.PUBLISHED[name]}
    with torch.device("meta"):
        theirs = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields))
    n_theirs = sum(p.numel() for p in theirs.parameters())                  # tied head counted once
    cfg = dict(base_ckpt=str(tmp_path / name), lora_r=16, lora_alpha=32, dtype="bfloat16",
               device="cpu", batch_size=2,
               group_size=8, max_new_tokens=256, micro_batch_size=8, grad_checkpoint=True,
               lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    r, args, source = predict.predict(cfg, 200)
    assert r["n_base"] == n_theirs and "published" in source
    C, inner, L = fields["hidden_size"], fields["intermediate_size"], fields["num_hidden_layers"]
    kv = C // fields["num_attention_heads"] * fields["num_key_value_heads"]
    per_layer = (C + C) + (C + kv) * 2 + (C + C) + (C + inner) * 2 + (inner + C)   # in + out of each projection
    assert r["n_lora"] == 16 * per_layer * L
    assert r["weights"] == 2 * n_theirs and r["lora"] == 16 * r["n_lora"]
    # a config.json in the directory is read instead of the table: one layer fewer shows
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps({**fields, "num_hidden_layers": L - 1}))
    r2, _, source2 = predict.predict(cfg, 200)
    assert r2["n_base"] < r["n_base"] and source2.endswith("config.json")


def test_the_8gb_config_is_predicted_within_8gb(capsys):
    r = predict.main(["config/gsm8k_qwen15b.py"])
    assert r["total"] <= 8e9 and "PREDICTION" in capsys.readouterr().out


@pytest.mark.parametrize("argv, match", [
    ([], "usage"), (["config/gsm8k_qwen15b.py", "--prompt_len=0"], "prompt_len"),
    (["config/gsm8k_qwen15b.py", "--base_ckpt=models/my-model"], "not one of the shapes known here"),
    (["config/gsm8k_qwen15b.py", "--micro_batch_size=-1"], "micro_batch_size")])
def test_bad_input_is_one_line(argv, match):
    with pytest.raises(UserError, match=match):
        predict.main(argv)


TINY_LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, vocab_size=100,
                  max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, hidden_act="silu")


def tiny_cfg(base, **kw):
    return {**dict(base_ckpt=str(base), lora_r=2, lora_alpha=4, dtype="float32", device="cpu",
                   batch_size=2,
                   group_size=2, max_new_tokens=8, micro_batch_size=4, grad_checkpoint=False,
                   lora_targets=("q_proj", "v_proj")), **kw}


def test_gqa_key_value_width_and_dtype_against_terms_written_by_hand(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(TINY_LLAMA))
    # N = 4 rows, prompt 10 + 8 new: S = 18 cache columns; one key/value head of 64 / 4 = 16: kv
    # width 16
    r, _, _ = predict.predict(tiny_cfg(tmp_path / "m"), 10)
    # 2 (k, v) * layers * N * S * 16 * float32
    kv = 2 * 2 * 4 * 18 * 16 * 4
    # + the group copy, one step's logits
    assert r["passes"]["sampling"] == kv * (1 + 1 / 2) + 3 * 4 * 100 * 4
    assert r["weights"] == 4 * r["n_base"] and r["dtype"] == "float32"
    r16, _, _ = predict.predict(tiny_cfg(tmp_path / "m", dtype="bfloat16"), 10)
    assert r16["passes"]["sampling"] == kv / 2 * 1.5 + 3 * 4 * 100 * 4
    assert r16["weights"] == 2 * r["n_base"]
    # 'auto' is what train_grpo.py runs on the config's device: float32 on a CPU without fast
    # bfloat16
    monkeypatch.setattr(predict, "bf16_is_fast", lambda device: (False, "no bf16 here"))
    auto, _, _ = predict.predict(tiny_cfg(tmp_path / "m", dtype="auto"), 10)
    assert auto["dtype"] == "float32"
    assert (auto["weights"], auto["passes"]) == (r["weights"], r["passes"])
    monkeypatch.setattr(predict, "bf16_is_fast", lambda device: (True, "AMX"))
    auto, _, _ = predict.predict(tiny_cfg(tmp_path / "m", dtype="auto"), 10)
    assert auto["dtype"] == "bfloat16"
    assert (auto["weights"], auto["passes"]) == (r16["weights"], r16["passes"])


def test_a_gpt2_directory_without_key_value_heads_is_predicted(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").write_text(json.dumps(dict(
        model_type="gpt2", n_embd=32, n_head=4, n_layer=2, n_positions=64, vocab_size=100)))
    r, args, _ = predict.predict(tiny_cfg(tmp_path / "g", lora_targets=("c_attn",)), 10)
    # every head a key/value head: width 32
    kv = 2 * 2 * 4 * 18 * 32 * 4
    assert r["passes"]["sampling"] == kv * 1.5 + 3 * 4 * 100 * 4


@pytest.mark.parametrize("knob, match", [
    ("--dtype=float64", "dtype must be"), ("--dtype=float16", "dtype must be"),
    ("--prompt_len=32700", "max_new_tokens"), ("--prompt_len=40000", "whole context"),
    ("--tracin=True", "grad_checkpoint=False"), ("--micro_batch_size=0", "micro_batch_size"),
    ("--micro_batch_size=3", "micro_batch_size"), ("--group_size=1", "group_size"),
    ("--top_p=1.5", "top_p"),
    ("--device=tpu", "unknown device"), ("--max_new_tokens=0", "max_new_tokens")])
def test_what_train_grpo_refuses_gets_no_prediction(knob, match, capsys):
    with pytest.raises(UserError, match=match):
        predict.main(["config/gsm8k_qwen15b.py", knob])
    assert "PREDICTION" not in capsys.readouterr().out


def test_a_project_checkpoint_as_base_is_named_not_sent_to_download(tiny_setup, tmp_path):
    with pytest.raises(UserError, match="is a train_base.py checkpoint of this project, not a "
                                        "Hugging Face model "
                                        "directory") as e:
        predict.main(["config/gsm8k_qwen15b.py", f"--base_ckpt={tiny_setup}"])
    assert "download the model" not in str(e.value) and "base_ckpt=DIR" in str(e.value)
    with pytest.raises(UserError, match="train_base.py checkpoint of this project") as e:
        predict.main(["config/tiny_grpo.py"])  # its base_ckpt, out/base/ckpt.pt, not trained here
    assert "download the model" not in str(e.value)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="is a file that is not a checkpoint"):
        predict.main(["config/gsm8k_qwen15b.py", f"--base_ckpt={tmp_path / 'notes.txt'}"])
