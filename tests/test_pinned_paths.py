# Behaviours pinned through the paths a user takes: train_grpo.py's command line (main(argv), or the
# script itself in a subprocess) and analysis.attribute.find_critical_samples.
#   1. the clip's upper bound is 1 + epsilon_high (DAPO's clip-higher), its lower 1 - epsilon_low;
#   2. loss_type='dr_grpo' divides by rows x max_new_tokens, whatever the step's longest completion;
#   3. a resumed TracIn run draws the validation prompts ('nll', 'pg') and completions ('pg') that an
#      uninterrupted run draws;
#   4. a copy of the project resumes its run from another working directory, its data_dir recorded
#      relative to the project;
#   5. a Countdown run's test accuracy and pass@k are Countdown's correctness, not arith's;
#   6. find_critical_samples refuses in one line a token id equal to the vocabulary size, in a rollout's
#      completion or among the ids its prompt encodes to.
# Run: python -m pytest -q tests/test_pinned_paths.py
#
# Independent references: runs that differ in one knob only (their first step samples the same
# completions, so their logs differ only where the knob acts); the dr_grpo loss written out from the
# logged advantages and completion masks; an uninterrupted run for the resumed one; a base whose
# weights are set by hand (it ends its completions early, or writes one known Countdown answer), scored
# by rewards.countdown_reward.
import json
import os
import re
import shutil

import pytest
import torch

import rewards
from analysis import attribute
from configurator import UserError
from data.countdown import searched
from data.datadir import load_split, load_tokenizer
from data.gsm_synth.prepare import prepare
from data.prompts import encode_prompt, encode_text
from model import GPT, GPTConfig
from runs.checkpoint import load_checkpoint, save_checkpoint
from test_portable import copy_project, python
from test_tracin import ByteEnc, make_model, posthoc_setup
from test_train_grpo import run

pytestmark = pytest.mark.usefixtures("chars_reward")  # a reward that varies: groups have a signal


def logs(out):
    return [json.loads(line) for line in open(out / "log.jsonl")]


def records(out):
    return [json.loads(line) for line in open(out / "rollouts.jsonl")]


# ---------------------------------------------------------------------------- 1. clip-higher
def test_the_upper_clip_bound_is_one_plus_epsilon_high(tiny_setup, tmp_path):
    """Two updates per generation (num_iterations=2): the second update's ratios move away from 1, so the
    clip acts. Runs A (epsilon_high 0.2) and B (epsilon_high 100: never reached) share epsilon_low and their
    first step's samples and first update, hence its second update's ratios: the upper bound is the only
    difference between their first steps."""
    knobs = ("--max_iters=2", "--num_iterations=2", "--beta=0.0", "--learning_rate=0.2", "--epsilon_low=0.2")
    run(tiny_setup, tmp_path / "a", *knobs, "--epsilon_high=0.2")
    run(tiny_setup, tmp_path / "b", *knobs, "--epsilon_high=100.0")
    a, b = logs(tmp_path / "a")[1:], logs(tmp_path / "b")[1:]
    assert records(tmp_path / "a")[0] == records(tmp_path / "b")[0]  # the same first step's rollouts
    assert a[0]["clip_ratio/high"] > 0  # ratios above 1.2 with A > 0: clipped at 1 + epsilon_high
    assert all(line["clip_ratio/high"] == 0 for line in b)  # 1 + 100 is never reached
    assert a[0]["clip_ratio/low"] == b[0]["clip_ratio/low"] > 0  # the lower bound is epsilon_low's alone
    # the clipped term -(1 + epsilon_high) A replaces -rho A only in A's loss
    assert abs(a[0]["loss"] - b[0]["loss"]) > 1e-4, (a[0]["loss"], b[0]["loss"])


# ---------------------------------------------------------------------------- 2. dr_grpo's divisor
@pytest.fixture(scope="module")
def early_end_base(tiny_setup, tmp_path_factory):
    """tiny_setup's base made to end its completions early: every position carries a constant first
    coordinate (wpe), which only end-of-text's embedding reads (wte), so end-of-text is likely at every
    token and completions stop after a few tokens, at varied lengths."""
    ckpt = load_checkpoint(tiny_setup)
    eot = load_tokenizer(ckpt["data_dir"]).eot_token
    sd = {k: v.clone() for k, v in ckpt["model"].items()}
    wte = sd["transformer.wte.weight"]  # tied: lm_head.weight is the same tensor
    sd["transformer.wpe.weight"][:, 0] = 10.0
    wte[:, 0] = 0.0
    wte[eot, 0] = 1.0
    if "lm_head.weight" in sd:
        sd["lm_head.weight"] = wte
    path = str(tmp_path_factory.mktemp("early_end") / "ckpt.pt")
    save_checkpoint({**ckpt, "model": sd}, path)
    return path


@pytest.mark.parametrize("max_new_tokens", [16, 32])
def test_dr_grpo_divides_by_rows_times_max_new_tokens(early_end_base, tmp_path, max_new_tokens):
    """One update per generation: the ratio is exactly 1, each token's term is -A_i, and dr_grpo's loss is
    -sum_i A_i |o_i| / (rows x max_new_tokens) over the whole batch (two micro-batches of 4 here), also when
    every completion of the step ends before max_new_tokens (the divisor is never the longest one)."""
    out = tmp_path / "r"
    run(early_end_base, out, "--max_iters=2", "--beta=0.0", "--loss_type=dr_grpo",
        f"--max_new_tokens={max_new_tokens}")
    for rec, line in zip(records(out), logs(out)[1:]):
        lengths = [sum(m) for m in rec["completion_mask"]]
        rows = len(lengths)
        assert rows == 8 and max(lengths) < 16 and len(set(lengths)) > 1  # all end early, unequal lengths
        want = -sum(a * n for a, n in zip(rec["advantages"], lengths)) / (rows * max_new_tokens)
        assert abs(want) > 1e-3
        assert line["loss"] == pytest.approx(want, rel=1e-5), (line["loss"], want, max(lengths))


# ---------------------------------------------------------------------------- 3. TracIn resume
STEPS = 4
COMPARED = ("reward", "loss", "n_selected", "selection_rate", "influence/mean", "influence/min", "influence/max",
            "val/reward")


@pytest.mark.parametrize("val_loss", ["nll", "pg"])
def test_a_resumed_tracin_run_draws_the_validation_batches_of_an_uninterrupted_run(tiny_setup, tmp_path,
                                                                                  monkeypatch, val_loss):
    """STEPS steps in one go, and STEPS / 2 then --init_from=resume: the same rollouts, influences and
    selections at every step. 'nll' scores the validation rows' reference solutions (which rows: the
    validation prompt stream); 'pg' samples them (the validation completion stream too), scored by the
    task's own rewards, whose format reward here pays the completion's length so that validation groups
    have a signal."""
    if val_loss == "pg":
        monkeypatch.setitem(rewards.REWARD_FUNCS, "format", lambda completion, answer: len(completion) / 10)
    knobs = ("--beta=0.0", "--seed=5", "--tracin=True", f"--tracin_val_loss={val_loss}",
             "--tracin_val_batch_size=3")
    run(tiny_setup, tmp_path / "whole", f"--max_iters={STEPS}", *knobs)
    run(tiny_setup, tmp_path / "cut", f"--max_iters={STEPS // 2}", *knobs)
    run(tiny_setup, tmp_path / "cut", f"--max_iters={STEPS}", "--init_from=resume")
    whole, cut = logs(tmp_path / "whole")[1:], logs(tmp_path / "cut")[1:]
    # not vacuous: after the resume the validation batch moves the influences, and 'pg' rewards vary
    resumed = records(tmp_path / "whole")[STEPS // 2:]
    assert all(any(abs(x) > 1e-6 for x in r["influence"]) for r in resumed)
    if val_loss == "pg":
        assert len({line["val/reward"] for line in whole}) > 1
    assert [line["iter"] for line in cut] == list(range(1, STEPS + 1))
    for key in COMPARED:
        assert [line.get(key) for line in cut] == [line.get(key) for line in whole], key
    assert records(tmp_path / "cut") == records(tmp_path / "whole")


# ---------------------------------------------------------------------------- 4. a moved project
def test_a_copied_project_resumes_its_run_from_another_directory(tmp_path):
    """Copy A runs one GRPO step with --data_dir given relative to its root (the config and the checkpoint
    record it so); A is then copied to B and removed, and B's run is resumed with B's script from a third
    directory: it reads B's data (A's is gone; the working directory's own data/ of that name, marked, is
    another checkout's) and finishes."""
    a = copy_project(str(tmp_path / "a"))
    data_dir = prepare(steps=1, max_operand=5, ops="+", n_train=300, n_val=20, n_test=20, num_merges=20,
                       verbose=False, root=os.path.join(a, "data", "gsm_synth"))
    rel = os.path.relpath(data_dir, a)
    torch.manual_seed(0)
    args = dict(block_size=128, vocab_size=load_tokenizer(data_dir).n_vocab, n_layer=1, n_head=2, n_embd=16,
                dropout=0.0, bias=False)
    os.makedirs(os.path.join(a, "out", "base"))
    save_checkpoint({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args, "data_dir": rel,
                     "iter_num": 0, "config": {}, "train_seconds": 0.0, "metrics": {}},
                    os.path.join(a, "out", "base", "ckpt.pt"))  # as train_base.py records its data
    grpo = ["--base_ckpt=out/base/ckpt.pt", "--out_dir=out/grpo", f"--data_dir={rel}", "--batch_size=2",
            "--group_size=2", "--micro_batch_size=4", "--max_new_tokens=4", "--eval_n=2", "--eval_k=1",
            "--dtype=float32", "--max_iters=1"]
    r = python(a, "train_grpo.py", *grpo)
    assert r.returncode == 0, r.stderr
    saved = load_checkpoint(os.path.join(a, "out", "grpo", "ckpt.pt"))
    assert saved["config"]["data_dir"] == saved["data_dir"] == rel  # project-relative
    b = str(tmp_path / "b")
    shutil.copytree(a, b)
    shutil.rmtree(a)
    # the working directory holds a directory of that name too (another checkout's), its rows marked
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(os.path.join(b, rel), elsewhere / rel)
    with open(elsewhere / rel / "train.jsonl", "w") as f:
        for row in load_split(os.path.join(b, rel), "train"):
            f.write(json.dumps({**row, "question": "Marked. " + row["question"]}) + "\n")
    before = sorted(str(p) for p in elsewhere.rglob("*"))
    r = python(b, f"{b}/train_grpo.py", f"--out_dir={b}/out/grpo", "--init_from=resume", "--max_iters=2",
               cwd=str(elsewhere))
    assert r.returncode == 0, r.stderr
    assert f"resuming {b}/out/grpo at iter 1" in r.stdout
    train = {row["question"] for row in load_split(os.path.join(b, rel), "train")}
    last = [json.loads(line) for line in open(os.path.join(b, "out", "grpo", "rollouts.jsonl"))][-1]
    assert last["iter"] == 2 and set(last["prompts"]) <= train  # B's rows, not the marked ones
    assert load_checkpoint(os.path.join(b, "out", "grpo", "ckpt.pt"))["config"]["data_dir"] == rel
    assert sorted(str(p) for p in elsewhere.rglob("*")) == before  # nothing written where the command ran


# ---------------------------------------------------------------------------- 5. Countdown's evaluation
@pytest.fixture
def countdown_answering_base(tmp_path, monkeypatch):
    """A Countdown data directory and a base that answers its first test problem right: its blocks add
    nothing (all zero), so each position's logits are its own embedding plus its position's; the positions
    after that problem's prompt spell out '<answer>EXPR</answer>' and end-of-text, EXPR its solution's."""
    monkeypatch.setattr(searched, "ROOT", str(tmp_path / "cd"))
    data_dir = searched.prepare(3, 9, 60, 2, n_train=30, n_val=5, n_test=5, num_merges=10, verbose=False)
    enc, row = load_tokenizer(data_dir), load_split(data_dir, "test")[0]
    answer = re.search(r"<answer>.*?</answer>", row["solution"]).group(0)
    assert rewards.countdown_reward(answer, row["answer"]) == 1.0
    assert rewards.correctness_reward(answer, row["answer"]) == 0.0  # arith's reads no Countdown answer
    P, ids = len(encode_prompt(enc, row["question"])), encode_text(enc, answer) + [enc.eot_token]
    torch.manual_seed(0)
    args = dict(block_size=128, vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=64, dropout=0.0, bias=False)
    model = GPT(GPTConfig(**args))
    with torch.no_grad():
        for p in model.transformer.h.parameters():
            p.zero_()
        wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight  # wte: tied to lm_head
        wpe.zero_()
        dims = {t: j for j, t in enumerate(dict.fromkeys(ids))}  # one coordinate per token of the answer
        for t, j in dims.items():
            wte[t] = 0.0
            wte[t, j] = 1.0
        for k, t in enumerate(ids):  # the position before token k of the answer predicts it
            wpe[P - 1 + k, dims[t]] = 50.0
        model.transformer.ln_f.weight.fill_(10.0)
    path = str(tmp_path / "base" / "ckpt.pt")
    os.makedirs(os.path.dirname(path))
    save_checkpoint({"model": model.state_dict(), "model_args": args, "data_dir": data_dir, "iter_num": 0,
                     "config": {"task": "countdown"}, "train_seconds": 0.0, "metrics": {}}, path)
    return path


def test_a_countdown_runs_test_accuracy_and_pass_at_k_are_countdowns(countdown_answering_base, tmp_path):
    """eval_n=1: the problem the base answers right, greedily and in each of eval_k samples. Countdown's
    correctness scores it 1 (arith's would score 0), at iteration 0 and at the end (the zero blocks give
    the adapter no gradient, so the policy stays the base)."""
    out = tmp_path / "r"
    run(countdown_answering_base, out, "--task=countdown", "--reward_funcs=('countdown','think_format')",
        "--reward_weights=(1.0,0.1)", "--max_new_tokens=24", "--eval_n=1", "--eval_k=2", "--max_iters=1")
    lines = logs(out)
    assert [line["iter"] for line in lines] == [0, 1]
    for line in lines:
        assert (line["test/accuracy"], line["test/pass@2"]) == (1.0, 1.0), line


# ---------------------------------------------------------------------------- 6. attribution's token ids
class MarkEnc(ByteEnc):
    """ByteEnc, except that '!' encodes to the id `mark`."""
    def __init__(self, mark):
        self.mark = mark

    def encode(self, s, disallowed_special=None):
        return [self.mark if c == "!" else t for c, t in zip(s, super().encode(s))]


@pytest.mark.parametrize("where", ["completion", "prompt"])
@pytest.mark.parametrize("which", ["train", "test"])
def test_a_token_id_equal_to_the_vocabulary_size_is_refused_in_one_line(tmp_path, which, where):
    """Ids run 0 .. vocab_size - 1: the last one is scored, vocab_size itself is refused by name, in a
    rollout's completion tokens or in the ids its prompt encodes to."""
    m = make_model().eval()
    paths, _, train, test = posthoc_setup(tmp_path, m)
    V = m.config.vocab_size

    def call(tok):
        one = {"train": train, "test": test}[which]
        changed = {**one[0], "completion_tokens": [3, tok, 0]} if where == "completion" else \
            {**one[0], "prompt": one[0]["prompt"] + "!"}
        rows = (([changed, *one[1:]], test) if which == "train" else (train, [changed, *one[1:]]))
        return attribute.find_critical_samples(m, paths, *rows, MarkEnc(tok))
    assert call(V - 1)["num_train_samples"] == len(train)
    with pytest.raises(UserError) as e:
        call(V)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{which}_samples[0]") and str(V) in msg, msg


@pytest.mark.parametrize("which", ["train", "test"])
def test_a_row_longer_than_the_context_is_refused_in_one_line(tmp_path, which):
    """find_critical_samples called directly with a rollout the model cannot read whole: its one line
    (before: model.forward's assertion); one token shorter is scored, in a micro-batch split where the
    padding beside a longer prompt would make it wider than the context."""
    m = make_model().eval()
    paths, _, train, test = posthoc_setup(tmp_path, m)
    block, enc = m.config.block_size, ByteEnc()
    one = {"train": train, "test": test}[which]
    room = block + 1 - len(encode_prompt(enc, one[0]["prompt"]))  # the model reads all ids but the last

    def call(n):
        changed = {**one[0], "completion_tokens": [3] * n, "completion_mask": [1] * n}
        rows = ([changed, *train[1:]], test) if which == "train" else (train, [changed, *test[1:]])
        return attribute.find_critical_samples(m, paths, *rows, enc)
    assert call(room)["num_train_samples"] == len(train)
    with pytest.raises(UserError) as e:
        call(room + 1)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{which}_samples[0]: its prompt and completion are")
    assert f"more than its context of {block}: shorten it" in msg
