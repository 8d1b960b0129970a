# Tests for train_base.py. Run: python -m pytest tests/test_train_base.py -q
# References: the schedule's formula at its end points, token lists shifted by hand for
# get_batch, and two runs of main() (30 + resume 10 iterations vs 40 in one go).
import random
import re

import pytest
import torch

import runs.evaluate
import train_base as tb
from data.datadir import load_tokenizer
from data.gsm_synth.prepare import prepare
from runs.checkpoint import load_checkpoint, model_from_checkpoint


def test_get_lr_schedule():
    lrs = [tb.get_lr(i, 100, 1e-2, 1e-3, 10) for i in range(101)]
    assert lrs[0] < lrs[5] < lrs[9] <= 1e-2                       # linear warmup
    assert lrs[10] == pytest.approx(1e-2)                          # peak after warmup
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))        # cosine: monotone down
    assert lrs[100] == pytest.approx(1e-3)                         # min_lr at max_iters
    assert tb.get_lr(500, 100, 1e-2, 1e-3, 10) == pytest.approx(1e-3)


def test_get_batch_targets_only_solutions():
    pairs = [([5, 6, 7], [8, 9, 0]), ([1], [2, 0])]
    x, y = tb.get_batch(pairs, 8, random.Random(0), "cpu")
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        p, c = pairs[0] if row_x[0] == 5 else pairs[1]
        seq = p + c
        assert row_x[:len(seq) - 1] == seq[:-1]
        assert row_y[:len(p) - 1] == [-1] * (len(p) - 1)           # no loss on the prompt
        assert row_y[len(p) - 1:len(seq) - 1] == c                 # next token = solution
        assert all(t == -1 for t in row_y[len(seq) - 1:])         # nor on padding


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
    d = prepare(steps=1, max_operand=5, ops="+", n_train=300, n_val=20, n_test=20, num_merges=20,
                verbose=False, root=str(tmp_path_factory.mktemp("d")))
    return d, load_tokenizer(d)


ARGS = ["--lr_decay_iters=40", "--n_layer=1", "--n_embd=32", "--n_head=2", "--block_size=96", "--batch_size=8", "--eval_n=4",
        "--eval_interval=10", "--log_interval=10", "--max_new_tokens=8", "--warmup_iters=2"]


def test_train_resume_is_exact(tiny_task, tmp_path, monkeypatch):
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: tiny_task)
    tb.main([f"--out_dir={tmp_path / 'a'}", "--max_iters=40", *ARGS])
    tb.main([f"--out_dir={tmp_path / 'b'}", "--max_iters=30", *ARGS])
    tb.main([f"--out_dir={tmp_path / 'b'}", "--max_iters=40", "--init_from=resume", *ARGS])
    a, b = load_checkpoint(str(tmp_path / "a" / "ckpt.pt")), load_checkpoint(str(tmp_path / "b" / "ckpt.pt"))
    assert a["iter_num"] == b["iter_num"] == 40
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert 0.0 <= a["metrics"]["accuracy"] <= 1.0
    model_from_checkpoint(a)  # loads back into a GPT


def test_training_lowers_loss(tiny_task, tmp_path, monkeypatch):
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: tiny_task)
    data_dir, enc = tiny_task
    from data.datadir import load_split
    pairs = tb.tokenize_examples(enc, load_split(data_dir, "val"))
    x, y = tb.get_batch(pairs, 16, random.Random(1), "cpu")
    tb.main([f"--out_dir={tmp_path / 'c'}", "--max_iters=1", "--learning_rate=1e-12", "--min_lr=0", *ARGS])
    before = model_from_checkpoint(load_checkpoint(str(tmp_path / "c" / "ckpt.pt")))(x, targets=y)[1].item()
    tb.main([f"--out_dir={tmp_path / 'd'}", "--max_iters=60", *ARGS])
    after = model_from_checkpoint(load_checkpoint(str(tmp_path / "d" / "ckpt.pt")))(x, targets=y)[1].item()
    assert after < 0.7 * before


def test_evaluate_scores_answers(tiny_task):
    data_dir, enc = tiny_task
    from data.datadir import load_split
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=96, vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=32))
    ex = load_split(data_dir, "test")[:6]
    r = tb.evaluate(m, enc, ex, 8, k=2)
    assert set(r) == {"accuracy", "pass@2"}
    assert 0 <= r["accuracy"] <= 1 and 0 <= r["pass@2"] <= 1
    # a "model" whose greedy output is the right solution: monkeypatch generate through decode
    texts = [e["solution"] for e in ex]
    orig = runs.evaluate.decode_completions
    try:
        runs.evaluate.decode_completions = lambda enc_, idx, mask: texts[:idx.size(0)]
        assert tb.evaluate(m, enc, ex, 8)["accuracy"] == 1.0
        bad = [{**e, "answer": e["answer"] + 1} for e in ex]
        assert tb.evaluate(m, enc, bad, 8)["accuracy"] == 0.0
    finally:
        runs.evaluate.decode_completions = orig


def test_bad_init_from(tiny_task, tmp_path, monkeypatch):
    from configurator import UserError
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: tiny_task)
    with pytest.raises(UserError, match="init_from"):
        tb.main([f"--out_dir={tmp_path}", "--init_from=nope", *ARGS])
    with pytest.raises(UserError, match="block_size"):
        tb.main([f"--out_dir={tmp_path}", *ARGS, "--block_size=16"])


def test_zero_iterations_refused_before_any_work(tmp_path, monkeypatch):
    """max_iters=0 would exit 0 with a random-weights base that train_grpo.py then fine-tunes."""
    from configurator import UserError
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: pytest.fail("work started"))
    for arg, key in (("--max_iters=0", "max_iters"), ("--eval_n=0", "eval_n")):
        with pytest.raises(UserError, match=f"'{key}' = 0 is not allowed: must be"):
            tb.main([f"--out_dir={tmp_path / 'b'}", *ARGS, arg])
    assert not (tmp_path / "b").exists()


def test_no_accuracy_is_nan(tiny_task, tmp_path, monkeypatch, capsys):
    """Evaluating no problem is an error, not an accuracy of NaN; a resumed run with nothing left to do
    reports its checkpoint's accuracy."""
    from configurator import UserError
    from model import GPT, GPTConfig
    data_dir, enc = tiny_task
    m = GPT(GPTConfig(block_size=96, vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=32))
    with pytest.raises(UserError, match="no test problems"):
        tb.evaluate(m, enc, [], 8)
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: tiny_task)
    tb.main([f"--out_dir={tmp_path / 'a'}", "--max_iters=10", *ARGS])
    tb.main([f"--out_dir={tmp_path / 'a'}", "--init_from=resume"])  # already at max_iters: nothing to do
    out = capsys.readouterr().out
    assert not re.search(r"\bnan\b", out, re.I) and out.count("test accuracy") == 3  # eval at 10, done, done again
