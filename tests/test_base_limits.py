# Knobs that used to end in a traceback, or were found only after the whole base had trained, are
# one-line errors before iteration 0: max_new_tokens beyond the context (alone, or with the longest
# test question), a seed beyond torch's 64 bits, a learning rate whose AdamW step overflows float32
# (train_base.py and train_grpo.py: configurator.check_finite / check_adam_lr), and a model or an
# evaluation KV cache too large to allocate (naming the knob to lower).
# Run: python -m pytest -q tests/test_base_limits.py
import os

import pytest

import train_base as tb
import train_grpo as tg
from configurator import UserError, check_finite
from data.datadir import load_split, load_tokenizer
from data.gsm_synth.prepare import prepare
from model import GPT
from data.prompts import encode_prompt

ARGS = ["--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=96", "--batch_size=4",
        "--eval_n=4", "--eval_interval=2", "--log_interval=2", "--max_new_tokens=6",
        "--warmup_iters=1", "--max_iters=2"]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = prepare(steps=1, max_operand=5, ops="+", n_train=200, n_val=10, n_test=10, num_merges=20,
                verbose=False, root=str(tmp_path_factory.mktemp("d")))
    return d, load_tokenizer(d)


@pytest.fixture
def base(task, monkeypatch, tmp_path):
    """train_base.main on the tiny task; training must not start (every check comes first)."""
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: task)
    monkeypatch.setattr(tb, "train", lambda cfg, run: pytest.fail("training started"))
    return lambda *extra: tb.main([f"--out_dir={tmp_path / 'b'}", *ARGS, *extra])


def refused(call, pattern):
    with pytest.raises(UserError, match=pattern) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("mnt", ["96", "97", "1000", str(10 ** 9)])
def test_max_new_tokens_beyond_the_block_is_refused_before_any_work(monkeypatch, tmp_path, mnt):
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: pytest.fail("work started"))
    refused(lambda: tb.main([f"--out_dir={tmp_path / 'b'}", *ARGS, f"--max_new_tokens={mnt}"]),
            f"'max_new_tokens' = {mnt} is not allowed: must be < block_size=96")
    assert not (tmp_path / "b").exists()


def longest_prompt(task):
    data_dir, enc = task
    return max(len(encode_prompt(enc, e["question"])) for e in load_split(data_dir, "test")[:4])


@pytest.mark.parametrize("over", [1, 2, 30])
def test_prompt_and_max_new_tokens_beyond_the_block_before_iteration_0(base, task, tmp_path, over):
    """The training sequences fit; the longest test question + max_new_tokens does not: refused
    before any training, naming the most max_new_tokens that fits."""
    block, fits = 96, 96 - longest_prompt(task)
    msg = refused(lambda: base(f"--max_new_tokens={min(fits + over, block - 1)}"),
                  r"'max_new_tokens' = \d+ is not allowed: the longest test question .* must fit "
                  f"block_size={block}: give at most {fits}")
    assert "give at most" in msg and not (tmp_path / "b" / "ckpt.pt").exists()


def test_max_new_tokens_that_fits_exactly_trains(task, monkeypatch, tmp_path):
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: task)
    fits = 96 - longest_prompt(task)
    tb.main([f"--out_dir={tmp_path / 'b'}", *ARGS, f"--max_new_tokens={fits}"])
    assert (tmp_path / "b" / "ckpt.pt").exists()


def test_max_new_tokens_too_large_on_resume_keeps_the_checkpoint(task, monkeypatch, tmp_path):
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: task)
    tb.main([f"--out_dir={tmp_path / 'b'}", *ARGS])
    before = (tmp_path / "b" / "ckpt.pt").read_bytes()
    monkeypatch.setattr(tb, "train", lambda cfg, run: pytest.fail("training started"))
    for mnt in (95, 96 - longest_prompt(task) + 1):
        refused(lambda: tb.main([f"--out_dir={tmp_path / 'b'}", "--init_from=resume",
                                 "--max_iters=4", f"--max_new_tokens={mnt}"]), "'max_new_tokens'")
    assert (tmp_path / "b" / "ckpt.pt").read_bytes() == before


SEEDS = [2 ** 64, 2 ** 63, 2 ** 64 - 1, -2 ** 63 - 1, 10 ** 30, -10 ** 40]
LRS = [("learning_rate", "1e39"), ("learning_rate", "3.5e38"), ("learning_rate", "1e38"),
       ("learning_rate", "1e300"), ("min_lr", "1e39"), ("min_lr", "1e38")]


@pytest.mark.parametrize("seed", SEEDS)
def test_base_seed_beyond_64_bits(base, tmp_path, seed):
    refused(lambda: base(f"--seed={seed}"),
            f"'seed' = {seed} is not allowed: must be a 64-bit integer")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("key, value", LRS)
def test_base_learning_rate_overflowing_float32(base, tmp_path, key, value):
    refused(lambda: base(f"--{key}={value}"),
            f"'{key}' = .* is not allowed: must (fit a float32|be at most)")
    assert not (tmp_path / "b").exists()


def test_base_learning_rate_bound_follows_beta1(base):
    """AdamW's first step is lr / (1 - beta1): the bound moves with beta1."""
    refused(lambda: base("--learning_rate=1e37", "--beta1=0.99"),
            r"'learning_rate' = .* at most 3.4e\+36")
    refused(lambda: base("--learning_rate=1e35", "--beta1=0.999999"), "'learning_rate'")


def test_check_finite_limits():
    check_finite({"seed": 2 ** 63 - 1, "x": 3.4e38, "grad_clip": float("inf"),
                  "data_seed": -2 ** 63}, "grad_clip")
    check_finite({"grad_clip": 1e39}, "grad_clip")  # a listed key may be Inf, so any size
    for cfg in ({"seed": 2 ** 63}, {"data_seed": -2 ** 63 - 1}, {"temperature": -1e39},
                {"top_p": float("nan")}):
        with pytest.raises(UserError, match=f"'{next(iter(cfg))}'"):
            check_finite(cfg)


GRPO = ["--batch_size=2", "--group_size=2", "--max_new_tokens=4", "--eval_n=2", "--eval_k=1",
        "--max_iters=1"]


@pytest.mark.parametrize("arg", [f"--seed={s}" for s in SEEDS[:4]] +
                         [f"--{k}={v}" for k, v in LRS])
def test_grpo_seed_and_learning_rate(tiny_setup, tmp_path, arg):
    key = arg[2:].split("=")[0]
    refused(lambda: tg.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'r'}", *GRPO,
                             arg]), f"'{key}' = .* is not allowed")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("block", [2 ** 50, 2 ** 61, 2 ** 64, 10 ** 30])
def test_a_block_size_the_model_cannot_allocate(base, tmp_path, block):
    refused(lambda: base(f"--block_size={block}"),
            f"cannot allocate the model on cpu \\(block_size={block}, .*: .*; lower block_size")
    assert not (tmp_path / "b" / "ckpt.pt").exists()


@pytest.mark.parametrize("arg", [f"--n_embd={2 ** 40}", "--n_embd=1000000", f"--n_layer={10 ** 9}",
                                 f"--n_layer={2 ** 70}"])
def test_an_n_layer_or_n_embd_the_model_cannot_allocate(base, arg):
    """Weights beyond the machine's memory are refused at once (10**9 layers, one at a time, would
    take minutes to fail)."""
    refused(lambda: base(arg), "cannot allocate the model .*; lower n_layer or n_embd")


def test_a_kv_cache_that_cannot_be_allocated_is_found_before_iteration_0(base, monkeypatch,
                                                                         tmp_path):
    def no_memory(self, B, max_len, pad_left=None):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 TB"
                           "\nmore")
    monkeypatch.setattr(GPT, "new_cache", no_memory)
    refused(lambda: base(), r"cannot allocate the evaluation's KV cache \(4 rows x \d+ positions x "
                            r"1 layers on cpu\): DefaultCPUAllocator: .*; lower max_new_tokens")
    assert not os.path.exists(tmp_path / "b" / "ckpt.pt")


def test_a_kv_cache_beyond_the_memory_is_refused_without_trying(base, task, monkeypatch):
    """Weights that fit, a cache that does not (here: the model built, then memory just above the
    weights' float32 bytes; the batch's own check left out)."""
    from checks import base_knobs as base_checks
    n_vocab, n, fits = task[1].n_vocab, 16, 96 - longest_prompt(task)
    weights = 4 * (12 * n * n + (n_vocab + 96) * n)
    asked = []  # build_model asks first: room for the model's training state
    monkeypatch.setattr(base_checks, "memory_of", lambda device: asked.append(device) or
                        (2 ** 40 if len(asked) == 1 else weights + 1))
    monkeypatch.setattr(tb, "check_batch", lambda *a: None)
    monkeypatch.setattr(GPT, "new_cache", lambda *a, **k: pytest.fail("allocation tried"))
    refused(lambda: base(f"--max_new_tokens={fits}"),
            r"KV cache \(4 rows x 96 positions x 1 layers on cpu\): it takes .* GiB of the .* GiB")
    monkeypatch.setattr(base_checks, "memory_of", lambda device: 4 * weights - 1)  # 16 bytes each
    refused(lambda: base(), "cannot allocate the model .* its weights, gradients and AdamW state take")
