# rewards.countdown_reward given an answer that is not [list of ints, int]: a string anywhere in
# it (a dataset read as text, a JSON string for a number), bytes, floats, booleans. Its contract: a
# malformed answer is a dataset bug and raises one ValueError line naming the answer, with no
# chained traceback; inside compute_rewards that sample scores 0.0 and is counted as an error.
# Reference: the contract as the docstring states it, and the same completion scored 1.0 with the
# well-formed answer.
# Run: python -m pytest -q tests/test_countdown_answer.py
import pytest

from rewards import compute_rewards, countdown_reward

RIGHT = "<think>2+1=3</think><answer>1+2</answer>"
MALFORMED = [([1, 2], "3"), (["1", "2"], 3), ([1, "2"], 3), ("12", 3), ("1 2", "3"), "[[1, 2], 3]",
             "abc", ("1", "2"), (b"\x01\x02", 3), (bytearray(b"\x01\x02"), 3), ([1, 2], 3.0),
             ([1.0, 2], 3), ([True, 2], 3), ([1, 2], True), ({"numbers": [1, 2]}, 3), ([1, 2],),
             None, 3]


def test_the_well_formed_answer_scores():
    assert countdown_reward(RIGHT, ([1, 2], 3)) == 1.0
    assert countdown_reward(RIGHT, ((1, 2), 3)) == 1.0
    assert countdown_reward(RIGHT, ([1, 2], 4)) == 0.0


@pytest.mark.parametrize("answer", MALFORMED, ids=repr)
def test_a_malformed_answer_is_one_line_or_zero(answer):
    try:
        value = countdown_reward(RIGHT, answer)
    except ValueError as e:
        msg = str(e)
        assert "\n" not in msg and "countdown answer" in msg and repr(answer)[:20] in msg
        assert e.__cause__ is None and e.__suppress_context__  # no "during handling" traceback
    else:
        assert value == 0.0


@pytest.mark.parametrize("answer", MALFORMED, ids=repr)
def test_a_malformed_answer_never_scores_a_right_completion(answer):
    with pytest.raises(ValueError, match="countdown answer must be"):
        countdown_reward(RIGHT, answer)


def test_compute_rewards_scores_a_malformed_answer_zero_and_counts_it():
    answers = [([1, 2], 3), ([1, 2], "3"), (["1", "2"], 3)]
    totals, per_fn, errors = compute_rewards([RIGHT] * 3, answers, ["countdown"], [1.0])
    assert totals == [1.0, 0.0, 0.0] and per_fn["countdown"] == [1.0, 0.0, 0.0]
    assert errors == {"countdown": 2}
