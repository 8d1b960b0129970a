# Knobs that used to end in a traceback, or were found only after the whole base had trained, are
# one-line errors before any work: max_new_tokens beyond the context, a seed beyond torch's 64 bits,
# a learning rate whose AdamW step overflows float32 (train_base.py and train_grpo.py:
# configurator.check_finite / check_adam_lr).
# Run: python -m pytest -q tests/test_base_limits.py
import pytest

import train_base as tb
import train_grpo as tg
from configurator import UserError, check_finite
from data.gsm_synth.prepare import load_tokenizer, prepare

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
