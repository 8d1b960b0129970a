# Tests for the task rewards in rewards.py: countdown, think_format, gsm8k.
# Hermetic (no data, no torch), under a second.
# Run with: python -m pytest tests/test_task_rewards.py -q
import os
import random
import re
import sys
import time
from collections import Counter
from fractions import Fraction

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest

import rewards
from rewards import REWARD_FUNCS, countdown_reward, gsm8k_reward, think_format_reward


def wrap(expr: str) -> str:
    return f"<think>some reasoning</think>\n<answer>{expr}</answer>"


# --- an independent reference: regex for the numbers, shunting-yard for the value ---

def reference_value(expr: str):
    """The exact value of a well-formed expression, or None on division by zero.
    Written apart from rewards.py on purpose: a precedence table and an RPN
    stack (shunting-yard) instead of recursive descent."""
    tokens = re.findall(r"[0-9]+|[-+*/()]", expr)
    prec, out, ops = {"+": 1, "-": 1, "*": 2, "/": 2}, [], []
    for t in tokens:
        if t.isdigit():
            out.append(t)
        elif t == "(":
            ops.append(t)
        elif t == ")":
            while ops[-1] != "(":
                out.append(ops.pop())
            ops.pop()
        else:  # left associative: pop operators of equal or higher precedence
            while ops and ops[-1] != "(" and prec[ops[-1]] >= prec[t]:
                out.append(ops.pop())
            ops.append(t)
    out += reversed(ops)
    stack = []
    for t in out:
        if t.isdigit():
            stack.append(Fraction(int(t)))
            continue
        b, a = stack.pop(), stack.pop()
        if t == "/" and b == 0:
            return None
        stack.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[t])
    (value,) = stack
    return value


def reference_countdown(expr: str, numbers, target) -> float:
    """1.0/0.0 for a well-formed expression: the numbers by regex, the value by reference_value."""
    if not re.fullmatch(r"[0-9+\-*/() ]+", expr):
        return 0.0
    if Counter(int(t) for t in re.findall(r"[0-9]+", expr)) != Counter(numbers):
        return 0.0
    return 1.0 if reference_value(expr) == target else 0.0


# (expression inside <answer>, numbers, target, expected): hand-computed expectations,
# all of them well formed, so the reference must agree too.
WELL_FORMED = [
    ("(3+5)*2", [3, 5, 2], 16, 1.0),          # parentheses change the value
    ("3+5*2", [3, 5, 2], 13, 1.0),            # precedence: 3+10
    ("3+5*2", [3, 5, 2], 16, 0.0),            # wrong value
    ("10-4-3", [10, 4, 3], 3, 1.0),           # left associative: (10-4)-3
    ("10-(4-3)", [10, 4, 3], 9, 1.0),
    ("(99-3)/(4-1)", [99, 3, 4, 1], 32, 1.0),  # exact division: 96/3
    ("7/2*2", [7, 2, 2], 7, 1.0),             # an exact fraction 7/2 on the way
    ("1/3+2/3", [1, 3, 2, 3], 1, 1.0),        # fractions that sum to an int (floats would too, but Fraction is exact)
    ("7/2", [7, 2], 3, 0.0),                  # 3.5 is not 3: no integer division
    ("3*3+5", [3, 3, 5], 14, 1.0),            # duplicates in the numbers: both 3s used
    ("3+5", [3, 3, 5], 8, 0.0),               # one 3 missing
    ("3*3+5", [3, 5, 2], 14, 0.0),            # 3 used twice, 2 missing
    ("3+5+2+1", [3, 5, 2], 11, 0.0),          # an extra number
    ("3+5", [3, 5, 2], 8, 0.0),               # 2 missing
    ("5/(3-3)", [5, 3, 3], 0, 0.0),           # division by zero
    (" 3 + 5 ", [3, 5], 8, 1.0),              # spaces
    ("((3))+(5)", [3, 5], 8, 1.0),            # redundant parentheses
    ("(" * 30 + "3+5" + ")" * 30, [3, 5], 8, 1.0),  # nesting under the cap
    ("", [3, 5], 8, 0.0),                     # empty answer
    ("1", [1], 1, 1.0),
]


@pytest.mark.parametrize("expr, numbers, target, expected", WELL_FORMED)
def test_countdown_well_formed(expr, numbers, target, expected):
    assert reference_countdown(expr, numbers, target) == expected  # the table is right
    assert countdown_reward(wrap(expr), [numbers, target]) == expected
    assert countdown_reward(wrap(expr), (tuple(numbers), target)) == expected  # tuples too


def random_expression(rng, numbers):
    """A random binary tree over the numbers, in order, fully or partly parenthesized."""
    if len(numbers) == 1:
        return str(numbers[0])
    k = rng.randrange(1, len(numbers))
    left, right = random_expression(rng, numbers[:k]), random_expression(rng, numbers[k:])
    text = f"{left}{rng.choice('+-*/')}{right}"
    return f"({text})" if rng.random() < 0.6 else text


def test_countdown_matches_reference_on_random_expressions():
    rng = random.Random(0)
    hits = 0
    for _ in range(2000):
        numbers = [rng.randint(1, 99) for _ in range(rng.choice((3, 4)))]
        used = rng.sample(numbers, len(numbers))
        if rng.random() < 0.2:
            used[rng.randrange(len(used))] = rng.randint(1, 99)  # a number missing / one extra
        expr = random_expression(rng, used)
        value = reference_value(expr)
        target = round(value or 0) + rng.choice((0, 0, 1))
        expected = reference_countdown(expr, numbers, target)
        hits += expected == 1.0
        assert countdown_reward(wrap(expr), [numbers, target]) == expected, expr
    assert hits > 200  # the table exercises both outcomes


# Each must score 0.0, and cheaply (the cheap check and the parser's caps).
HOSTILE = [
    ("3+5=8", [3, 5], 8),                      # "= target": the expression only, as TinyZero
    ("3+5 = 8", [3, 5], 8),
    ("-3+5", [3, 5], 2),                       # unary minus: numbers as given
    ("3--5", [3, 5], 8),
    ("+3+5", [3, 5], 8),                       # unary plus too
    ("3**5", [3, 5], 243),
    ("10**10**10", [10, 10, 10], 0),
    ("1" * 100_000, [1], 1),                   # past the length cap
    ("1234567", [1234567], 1234567),           # past the literal cap
    ("03+5", [3, 5], 8),                       # leading zero: not as given
    ("(" * 10_000 + "3+5" + ")" * 10_000, [3, 5], 8),
    ("(" * 40 + "3+5" + ")" * 40, [3, 5], 8),  # under the length cap, over the depth cap
    ("(3+5", [3, 5], 8),                       # unbalanced
    ("3+5)", [3, 5], 8),
    ("()3+5", [3, 5], 8),
    ("3 5", [3, 5], 35),                       # two numbers, no operator
    ("35", [3, 5], 35),                        # digits glued: a different number
    ("__import__('os').system('x')", [3, 5], 8),
    ("lambda: 1", [1], 1),
    ("(lambda: 8)()", [3, 5], 8),
    ("1.5*2", [1, 2], 3),                      # floats
    ("1.5e1", [1], 15),
    ("\uff13+5", [3, 5], 8),                   # fullwidth 3
    ("\u0663+5", [3, 5], 8),                   # Arabic-Indic 3
    ("3^5", [3, 5], 6),
    ("3%5", [3, 5], 3),
    ("3//5", [3, 5], 0),
    ("x+5", [3, 5], 8),
    ("3+5\x00", [3, 5], 8),
    ("3,5", [3, 5], 8),
]


@pytest.mark.parametrize("expr, numbers, target", HOSTILE, ids=[h[0][:20] for h in HOSTILE])
def test_countdown_hostile_is_zero_and_fast(expr, numbers, target):
    completion = wrap(expr)
    best = float("inf")
    for _ in range(5):  # min of several runs: robust to a busy machine
        t0 = time.perf_counter()
        value = countdown_reward(completion, [numbers, target])
        best = min(best, time.perf_counter() - t0)
        assert value == 0.0
    assert best < 0.010, f"{best * 1000:.1f} ms"


def test_nbsp_case_is_the_strip():
    # str.strip() removes a trailing NBSP, so "3+5\u00a0" is simply "3+5": = 8 is right.
    assert countdown_reward(wrap("3+5\u00a0"), [[3, 5], 8]) == 1.0
    assert countdown_reward(wrap("3\u00a0+5"), [[3, 5], 8]) == 0.0  # inside: not an allowed space


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>3+5</answer>", 1.0),                            # no think part: format is think_format's job
        ("<answer>9</answer> then <answer>3+5</answer>", 1.0),     # the last answer counts
        ("<answer>3+5</answer> then <answer>9</answer>", 0.0),
        ("<answer>3+5</answer> then <answer>3*5", 1.0),            # an unclosed last one: the last complete pair
        ("<answer>3+5", 0.0),                                      # unclosed
        ("3+5</answer>", 0.0),
        ("</answer>3+5<answer>", 0.0),                             # wrong order
        ("no tags at all: 3+5", 0.0),
        ("", 0.0),
        ("<answer>\n  3 + 5\n</answer>\n", 1.0),                  # whitespace around
        ("<answer></answer>", 0.0),                                # empty
        ("<answer>   </answer>", 0.0),
        ("<ANSWER>3+5</ANSWER>", 0.0),                             # tags are case sensitive
    ],
)
def test_countdown_tags(completion, expected):
    assert countdown_reward(completion, [[3, 5], 8]) == expected


def test_countdown_huge_completion_is_fast():
    for completion in ("<answer>" * 200_000, "x" * 1_000_000, "<answer>1</answer>" * 50_000):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            assert countdown_reward(completion, [[3, 5], 8]) == 0.0
            best = min(best, time.perf_counter() - t0)
        assert best < 0.010, f"{best * 1000:.1f} ms"


def test_countdown_never_raises_on_junk():
    rng = random.Random(1)
    alphabet = list("0123456789+-*/() .=x\n") + ["<answer>", "</answer>", "<think>", "</think>", "**", "\uff13"]
    for _ in range(3000):
        completion = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert countdown_reward(completion, [[3, 5, 2], 16]) in (0.0, 1.0)
        assert think_format_reward(completion, None) in (0.0, 1.0)
        assert gsm8k_reward(completion, 3) in (0.0, 1.0)


@pytest.mark.parametrize("answer", [8, None, [[3, 5]], [[3, 5.0], 8], [[3, 5], "8"], [3, 8]])
def test_countdown_malformed_answer_raises(answer):
    # A dataset bug, not a bad completion: compute_rewards counts it in errors.
    with pytest.raises(ValueError, match="countdown answer"):
        countdown_reward(wrap("3+5"), answer)


def test_parse_counts_skipped_vs_parsed():
    """The log's countdown/parsed and /skipped: of the completions, those with a complete
    <answer>...</answer> pair (which countdown_reward parses, right or wrong) and the others (0)."""
    completions = ["no tags", "<answer>3+5", wrap("3+5"), wrap("3*5"), wrap("lambda: 1")]
    assert rewards.parse_counts(completions, ["format", "countdown"]) == \
        {"countdown/skipped": 2, "countdown/parsed": 3}
    assert rewards.parse_counts(completions, ["format"]) == {}  # no parser, no count
    for completion in completions[:2]:  # the two it skips score 0 without being parsed
        assert countdown_reward(completion, [[3, 5], 8]) == 0.0


# --- think_format ---------------------------------------------------------------

@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>a</think><answer>b</answer>", 1.0),
        ("  <think>a</think>\n\n<answer>b</answer>\n", 1.0),   # whitespace between and around
        ("<think>line 1\nline 2\n</think>\n<answer>3+5</answer>", 1.0),  # think spans lines
        ("<think></think><answer></answer>", 1.0),             # format only, not content
        ("<answer>b</answer>", 0.0),                           # no think
        ("<think>a</think>", 0.0),                             # no answer
        ("<answer>b</answer><think>a</think>", 0.0),           # wrong order
        ("<think>a</think>text<answer>b</answer>", 0.0),       # text between
        ("hello <think>a</think><answer>b</answer>", 0.0),     # text before
        ("<think>a</think><answer>b</answer> bye", 0.0),       # text after
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0),  # two answers
        ("<think>a<think>b</think><answer>c</answer>", 0.0),   # two think openings
        ("<think>a</think><answer>b", 0.0),                    # unclosed
        ("<think>a<answer>b</think></answer>", 0.0),           # interleaved
        ("", 0.0),
    ],
)
def test_think_format(completion, expected):
    assert think_format_reward(completion, None) == expected


# --- gsm8k ----------------------------------------------------------------------

@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("6*12=72\n#### 72", 72, 1.0),
        ("#### 71", 72, 0.0),
        ("So the answer is $\\boxed{72}$.", 72, 1.0),
        ("\\boxed{72}", 71, 0.0),
        ("#### 5\nor maybe \\boxed{72}", 72, 0.0),       # "####" first, boxed only without it
        ("#### 5\nor maybe \\boxed{72}", 5, 1.0),
        ("#### \\boxed{72}", 72, 1.0),                   # no number after "####": the boxed one
        ("#### 3\n#### 72", 72, 1.0),                    # the last "####" wins
        ("\\boxed{3} no, \\boxed{72}", 72, 1.0),         # the last boxed wins
        ("\\boxed{72} no, \\boxed{3}", 72, 0.0),
        ("#### 1,234", 1234, 1.0),                       # commas
        ("\\boxed{1,234}", 1234, 1.0),
        ("\\boxed{12,34}", 1234, 0.0),                   # badly grouped
        ("#### -7", -7, 1.0),                            # negative
        ("\\boxed{-7}", -7, 1.0),
        ("\\boxed{ $-7$ }", -7, 1.0),
        ("\\boxed{72.0}", 72, 1.0),                      # integral decimal
        ("\\boxed{72.5}", 72, 0.0),
        ("\\boxed{\\frac{144}{2}}", 72, 0.0),
        ("\\boxed{72 apples}", 72, 0.0),
        ("\\boxed{\uff17\uff12}", 72, 0.0),               # fullwidth digits
        ("\\boxed{72", 72, 0.0),                         # unclosed
        ("\\boxed{" + "9" * 10_000 + "}", 72, 0.0),      # over int()'s digit limit: no error
        ("72", 72, 0.0),                                 # a bare number is not an answer
        ("", 72, 0.0),
    ],
)
def test_gsm8k(completion, answer, expected):
    assert gsm8k_reward(completion, answer) == expected


def test_registry_names():
    assert REWARD_FUNCS["countdown"] is countdown_reward
    assert REWARD_FUNCS["think_format"] is think_format_reward
    assert REWARD_FUNCS["gsm8k"] is gsm8k_reward


def test_compute_rewards_countdown_with_the_cache():
    # The cache keys on (name, completion, answer), so answers must be hashable: tuples.
    answer = ((3, 5), 8)
    cache = rewards.RewardCache()
    totals, per_func, errors = rewards.compute_rewards(
        [wrap("3+5"), wrap("3*5")], [answer, answer], ["countdown", "think_format"], [1.0, 0.5], cache
    )
    assert per_func == {"countdown": [1.0, 0.0], "think_format": [1.0, 1.0]}
    assert totals == [1.5, 0.5] and errors == {"countdown": 0, "think_format": 0}
