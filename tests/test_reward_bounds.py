# The rewards' limits at their exact values, and compute_rewards' rule for a function that cannot score a
# completion (None): left out of the total, NaN when no function scored it. References written out here.
# Run: python -m pytest -q tests/test_reward_bounds.py
import math

import pytest

import rewards
from rewards import COUNTDOWN_MAX_CHARS, COUNTDOWN_MAX_DEPTH, compute_rewards, countdown_reward


def answer(expr):
    return f"<think>x</think><answer>{expr}</answer>"


@pytest.mark.parametrize("inner", ["3+4", "(3)+4", "3+(4)"])
def test_countdown_nesting_up_to_the_limit_and_not_one_more(inner):
    def nested(depth):  # `depth` pairs of parentheses around the whole expression, plus those inside it
        return "(" * depth + inner + ")" * depth
    own = inner.count("(")
    assert countdown_reward(answer(nested(COUNTDOWN_MAX_DEPTH - own)), [[3, 4], 7]) == 1.0
    assert countdown_reward(answer(nested(COUNTDOWN_MAX_DEPTH - own + 1)), [[3, 4], 7]) == 0.0


def test_countdown_length_up_to_the_limit_and_not_one_more():
    """Spaces inside the expression count (the text between the tags, stripped at both ends)."""
    for expr in ("3+4", "(3*4)-5", "4+3"):
        nums = [int(c) for c in expr if c.isdigit()]
        target = eval(expr)  # noqa: S307 (test-only, literal expressions written above)
        pad = COUNTDOWN_MAX_CHARS - len(expr)
        at_limit = expr[0] + " " * pad + expr[1:]
        assert len(at_limit) == COUNTDOWN_MAX_CHARS
        assert countdown_reward(answer(f"  {at_limit}\n"), [nums, target]) == 1.0
        assert countdown_reward(answer(expr[0] + " " + at_limit[1:]), [nums, target]) == 0.0


@pytest.fixture
def sometimes(monkeypatch):
    """'maybe' scores 1.0 for completions holding 'y', cannot score (None) the rest; 'always' scores 0.25."""
    monkeypatch.setitem(rewards.REWARD_FUNCS, "maybe", lambda c, a: 1.0 if "y" in c else None)
    monkeypatch.setitem(rewards.REWARD_FUNCS, "always", lambda c, a: 0.25)


@pytest.mark.parametrize("funcs,weights", [(["maybe"], [2.0]), (["maybe", "always"], [2.0, 4.0]),
                                           (["always", "maybe"], [0.5, 3.0])])
def test_a_completion_no_function_scores_has_a_nan_total(sometimes, funcs, weights):
    completions = ["y", "n", "yy", "", "ny"]
    totals, per, errors = compute_rewards(completions, [0] * 5, funcs, weights)
    for i, c in enumerate(completions):
        scored = {"maybe": 1.0 if "y" in c else None, "always": 0.25}
        parts = [w * scored[f] for f, w in zip(funcs, weights) if scored[f] is not None]
        if parts:
            assert totals[i] == pytest.approx(sum(parts)), c
        else:
            assert math.isnan(totals[i]), c
        assert (per["maybe"][i] == 1.0) if "y" in c else math.isnan(per["maybe"][i])
    assert errors == {f: 0 for f in funcs}
