# Tests for rewards.py. Hermetic (no data, no torch).
# Run with: python -m pytest tests/test_rewards.py -q
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest

import rewards
from rewards import (
    LENGTH_TARGET,
    REWARD_FUNCS,
    compute_rewards,
    correctness_reward,
    extract_answer,
    format_reward,
    length_reward,
)

GOOD = "12+5=17\n17-3=14\n#### 14"


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD, 14),
        ("#### 1,234", 1234),
        ("#### 1,234,567", 1234567),
        ("#### -7", -7),
        ("#### +3", 3),
        ("####  42 ", 42),
        ("#### 14 apples", 14),
        ("#### 14.0", 14),
        ("#### -3.00", -3),
        ("#### 14.5", None),
        ("#### 0", 0),
        ("#### 1\n#### 2", 2),  # last marker wins
        ("#### 5 then #### 9", 9),
        ("12+5=17\n#### 3\nmore\n#### 17\n", 17),
        ("12+5=17\n17-3=14", None),  # no marker
        ("####", None),  # marker, no number
        ("#### apples", None),
        ("#### \n14", None),  # number on the next line is not the answer
        ("#### 7\n####", None),  # last marker has no number
        ("", None),
        ("garbage !@#$%^&*() \x00 \u00e9", None),
        ("#### " + "9" * 5000, None),  # over Python's int-parsing digit limit
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_returns_int_not_float():
    assert type(extract_answer("#### 14.0")) is int


def test_correctness_reward():
    assert correctness_reward(GOOD, 14) == 1.0
    assert correctness_reward(GOOD, 15) == 0.0
    assert correctness_reward("no answer", 0) == 0.0
    assert correctness_reward("#### -1,000", -1000) == 1.0


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD, 1.0),
        (GOOD + "  \n", 1.0),  # trailing whitespace allowed
        ("#### -7", 1.0),
        ("#### 14 apples", 0.0),  # trailing words
        ("#### 14.0", 0.0),
        ("#### 1,234", 0.0),
        ("####14", 0.0),
        ("x #### 14", 0.0),  # marker not at line start
        ("#### 14\nmore text", 0.0),  # not the final line
        ("#### 13\n#### 14", 0.0),  # two markers
        ("12+5=17", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert format_reward(text, 14) == expected


def test_format_reward_ignores_correctness():
    assert format_reward(GOOD, 999) == 1.0


def test_length_reward():
    T = LENGTH_TARGET
    assert T == 64
    assert length_reward("", 0) == 0.0
    assert length_reward("a" * T, 0) == 0.0
    assert length_reward("a" * (T + 1), 0) < 0.0
    assert length_reward("a" * (T + 3 * T // 2), 0) == pytest.approx(-0.5)  # halfway
    assert length_reward("a" * (4 * T), 0) == pytest.approx(-1.0)
    assert length_reward("a" * (100 * T), 0) == -1.0  # clamped


def test_reward_funcs_registry():
    assert REWARD_FUNCS == {
        "correctness": correctness_reward,
        "format": format_reward,
        "length": length_reward,
        "gsm8k": rewards.gsm8k_reward,
        "countdown": rewards.countdown_reward,
        "think_format": rewards.think_format_reward,
        "countdown_claim": rewards.countdown_claim_reward,
        "countdown_steps": rewards.countdown_steps_reward,
    }


def test_compute_rewards_weighted_totals():
    long_right = "1+1=2\n" * 40 + "#### 14"  # 247 chars: length = -(247-64)/192
    completions = [GOOD, "#### 15", "no marker", long_right]
    answers = [14, 14, 14, 14]
    totals, per_func, errors = compute_rewards(
        completions, answers, ["correctness", "format", "length"], [1.0, 0.5, 0.2]
    )
    assert per_func["correctness"] == [1.0, 0.0, 0.0, 1.0]
    assert per_func["format"] == [1.0, 1.0, 0.0, 1.0]
    length_pen = -(len(long_right) - 64) / 192
    assert per_func["length"] == pytest.approx([0.0, 0.0, 0.0, length_pen])
    assert totals == pytest.approx([1.5, 0.5, 0.0, 1.5 + 0.2 * length_pen])
    assert errors == {"correctness": 0, "format": 0, "length": 0}


def test_compute_rewards_subset_and_empty():
    totals, per_func, errors = compute_rewards([GOOD], [14], ["format"], [2.0])
    assert totals == [2.0]
    assert set(per_func) == {"format"} and errors == {"format": 0}
    assert compute_rewards([], [], ["correctness"], [1.0]) == ([], {"correctness": []}, {"correctness": 0})


def test_compute_rewards_raising_function(monkeypatch):
    def flaky(completion, answer):
        if "boom" in completion:
            raise RuntimeError("bad sample")
        return 0.25

    monkeypatch.setitem(rewards.REWARD_FUNCS, "flaky", flaky)
    completions = [GOOD, "boom #### 14", "boom"]
    totals, per_func, errors = compute_rewards(
        completions, [14, 14, 14], ["flaky", "correctness"], [4.0, 1.0]
    )
    assert per_func["flaky"] == [0.25, 0.0, 0.0]
    assert errors == {"flaky": 2, "correctness": 0}
    assert per_func["correctness"] == [1.0, 1.0, 0.0]  # others still score
    assert totals == pytest.approx([2.0, 1.0, 0.0])


# reward_funcs (known, distinct) are checked at config time, checks/grpo_knobs.py:
# tests/test_run_safety.py's bad-option cases. The counts are checked here too: zip would drop.
def test_unknown_name_raises_at_lookup():
    with pytest.raises(KeyError, match="nope"):
        compute_rewards([GOOD], [14], ["correctness", "nope"], [1.0, 1.0])


@pytest.mark.parametrize("completions, answers, funcs, weights", [
    ([GOOD], [14], ["correctness", "format"], [1.0]),          # a function without a weight
    ([GOOD], [14], ["correctness"], [1.0, 0.5]),               # a weight without a function
    ([GOOD, GOOD], [14], ["correctness"], [1.0]),              # a completion without an answer
])
def test_mismatched_counts_raise_instead_of_dropping(completions, answers, funcs, weights):
    with pytest.raises(AssertionError, match="one weight per reward function|one answer per completion"):
        compute_rewards(completions, answers, funcs, weights)
