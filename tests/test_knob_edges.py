# The edges of what the knob checks allow, each side pinned: a temperature exactly at its floor, a
# top-k fraction of 1, TracIn refused with LoRA dropout before any work, every knob that picks a
# resumed base's data (countdown_give_up too), the evaluation's KV cache as grouped-query attention
# allocates it, a tokenizer with exactly as many ids as embedding rows, a missing base spelt ./out/...,
# and a data fingerprint recorded before the tokenizer was part of it.
# Run: python -m pytest -q tests/test_knob_edges.py
import os

import pytest
import torch

import sample
import train_base as tb
import train_grpo as tg
from checks import base_knobs
from checks.base_knobs import check_kv_cache, check_resume
from checks.grpo_knobs import validate
from configurator import UserError, configure
from conftest import build_gpt
from data.datadir import bound_data, changed_data, data_fingerprint
from data.gsm_synth.prepare import prepare
from data.tasks import BASE_KEYS
from runs.loading import load_base
from test_base_path import NoTraining, train_if_missing
from model import MIN_TEMPERATURE
from tracin import TracInKnobs, select_rollouts


def grpo_validate(base, **knobs):
    validate(configure(tg.defaults, [f"--base_ckpt={base}"] +
                       [f"--{k}={v}" for k, v in knobs.items()]))


# --- temperature at its floor; the top-k fraction 1 -----------------------------------------------
def test_a_temperature_at_its_floor_is_allowed(tiny_setup, capsys):
    grpo_validate(tiny_setup, temperature=MIN_TEMPERATURE)
    with pytest.raises(UserError, match="'temperature' .* must be >= "):
        grpo_validate(tiny_setup, temperature=MIN_TEMPERATURE * (1 - 1e-9))
    sample.main([f"--ckpt={tiny_setup}", f"--temperature={MIN_TEMPERATURE}", "--num_questions=1",
                 "--max_new_tokens=2"])  # the sample CLI's floor is the same
    assert capsys.readouterr().out
    with pytest.raises(UserError, match="'temperature' .* must be 0 \\(greedy\\) or >= "):
        sample.main([f"--ckpt={tiny_setup}", f"--temperature={MIN_TEMPERATURE * (1 - 1e-9)}"])


@pytest.mark.parametrize("frac, kept", [(1.0, 7), (1, 7), (0.5, 4), (0.1, 1)])
def test_a_top_k_fraction_up_to_1_is_allowed_and_keeps_its_share(tiny_setup, frac, kept):
    grpo_validate(tiny_setup, tracin=True, tracin_selection="topk", tracin_topk_frac=frac)
    influence = torch.tensor([0.3, -1.0, 2.0, 0.0, -0.5, 1.5, 0.7])
    keep = select_rollouts(influence, TracInKnobs(selection="topk", topk_frac=frac, ranking="dot"))
    assert keep.sum() == kept
    assert influence[keep].min() >= influence[~keep].max() if kept < 7 else keep.all()


@pytest.mark.parametrize("frac", [0.0, 1.0000001, 2.0])
def test_a_top_k_fraction_beyond_0_1_is_refused(tiny_setup, frac):
    with pytest.raises(UserError, match=r"'tracin_topk_frac' .* must be in \(0, 1\]"):
        grpo_validate(tiny_setup, tracin=True, tracin_selection="topk", tracin_topk_frac=frac)


# --- TracIn needs each activation once, as the gradient used it -----------------------------------
@pytest.mark.parametrize("knobs", [dict(lora_dropout=0.1), dict(lora_dropout=0.5),
                                   dict(grad_checkpoint=True)])
def test_tracin_with_lora_dropout_or_checkpointing_is_refused_before_work(tiny_setup, tmp_path,
                                                                       knobs):
    with pytest.raises(UserError, match="tracin=True needs grad_checkpoint=False and lora_dropout=0"):
        tg.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'r'}", "--tracin=True",
                 *[f"--{k}={v}" for k, v in knobs.items()]])
    assert not (tmp_path / "r").exists()
    grpo_validate(tiny_setup, **knobs)  # without TracIn: allowed


# --- a resumed base: every knob that picks its data keeps its value -------------------------------
def changed(value):
    return (not value if isinstance(value, bool) else value + 1 if isinstance(value, (int, float))
            else value + "*")


DATA_KEYS = sorted({k for keys in BASE_KEYS.values() for k in keys.values()} | {"task"})


@pytest.mark.parametrize("key", DATA_KEYS)
def test_a_resumed_base_keeps_every_knob_that_picks_its_data(key):
    saved = {**tb.defaults, "task": "countdown" if key.startswith("countdown") else "arith"}
    cfg = {**saved, key: changed(saved[key])}
    with pytest.raises(UserError, match=f"'{key}' = .* cannot change on resume: .*picks the task"):
        check_resume(cfg, {"model_args": {}, "config": saved}, "b/ckpt.pt")
    check_resume(dict(saved), {"model_args": {}, "config": saved}, "b/ckpt.pt")


# --- the evaluation's KV cache: n_kv_head key/value heads, not n_head -----------------------------
@pytest.mark.parametrize("n_head, n_kv_head", [(4, 1), (4, 2), (4, 0), (2, 1)])
def test_kv_cache_check_counts_the_key_value_heads(monkeypatch, n_head, n_kv_head):
    model = build_gpt(n_head=n_head, n_kv_head=n_kv_head, n_embd=32)
    cache = model.new_cache(3, 40)  # the reference: what it really allocates
    need = cache.k.nbytes + cache.v.nbytes
    monkeypatch.setattr(base_knobs, "memory_of", lambda device: need)
    check_kv_cache(model, 3, 40, "cpu", "the evaluation's", "lower it")  # fits exactly
    monkeypatch.setattr(base_knobs, "memory_of", lambda device: need - 1)
    with pytest.raises(UserError, match=r"cannot allocate the evaluation's KV cache .* lower it"):
        check_kv_cache(model, 3, 40, "cpu", "the evaluation's", "lower it")


# --- a Hugging Face directory whose tokenizer fills every embedding row ---------------------------
@pytest.mark.parametrize("pad_rows, ok", [(0, True), (3, True), (-1, False)])
def test_a_tokenizer_as_large_as_the_embedding_is_allowed(tmp_path, pad_rows, ok):
    pytest.importorskip("transformers")
    from hf_dirs import make_dir
    path = str(tmp_path / "hf")
    _, tok = make_dir(path, "qwen2", pad_rows=pad_rows)
    if ok:
        model, enc, _ = load_base(path)
        assert enc.n_vocab == len(tok) == model.config.vocab_size - pad_rows
    else:
        with pytest.raises(UserError, match="the tokenizer has .* tokens but the model only"):
            load_base(path)


# --- a missing base is trained where base_config puts it, however that is spelt -------------------
@pytest.mark.parametrize("base, out_dir", [("./out/base/ckpt.pt", "out/base"),
                                           ("out/base/ckpt.pt", "./out/base"),
                                           ("out//base/./ckpt.pt", "out/base/"),
                                           ("out/x/../base/ckpt.pt", "out/base")])
def test_a_missing_base_in_any_spelling_is_trained(tmp_path, monkeypatch, base, out_dir):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.py").write_text(f"out_dir = {out_dir!r}\n")
    trainer = NoTraining()
    train_if_missing(base, "c.py", "cpu", trainer)
    assert len(trainer.calls) == 1
    with pytest.raises(UserError, match="only .* where base_config puts it, is trained"):
        train_if_missing("./other/ckpt.pt", "c.py", "cpu", trainer)


# --- a data fingerprint recorded before the tokenizer was part of it ------------------------------
def test_an_older_fingerprint_without_the_tokenizer_still_resumes(tmp_path):
    d = prepare(steps=1, max_operand=5, ops="+", n_train=40, n_val=5, n_test=5, num_merges=0,
                verbose=False, root=str(tmp_path))
    now = data_fingerprint(d)
    older = {k: v for k, v in now.items() if k != "tokenizer"}
    assert "tokenizer" in now and changed_data(older, now) == []
    assert bound_data(d, {"data_fingerprint": older}) == now
    with open(os.path.join(d, "val.jsonl"), "a") as f:  # a split changed since: still refused
        f.write(open(os.path.join(d, "test.jsonl")).readline())
    assert changed_data(older, data_fingerprint(d)) == ["val split"]
    with pytest.raises(UserError, match=r"changed: val split"):
        bound_data(d, {"data_fingerprint": older})


# --- torchrun: the validation batch and the process count -----------------------------------------
def test_a_validation_batch_that_does_not_split_over_the_processes_is_refused(tiny_setup, monkeypatch):
    monkeypatch.setenv("RANK", "0"); monkeypatch.setenv("WORLD_SIZE", "2"); monkeypatch.setenv("LOCAL_RANK", "0")
    grpo_validate(tiny_setup, tracin=True, batch_size=4, tracin_val_batch_size=4)
    with pytest.raises(UserError, match=r"'tracin_val_batch_size' = 3 .* must split evenly over the 2 processes$"):
        grpo_validate(tiny_setup, tracin=True, batch_size=4, tracin_val_batch_size=3)
