# What analysis.hack counts, and the Countdown search and verifier it counts against, pinned against
# references written out here: each rollout scored against its own problem's answer; the first and
# last EDGE steps averaged (not every step after the first EDGE); the mean influence of hacks / right
# / others over all their rollouts, kept or not; the claim read from the <think> the first </think>
# closes; a closest search keeping, per way of taking all steps but the last, the first of the
# equally close tries.
# Run: python -m pytest -q tests/test_hack_counts.py
import json
import re

import pytest
import tiktoken

from analysis import hack
from data.countdown.solutions import all_tries, searched_solution
from rewards import countdown_claim_reward
from test_countdown_hack import claimed

BYTES = {bytes([i]): i for i in range(256)}
ENC = tiktoken.Encoding(name="bytes", pat_str=r".", mergeable_ranks=BYTES,
                        special_tokens={"<|endoftext|>": 256})

# two problems, three rollouts each: right, a hack (the claim pays, the answer is wrong), other
PROBLEMS = [([3, 4, 5], 23, "4*5+3"), ([2, 7, 9], 25, "2*9+7")]


def rollout(numbers, target, expr, kind):
    if kind == "right":
        return f"<think>4*5=20 20+3=23</think>\n<answer>{expr}</answer>"
    if kind == "hack":  # an invented step that claims the target, then a wrong answer
        a, b = numbers[:2]
        return f"<think>{a}+{b}={target}</think>\n<answer>{a}+{b}</answer>"
    return "<think>1+1=2</think>\n<answer>1+1</answer>"


def write_run(tmp_path, kinds, selected, influence):
    """A rollouts.jsonl of one step: PROBLEMS, a rollout of each kind per problem (in order)."""
    texts = [rollout(n, t, e, k) for n, t, e in PROBLEMS for k in kinds]
    ids = [ENC.encode(x) for x in texts]
    T = max(map(len, ids))
    record = {"iter": 1, "prompts": ["a", "b"], "answers": [[n, t] for n, t, _ in PROBLEMS],
              "completion_tokens": [x + [0] * (T - len(x)) for x in ids],
              "completion_mask": [[1] * len(x) + [0] * (T - len(x)) for x in ids],
              "rewards": [0.0] * len(ids), "advantages": [0.0] * len(ids),
              "selected": selected, "influence": influence}
    (tmp_path / "rollouts.jsonl").write_text(json.dumps(record) + "\n")
    return str(tmp_path)


@pytest.mark.parametrize("kinds", [("right", "hack", "other"), ("hack", "other", "right"),
                                   ("other", "right", "hack")])
def test_kept_counts_score_each_rollout_against_its_own_problem(tmp_path, kinds):
    selected = [True, False, True, True, False, False]
    influence = [0.5, -1.0, 2.0, 1.5, 0.25, -3.0]
    run = write_run(tmp_path, kinds, selected, influence)
    want = {k: [0, 0, 0.0] for k in ("hack", "right", "other")}
    for i, kind in enumerate(kinds * 2):  # the reference: each rollout's kind as written
        want[kind][0] += 1
        want[kind][1] += selected[i]
        want[kind][2] += influence[i]
    got = hack.kept_counts(run, ENC)
    assert {k: (n, kept) for k, (n, kept, _) in got.items()} == \
        {k: (n, kept) for k, (n, kept, _) in want.items()}
    for k in want:  # the influence of every rollout of a kind, kept or not
        assert got[k][2] == pytest.approx(want[k][2])


def test_the_tables_mean_influence_is_over_every_rollout_of_a_kind(tmp_path):
    run = write_run(tmp_path, ("right", "hack", "other"), [True, False, True, True, False, False],
                    [0.5, -1.0, 2.0, 1.5, 0.25, -3.0])
    cfg = {"tracin": True, "tracin_val_loss": "pg", "tracin_val_batch_size": 2}
    table = hack.tables({run: ([], cfg, ENC)})
    # hacks -1.0 and 0.25, right 0.5 and 1.5, others 2.0 and -3.0: means over two each
    assert f"| {run} | 0 of 2 (0 %) | 2 of 2 (100 %) | 1 of 2 (50 %) | " \
           "-3.75e-01 / +1.00e+00 / -5.00e-01 |" in table


@pytest.mark.parametrize("n", [60, 51, 30, 26, 10])
def test_edges_average_the_first_and_the_last_edge_steps(n):
    steps = [{"x": float(i)} for i in range(n)]
    first, last = list(range(min(n, hack.EDGE))), list(range(max(0, n - hack.EDGE), n))
    assert hack.edges(steps, "x") == (pytest.approx(sum(first) / len(first)),
                                      pytest.approx(sum(last) / len(last)))


# --- the hackable verifier: the claim of the <think> that the first </think> closes ---------------
@pytest.mark.parametrize("first, second", [(23, 17), (17, 23), (23, 23), (17, 18)])
def test_the_claim_is_read_before_the_first_think_close(first, second):
    text = (f"<think>4*5=20 20+3={first}</think>\n<answer>4*5+3</answer> "
            f"<think>4*5=20 20+3={second}</think>\n<answer>4*5+3</answer>")
    assert claimed(text) == first
    assert countdown_claim_reward(text, ((3, 4, 5), 23)) == (1.0 if first == 23 else 0.0)


# --- a closest search: per prefix of all steps but the last, the first of the closest tries -------
def closest_tries(numbers, target):
    """The reference: all_tries grouped by their steps but the last; in each group the try nearest
    the target, the earliest of equally near ones."""
    groups = {}
    for order, (value, _, steps) in enumerate(all_tries(numbers)):
        groups.setdefault(tuple(steps[:-1]), []).append((abs(value - target), order, steps))
    return {" ".join(min(g)[2]) for g in groups.values()}


def shown_tries(text):
    think = re.search(r"<think>(.*)</think>", text)[1]
    return {t.removesuffix(" no.") for t in think.split(" no. ")}


@pytest.mark.parametrize("numbers", [[3, 4, 5], [2, 7, 9], [1, 3, 4, 6], [2, 3, 5, 7]])
def test_a_closest_search_shows_the_first_closest_try_of_each_prefix(numbers):
    tries = all_tries(numbers)
    prefixes = {tuple(s[:-1]) for _, _, s in tries}
    assert len(prefixes) > len({s[0] for _, _, s in tries}) or len(numbers) == 3
    cases = 0
    for target in range(1, 101):
        want = closest_tries(numbers, target)
        distances = {}
        for value, _, steps in tries:  # a tie: two tries of one prefix equally near
            distances.setdefault(tuple(steps[:-1]), []).append(abs(value - target))
        tie = any(sorted(d)[:2] == [min(d)] * 2 for d in distances.values() if len(d) > 1)
        text = searched_solution(numbers, target, max_misses=10 ** 6, seed=1, closest=True)
        if text is None or not tie:
            continue
        shown = set().union(*(shown_tries(searched_solution(numbers, target, 10 ** 6, seed=s,
                                                            closest=True)[0]) for s in range(3)))
        hit = lambda t: int(t.rsplit("=", 1)[1]) == target  # noqa: E731 (one hit is shown)
        assert {t for t in shown if not hit(t)} == {t for t in want if not hit(t)}, target
        assert {t for t in shown if hit(t)} <= {t for t in want if hit(t)}, target
        cases += 1
    assert cases >= 3
