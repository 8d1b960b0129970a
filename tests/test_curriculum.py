# Tests for data/curriculum.py and its use in train_grpo.py (curriculum by difficulty).
# References: the level rule written out here (mean of the last `window` accuracies at a level
# >= threshold moves up one level), each problem's arithmetic re-checked and its operations counted
# from the question text, and an uninterrupted run for resume.
import json
import random
import re

import pytest
import torch

import rewards
from configurator import UserError
from data.curriculum import Curriculum, parse_levels
from runs.checkpoint import load_checkpoint
from test_prepare import check_arithmetic, operations
from test_train_grpo import run


def test_parse_levels():
    assert parse_levels("1:20, 2:20,3:30") == [(1, 20), (2, 20), (3, 30)]
    assert parse_levels("") == []
    for bad in ("3", "1:20,x:3", "0:5", "2:0", "1:2:3", "1.5:3"):
        with pytest.raises(UserError, match="levels are steps:max_operand"):
            parse_levels(bad)


def test_draw_gives_problems_of_the_current_level():
    c = Curriculum([(1, 5), (3, 50)], "+-", threshold=0.5, window=2)
    rng = random.Random(0)
    for level, (steps, max_operand) in enumerate(c.levels):
        c.level = level
        for _ in range(50):
            e = c.draw(rng)
            assert operations(e["question"]) == steps
            check_arithmetic(e, steps)
            assert max(int(x) for x in re.findall(r"[-+](\d+)=", e["solution"])) <= max_operand


def reference_levels(accuracies, n_levels, threshold, window):
    """The rule as the docstring states it, step by step: the level each step trained at."""
    level, recent, out = 0, [], []
    for a in accuracies:
        out.append(level)
        if a == a and level < n_levels - 1:
            recent.append(a)
            if len(recent) >= window and sum(recent[-window:]) / window >= threshold:
                level, recent = level + 1, []
    return out


@pytest.mark.parametrize("seed", range(5))
def test_observe_follows_the_moving_mean_rule(seed):
    g = random.Random(seed)
    accs = [g.choice([g.random(), 0.9, float("nan")]) for _ in range(200)]
    c = Curriculum([(1, 5), (2, 5), (3, 5), (3, 9)], "+", threshold=0.6, window=4)
    got = []
    for a in accs:
        got.append(c.level)
        c.observe(a)
    assert got == reference_levels(accs, 4, 0.6, 4)
    assert got[-1] > 0  # the sequence does move up


def test_test_set_is_fixed_target_level_and_excludes():
    c = Curriculum([(1, 20), (3, 20)], "+-", 0.5, 10)
    a = c.test_set(40)
    assert a == Curriculum([(2, 9), (3, 20)], "+-", 0.9, 3).test_set(40)  # only the last level matters
    assert len({e["question"] for e in a}) == 40 and all(operations(e["question"]) == 3 for e in a)
    b = c.test_set(40, exclude={a[0]["question"], a[5]["question"]})
    assert a[0] not in b and a[5] not in b and a[1] in b
    with pytest.raises(UserError, match="distinct test problems"):
        Curriculum([(1, 1)], "+", 0.5, 1).test_set(2500)  # 12 names x 12 items x 13 sentences: 1872


@pytest.fixture
def always_correct(monkeypatch):
    """correctness = 1 for every completion: the training accuracy is 1, so every window passes."""
    monkeypatch.setitem(rewards.REWARD_FUNCS, "correctness", lambda completion, answer: 1.0)


CUR = ("--curriculum=1:5,2:5,3:5", "--curriculum_window=2", "--curriculum_threshold=0.9")


def test_run_moves_up_and_prompts_follow_the_level(tiny_setup, tmp_path, always_correct, chars_reward):
    out = tmp_path / "run"
    run(tiny_setup, out, "--max_iters=6", *CUR)
    logs = [json.loads(l) for l in open(out / "log.jsonl")][1:]
    assert [l["curriculum/level"] for l in logs] == [1, 1, 2, 2, 3, 3]
    for l, r in zip(logs, (json.loads(l) for l in open(out / "rollouts.jsonl"))):
        assert [operations(q) for q in r["prompts"]] == [l["curriculum/level"]] * len(r["prompts"])


def test_curriculum_resume_is_exact(tiny_setup, tmp_path, always_correct, chars_reward):
    a, b = tmp_path / "a", tmp_path / "b"
    run(tiny_setup, a, "--max_iters=5", *CUR)
    run(tiny_setup, b, "--max_iters=3", *CUR)  # stops at level 2, one step into its window
    assert load_checkpoint(str(b / "ckpt.pt"))["curriculum"] == {"level": 1, "recent": [1.0]}
    run(tiny_setup, b, "--max_iters=5", "--init_from=resume")
    la, lb = load_checkpoint(str(a / "ckpt.pt"))["lora"], load_checkpoint(str(b / "ckpt.pt"))["lora"]
    assert all(torch.equal(la[k], lb[k]) for k in la)
    prompts = lambda d: [json.loads(l)["prompts"] for l in open(d / "rollouts.jsonl")]
    assert prompts(a) == prompts(b)


@pytest.mark.parametrize("extra, message", [
    (["--curriculum=1-5"], "levels are steps:max_operand"),
    (["--curriculum=1:5", "--defect_frac=0.2"], "must be 0 with a curriculum"),
    (["--curriculum=1:5", "--curriculum_threshold=0"], r"must be in \(0, 1\]"),
    (["--curriculum=1:5", "--curriculum_window=0"], "curriculum_window"),
    (["--curriculum=1:5,12:5,2:5"], r"curriculum level 12:5 does not fit the base's context: its prompts reach \d+"),
])
def test_bad_curriculum_knobs(tiny_setup, tmp_path, chars_reward, extra, message):
    with pytest.raises(UserError, match=message):
        run(tiny_setup, tmp_path / "run", "--max_iters=1", *extra)
    assert not (tmp_path / "run").exists()


def test_one_level_is_training_on_generated_problems(tiny_setup, tmp_path, chars_reward):
    """curriculum='2:5' (the baseline's form): every prompt is a 2-step problem, nothing moves and no
    level is logged (analysis/plot.py draws it as a standard run); the test set is 2-step problems too."""
    out = tmp_path / "run"
    run(tiny_setup, out, "--max_iters=2", "--curriculum=2:5", "--eval_interval=1")
    logs = [json.loads(l) for l in open(out / "log.jsonl")]
    assert not any("curriculum/level" in l for l in logs) and "test/accuracy" in logs[-1]
    for r in (json.loads(l) for l in open(out / "rollouts.jsonl")):
        assert [operations(q) for q in r["prompts"]] == [2, 2]


def test_resume_with_a_curriculum_the_run_did_not_have(tiny_setup, tmp_path, chars_reward, capsys):
    """A curriculum given only on resume starts at its first level (one line says so), not a KeyError;
    so does one with fewer levels than the saved level."""
    out = tmp_path / "run"
    run(tiny_setup, out, "--max_iters=1")
    run(tiny_setup, out, "--max_iters=2", "--init_from=resume", "--curriculum=2:5,3:5")
    assert "curriculum: the checkpoint's level does not exist in this curriculum; level 1/2" in capsys.readouterr().out
    last = [json.loads(l) for l in open(out / "log.jsonl")][-1]
    assert last["iter"] == 2 and last["curriculum/level"] == 1
