"""pretrained/hf.from_pretrained, sampling and training on Hugging Face directories, and the exported adapter,
against transformers and peft on tiny random models made in a temporary directory (tests/hf_dirs.py).
Run: python -m pytest -q tests/test_pretrained.py"""
import json
import os
import subprocess
import sys

import pytest
import torch


pytest.importorskip("transformers", reason="transformers is the test-only reference (installed by .ci/run)")
pytest.importorskip("tokenizers", reason="tokenizers trains the test tokenizers (installed by .ci/run)")
pytest.importorskip("safetensors", reason="safetensors reads the weights (requirements.txt)")
from safetensors.torch import load_file, save_file  # noqa: E402

from analysis import attribute
from configurator import UserError  # noqa: E402
from hf_dirs import make_dir, write_config  # noqa: E402
from model import GPT  # noqa: E402
from pretrained.hf import from_pretrained  # noqa: E402
from model import Sampling, generate, uniforms  # noqa: E402
from pretrained.tokenizer import load_hf_tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {  # name: make_dir arguments; every family, GQA, tied and untied heads, a non-default theta, shards
    "gpt2": dict(family="gpt2"),
    "qwen2": dict(family="qwen2", tied=False, kv_heads=2, rope_theta=50000.0, shard=True),
    "qwen2_tied_mqa": dict(family="qwen2", tied=True, kv_heads=1),
    "llama": dict(family="llama", tied=False, kv_heads=2),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """name -> (path, transformers model, HF tokenizer), made once for this file."""
    out = {}
    for name, kw in CASES.items():
        path = str(tmp_path_factory.mktemp(name))
        out[name] = (path, *make_dir(path, **kw))
    return out


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("name", CASES)
def test_logits_equal_transformers(dirs, name):
    path, hf, _ = dirs[name]
    model = from_pretrained(path)
    if name == "qwen2":
        assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 1  # really sharded
    assert model.config.tie_head == CASES[name].get("tied", True)
    assert (model.lm_head.weight is model.transformer.wte.weight) == model.config.tie_head
    x = torch.randint(0, hf.config.vocab_size, (3, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, ours = hf(x).logits, model(x, keep_last=21)[0]
    assert ours.shape == ref.shape
    assert rel(ours, ref) <= 1e-5


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_left_padded_rows_equal_transformers_with_an_attention_mask(dirs, name):
    """Padding: positions restart at 0 on each row's first real token (learned or rotary), as
    transformers' generate computes them from the attention mask."""
    path, hf, _ = dirs[name]
    model = from_pretrained(path)
    x = torch.randint(0, hf.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(2))
    pad_left = torch.tensor([0, 3, 7])
    am = (torch.arange(12)[None] >= pad_left[:, None]).long()
    with torch.no_grad():
        ref = hf(x, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp(min=0)).logits
        ours = model(x, pad_left=pad_left, keep_last=12)[0]
    real = am.bool()
    assert rel(ours[real], ref[real]) <= 1e-5


@pytest.mark.parametrize("name", CASES)
def test_kv_cache_greedy_equals_transformers_generate(dirs, name):
    path, hf, tok = dirs[name]
    model, enc = from_pretrained(path), load_hf_tokenizer(path)
    padded = list(range(enc.n_vocab, hf.config.vocab_size))  # rows beyond the tokenizer: never sampled
    assert padded
    for text in ["Mia has 12 apples", "How many? 3+4="]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, suppress_tokens=padded,
                          pad_token_id=enc.eot_token)[0, len(ids):].tolist()
        greedy = Sampling(temperature=0, vocab_size=enc.n_vocab)
        idx, _, mask = generate(model, [ids], 16, enc.stop_tokens, sampling=greedy)
        ours = idx[0, len(ids):][mask[0].bool()].tolist()
        assert ours == ref[:len(ours)] and len(ours) in (16, len(ref))  # transformers pads after its eos


def test_padded_vocabulary_rows_are_never_drawn(dirs):
    path, hf, _ = dirs["llama"]
    model, enc = from_pretrained(path), load_hf_tokenizer(path)
    with torch.no_grad():  # make the padded rows the most likely tokens by far
        model.lm_head.weight[enc.n_vocab:] = model.lm_head.weight[:1] * 50
    u = uniforms(8, 4, 0, "cpu")
    idx, _, _ = generate(model, [[5, 6, 7]] * 4, 8, enc.stop_tokens, u=u)
    assert (idx[:, 3:] >= enc.n_vocab).any()  # without the cap they win
    for temperature in (0, 1.0):
        sampling = Sampling(temperature=temperature, vocab_size=enc.n_vocab)
        idx, _, _ = generate(model, [[5, 6, 7]] * 4, 8, enc.stop_tokens, sampling=sampling, u=u)
        assert (idx < enc.n_vocab).all()


def test_bf16_loading_stays_bf16(dirs):
    path, hf, _ = dirs["qwen2"]
    model = from_pretrained(path, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    x = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        ours = model(x, keep_last=9)[0]
        ref = hf.to(torch.bfloat16)(x).logits
        hf.float()
    assert ours.dtype == torch.bfloat16 and rel(ours.float(), ref.float()) < 0.05


def test_config_errors_are_one_line(tmp_path, dirs):
    path = dirs["llama"][0]

    def fails(match, **changes):
        d = tmp_path / f"d{len(os.listdir(tmp_path))}"
        os.makedirs(d)
        for f in os.listdir(path):
            os.symlink(os.path.join(path, f), d / f)
        os.remove(d / "config.json")
        json.dump(json.load(open(f"{path}/config.json")), open(d / "config.json", "w"))
        write_config(str(d), **changes)
        with pytest.raises(UserError, match=match) as e:
            from_pretrained(str(d))
        assert "\n" not in str(e.value)

    fails("model_type 'mistral' is not supported", model_type="mistral")
    fails("rope scaling 'llama3' is not implemented",
          rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0})
    fails("rope scaling 'linear'", rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0})
    fails("lacks 'hidden_size'", hidden_size=None)
    fails("hidden_act = 'gelu' is not allowed", hidden_act="gelu")
    fails(r"model\.layers\.0\.self_attn\.k_proj\.weight has shape", num_key_value_heads=4)
    with pytest.raises(UserError, match="no config.json"):
        from_pretrained(str(tmp_path))
    with pytest.raises(UserError, match="model directory not found"):
        from_pretrained(str(tmp_path / "nowhere"))


def test_weight_file_errors_name_the_tensor(tmp_path, dirs):
    src = dirs["gpt2"][0]
    sd = load_file(f"{src}/model.safetensors")

    def fails(match, tensors):
        d = tmp_path / f"d{len(os.listdir(tmp_path))}"
        os.makedirs(d)
        os.symlink(f"{src}/config.json", d / "config.json")
        if tensors is not None:
            save_file(tensors, str(d / "model.safetensors"))
        with pytest.raises(UserError, match=match):
            from_pretrained(str(d))

    fails(r"missing tensor transformer\.h\.1\.mlp\.c_fc\.bias", {k: v for k, v in sd.items() if k != "transformer.h.1.mlp.c_fc.bias"})
    fails("unexpected tensor transformer.h.2.ln_1.weight", {**sd, "transformer.h.2.ln_1.weight": torch.ones(64)})
    fails("transformer.wpe.weight has shape", {**sd, "transformer.wpe.weight": torch.zeros(64, 64)})
    fails("no model.safetensors", None)
    for damage in (b"garbage", open(f"{src}/model.safetensors", "rb").read()[:5000]):  # not one, cut off
        d = tmp_path / f"d{len(os.listdir(tmp_path))}"
        os.makedirs(d)
        os.symlink(f"{src}/config.json", d / "config.json")
        (d / "model.safetensors").write_bytes(damage)
        with pytest.raises(UserError, match="model.safetensors is not a readable safetensors file.*download it again"):
            from_pretrained(str(d))
    # GPT-2 files written without the "transformer." prefix load too (older checkpoints)
    d = tmp_path / "noprefix"
    os.makedirs(d)
    os.symlink(f"{src}/config.json", d / "config.json")
    save_file({k.removeprefix("transformer."): v for k, v in sd.items()}, str(d / "model.safetensors"))
    x = torch.randint(0, 300, (1, 8))
    assert torch.equal(from_pretrained(str(d))(x)[0], from_pretrained(src)(x)[0])


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "llama"])
def test_sample_cli_continues_raw_text_as_transformers_does(dirs, name):
    path, hf, tok = dirs[name]
    text = "Sam buys 7 cards"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0,
                      suppress_tokens=list(range(len(tok), hf.config.vocab_size)))
    expected = tok.decode(out[0], skip_special_tokens=True)
    res = subprocess.run([sys.executable, "sample.py", f"--ckpt={path}", f"--start={text}", "--temperature=0",
                          "--max_new_tokens=16", "--num_samples=1"], cwd=ROOT, capture_output=True,
                         env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert res.returncode == 0, res.stderr
    # the whole output as bytes, not its lines: a random model's text may hold \r (text mode makes it \n),
    # \x1c-\x1e, \x85 or \u2028 (str.splitlines() ends a line there); the configurator's lines come first
    assert res.stdout.decode("utf-8").endswith("\n" + expected + "\n---------------\n")
    assert len(tok(expected)["input_ids"]) > len(tok(text)["input_ids"])  # it continued


def test_lora_targets_name_the_familys_layers(dirs, tmp_path):
    import train_grpo
    with pytest.raises(UserError, match=r"match no nn.Linear.*q_proj"):
        train_grpo.main([f"--base_ckpt={dirs['llama'][0]}", f"--out_dir={tmp_path}/run", "--max_iters=1"])


@pytest.fixture(scope="module")
def run(dirs, tmp_path_factory):
    """A TracIn-GRPO run of 3 steps on the chat-format Qwen2 directory, adapter on every projection,
    with a reward that varies for a random model (completion length), so the adapter moves."""
    import rewards
    import train_grpo
    from data.gsm_synth.prepare import prepare
    data = prepare(steps=1, max_operand=5, ops="+", n_train=200, n_val=20, n_test=20, num_merges=20,
                   verbose=False, root=str(tmp_path_factory.mktemp("data")))
    out = str(tmp_path_factory.mktemp("runs") / "qwen")
    rewards.REWARD_FUNCS["chars"] = lambda completion, answer: len(completion) / 10
    try:
        train_grpo.main([f"--base_ckpt={dirs['qwen2'][0]}", f"--data_dir={data}", f"--out_dir={out}",
                         "--max_iters=3", "--batch_size=2", "--group_size=4", "--max_new_tokens=12",
                         "--eval_n=4", "--eval_k=2", "--eval_interval=10", "--ckpt_interval=1", "--tracin=True",
                         "--tracin_val_batch_size=2", "--tracin_val_loss=nll", "--learning_rate=0.05",
                         "--reward_funcs=('chars',)", "--reward_weights=(1.0,)",
                         "--lora_targets=('q_proj','k_proj','v_proj','o_proj','gate_proj','up_proj','down_proj')"])
    finally:
        del rewards.REWARD_FUNCS["chars"]
    return out


def test_grpo_run_on_a_directory_uses_its_chat_format_and_records_the_base(run, dirs):
    from data.prompts import CHAT_INSTRUCTION
    path, _, tok = dirs["qwen2"]
    ckpt = torch.load(f"{run}/ckpt.pt", weights_only=True)
    assert ckpt["base_ckpt"] == path and len(ckpt["base_fingerprint"]) == 16
    assert any(v.abs().sum() > 0 for k, v in ckpt["lora"].items() if "lora_B" in k)  # it trained
    from runs.loading import load_policy
    _, enc, _ = load_policy(f"{run}/ckpt.pt")
    from data.prompts import encode_prompt
    q = "Mia has 2 pears. How many?"
    want = tok.apply_chat_template([{"role": "user", "content": q + CHAT_INSTRUCTION}], add_generation_prompt=True,
                                   tokenize=True, return_dict=True)["input_ids"]
    assert encode_prompt(enc, q) == list(want)


def test_tracin_cli_attributes_on_a_directory_run(run):
    import tracin
    out = f"{run}/attr.json"
    attribute.main([f"--out_dir={run}", "--question=Mia has 2 pears. How many?", "--n_probe=4", f"--out_json={out}"])
    res = json.load(open(out))
    assert res["most_influential_positive"] or res["most_influential_negative"]


def test_exported_adapter_gives_the_projects_logits_in_peft(run, dirs):
    peft = pytest.importorskip("peft", reason="peft is the test-only reference for adapters (installed by .ci/run)")
    import export
    from runs.loading import load_policy
    from transformers import AutoModelForCausalLM
    export.main([f"--out_dir={run}", "--merged=True"])
    cfg = json.load(open(f"{run}/peft_adapter/adapter_config.json"))
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 16 and cfg["base_model_name_or_path"] == dirs["qwen2"][0]
    assert sorted(cfg["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                    "down_proj"])
    ours, _, _ = load_policy(f"{run}/ckpt.pt")  # base + LoRA, unmerged
    base = AutoModelForCausalLM.from_pretrained(dirs["qwen2"][0])
    peft_model = peft.PeftModel.from_pretrained(base, f"{run}/peft_adapter").eval()
    x = torch.randint(0, 300, (2, 15), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        mine = ours(x, keep_last=15)[0]
        assert rel(mine, AutoModelForCausalLM.from_pretrained(dirs["qwen2"][0])(x).logits) > 1e-3  # it moved
        assert rel(mine, peft_model(x).logits) <= 1e-5
        merged_hf = AutoModelForCausalLM.from_pretrained(f"{run}/merged")(x).logits
        merged_ours = from_pretrained(f"{run}/merged")(x, keep_last=15)[0]
    assert rel(merged_hf, mine) <= 1e-5 and rel(merged_ours, mine) <= 1e-5
    export.main([f"--out_dir={run}"])  # its own earlier export is replaced; a user's file is not
    open(f"{run}/peft_adapter/notes.txt", "w").close()
    with pytest.raises(UserError, match="did not write"):
        export.main([f"--out_dir={run}"])


def test_gpt2_adapter_on_conv1d_layers_loads_in_peft(dirs, tmp_path, chars_reward):
    """GPT-2's c_attn / c_proj / c_fc are Conv1D in transformers ((in, out) weights): peft adapts them
    with fan_in_fan_out, and computes what this project's nn.Linear + LoRA computes."""
    peft = pytest.importorskip("peft", reason="peft is the test-only reference for adapters (installed by .ci/run)")
    import export
    import train_grpo
    from data.gsm_synth.prepare import prepare
    from runs.loading import load_policy
    from transformers import AutoModelForCausalLM
    data = prepare(steps=1, max_operand=5, ops="+", n_train=100, n_val=10, n_test=10, num_merges=20,
                   verbose=False, root=str(tmp_path))
    path, run = dirs["gpt2"][0], str(tmp_path / "run")
    train_grpo.main([f"--base_ckpt={path}", f"--data_dir={data}", f"--out_dir={run}", "--max_iters=2",
                     "--batch_size=2", "--group_size=4", "--max_new_tokens=10", "--eval_n=2", "--learning_rate=0.05",
                     "--reward_funcs=('chars',)", "--reward_weights=(1.0,)", "--lora_targets=('c_attn','c_fc')"])
    export.main([f"--out_dir={run}"])
    assert json.load(open(f"{run}/peft_adapter/adapter_config.json"))["fan_in_fan_out"] is True
    ours, _, _ = load_policy(f"{run}/ckpt.pt")
    theirs = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), f"{run}/peft_adapter").eval()
    x = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert rel(ours(x, keep_last=11)[0], theirs(x).logits) <= 1e-5
        assert rel(ours(x, keep_last=11)[0], AutoModelForCausalLM.from_pretrained(path)(x).logits) > 1e-4


def test_a_run_directory_given_as_a_model_directory_is_named(tmp_path):
    os.makedirs(tmp_path / "run")
    open(tmp_path / "run" / "ckpt.pt", "w").close()
    with pytest.raises(UserError, match=r"is a run directory.*give its checkpoint"):
        from_pretrained(str(tmp_path / "run"))


def test_export_refuses_a_run_on_the_tiny_base(tiny_setup, tmp_path, chars_reward):
    import export
    import train_grpo
    train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path}/run", "--max_iters=1", "--batch_size=2",
                     "--group_size=2", "--eval_n=2", "--max_new_tokens=8"])
    with pytest.raises(UserError, match="export needs a run on a Hugging Face model directory"):
        export.main([f"--out_dir={tmp_path}/run"])
    with pytest.raises(UserError, match="not a train_grpo.py checkpoint"):
        export.main([f"--out_dir={os.path.dirname(tiny_setup)}"])
    with pytest.raises(UserError, match="merged_dir"):
        export.main([f"--out_dir={tmp_path}/run", f"--merged_dir={tmp_path}/m"])
