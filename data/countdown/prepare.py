"""
Countdown (as in TinyZero's set): reach a target from a few numbers with + - * /, built offline
and deterministically.

    python data/countdown/prepare.py                          # 3 or 4 numbers from 1 to 99
    python data/countdown/prepare.py --min_numbers=4 --max_number=50 --n_train=5000

writes data/countdown/n{min_numbers}-{max_numbers}_m{max_number}[...]/{train,val,test}.jsonl and
meta.json (written last: it marks a complete directory), read by data/datadir.py's load_split.
A row:
    question: TEMPLATE filled in ("Using the numbers [44, 19, 35], create an equation that equals 98. ...")
    solution: "<think>44 + 19 = 63. 63 + 35 = 98.</think>\\n<answer>44 + 19 + 35</answer>"
    answer:   [[44, 19, 35], 98], the numbers in the order the question shows them, then the target

Every target is made from ALL its numbers, each exactly once (the reward asks for every given number
exactly once, so a problem whose only solutions leave a number out would be unsolvable for it): the
numbers are combined two at a time, in a random order with random operations, until one value is
left. Every intermediate value is a positive integer (a - b only for a > b, a / b only when b divides
a; never a division by zero), and the target is at most MAX_TARGET. Each reference expression is
checked here by an exact (Fraction) evaluation before it is written.

No two problems anywhere share the same multiset of numbers and target, so the splits share none.
test is the first n_test distinct problems drawn, val the next n_val, train the rest: changing n_train
leaves test and val as they were. Running it twice gives byte-identical files (random.Random(seed),
no timestamps); an existing directory is checked first and a damaged one is built again.
"""
import os
import random
import re
import sys
from fractions import Fraction
from math import comb

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(ROOT))
if REPO not in sys.path:  # run as a script: configurator.py is at the repository root
    sys.path.append(REPO)
from configurator import UserError, cli_main, configure, quiet_start  # noqa: E402
quiet_start(__name__)  # run as a script: a Ctrl-C while starting is one line
from data.countdown.names import DEFAULTS, data_dir_for  # noqa: E402
from data.countdown.solutions import PREC, join, max_tries  # noqa: E402
from data.datadir import check_out, check_sizes, check_task_dir, knob_error, row_limit  # noqa: E402
from data.datadir import write_task_dir  # noqa: E402

MAX_TARGET = 999
TEMPLATE = ("Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
            "operations (+, -, *, /) and each number exactly once. Show your work in <think> </think> tags and "
            "return the final equation in <answer> </answer> tags, for example <answer>(1 + 2) / 3</answer>.")
TREE_TRIES = 10  # random expressions tried on one set of numbers before drawing new numbers


def combine(rng, a, b):
    """One random step on two (value, expression, precedence) items, or None if no operation keeps the
    value a positive integer. The expression has only the parentheses it needs."""
    if a[0] < b[0]:
        a, b = b, a  # the larger first: a - b and a / b are the candidates
    ops = ["+", "*"] + (["-"] if a[0] > b[0] else []) + (["/"] if a[0] % b[0] == 0 else [])
    op = rng.choice(ops)
    if op in "+*" and rng.random() < 0.5:
        a, b = b, a  # either order for + and *, so the larger number does not always come first
    value = {"+": a[0] + b[0], "-": a[0] - b[0], "*": a[0] * b[0], "/": a[0] // b[0]}[op]
    return value, join(a, op, b, " "), PREC[op], f"{a[0]} {op} {b[0]} = {value}"


def make_problem(rng, min_numbers, max_numbers, max_number):
    """(numbers, target, expression, steps): a random expression over ALL the numbers, each once,
    whose value (the target) is at most MAX_TARGET."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(rng.randint(min_numbers, max_numbers))]
        for _ in range(TREE_TRIES):
            pool, steps = [(n, str(n), 3) for n in numbers], []
            while len(pool) > 1:
                i, j = rng.sample(range(len(pool)), 2)
                value, expr, prec, step = combine(rng, pool[i], pool[j])
                pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(value, expr, prec)]
                steps.append(step)
            if pool[0][0] <= MAX_TARGET:
                return numbers, pool[0][0], pool[0][1], steps


TOKEN = re.compile(r"\s*(?:(\d+)|(.))")


def evaluate(expr):
    """(exact value as a Fraction, the numbers it uses) of an expression of integers, + - * / and
    parentheses: a small parser of its own, so the generator is checked by something it does not share."""
    tokens = [(int(n), None) if n else (None, c) for n, c in TOKEN.findall(expr) if n or c.strip()]
    pos, used = 0, []

    def peek():
        return tokens[pos][1] if pos < len(tokens) else None

    def atom():
        nonlocal pos
        number, sym = tokens[pos]
        pos += 1
        if sym == "(":
            value = chain(1)
            assert peek() == ")", f"unbalanced parentheses in {expr!r}"
            pos += 1
            return value
        assert number is not None, f"unexpected {sym!r} in {expr!r}"
        used.append(number)
        return Fraction(number)

    def chain(prec):  # operators of precedence >= prec, left to right
        nonlocal pos
        value = atom() if prec == 2 else chain(2)
        while peek() in PREC and PREC[peek()] == prec:
            op = peek()
            pos += 1
            rhs = atom() if prec == 2 else chain(2)
            value = {"+": value + rhs, "-": value - rhs, "*": value * rhs, "/": value / rhs if rhs else None}[op]
            assert value is not None, f"division by zero in {expr!r}"
        return value

    value = chain(1)
    assert pos == len(tokens), f"trailing text in {expr!r}"
    return value, used


def draw_distinct(rng, n, min_numbers, max_numbers, max_number, max_target=MAX_TARGET):
    """Up to n make_problem draws, no two with the same multiset of numbers and target, every target at most
    max_target. Counting every target for every multiset overestimates how many exist, so the draws stop
    once a long run of them finds nothing new: fewer than n, and the caller says which knob to change."""
    seen, out, misses = set(), [], 0
    while len(out) < n and misses < max(2000, n):
        numbers, target, expr, steps = make_problem(rng, min_numbers, max_numbers, max_number)
        problem = (tuple(sorted(numbers)), target)
        if target > max_target or problem in seen:
            misses += 1
            continue
        seen.add(problem)
        out.append((numbers, target, expr, steps))
        misses = 0
    return out


def row(numbers, target, expr, steps):
    value, used = evaluate(expr)
    assert value == target and sorted(used) == sorted(numbers), (numbers, target, expr)  # the generator's bug
    return {"question": TEMPLATE.format(numbers=numbers, target=target),
            "solution": f"<think>{'. '.join(steps)}.</think>\n<answer>{expr}</answer>",
            "answer": [numbers, target]}


def max_problems(min_numbers, max_numbers, max_number, max_target=MAX_TARGET):
    """An upper bound on the distinct problems: per count of numbers, its multisets times the
    targets its tries can reach (at most max_target)."""
    return sum(comb(max_number + k - 1, k) * min(max_target, max_tries(k))
               for k in range(min_numbers, max_numbers + 1))


def check_knobs(n_train, n_val, n_test, min_numbers, max_numbers, max_number, keys=None):
    """Before any work: a one-line UserError naming the first knob out of range (as the user typed
    it: keys maps a knob to its config key), its value and what is allowed; the split sizes at most
    the distinct problems the knobs allow."""
    key = (keys or {}).get
    rules = [("n_train", n_train, n_train >= 1, ">= 1"), ("n_val", n_val, n_val >= 1, ">= 1"),
             ("n_test", n_test, n_test >= 1, ">= 1"),
             ("min_numbers", min_numbers, min_numbers >= 2, ">= 2 (one number is no puzzle)"),
             ("max_numbers", max_numbers, max_numbers >= min_numbers,
              f">= {key('min_numbers', 'min_numbers')}={min_numbers}"),
             ("max_numbers", max_numbers, max_numbers <= 6,
              f"<= 6 (as in the TV game; with more, the result is rarely <= {MAX_TARGET})"),
             ("max_number", max_number, 1 <= max_number <= MAX_TARGET, f"in [1, {MAX_TARGET}]")]
    for name, value, ok, allowed in rules:
        if not ok:
            raise knob_error(name, value, allowed, keys)
    shown = ", ".join(f"{key(k, k)}={v}" for k, v in (
        ("min_numbers", min_numbers), ("max_numbers", max_numbers), ("max_number", max_number)))
    limit, what = row_limit(max_problems(min_numbers, max_numbers, max_number), f"with {shown}")
    check_sizes({"n_train": n_train, "n_val": n_val, "n_test": n_test}, limit, what, keys)


def prepare(n_train=20000, n_val=500, n_test=500, min_numbers=3, max_numbers=4, max_number=99, seed=1337,
            out=None, verbose=True):
    """Build the Countdown data for these knobs if it is missing or damaged; return its directory."""
    check_knobs(n_train, n_val, n_test, min_numbers, max_numbers, max_number)
    out = str(out) if out else data_dir_for(n_train, n_val, n_test, min_numbers, max_numbers, max_number, seed)
    check_out(out, "countdown")  # never a directory someone else made, nor another task's data
    if os.path.exists(os.path.join(out, "tokenizer.json")):  # searched.py's Countdown data: its own
        raise UserError(f"out {out} holds Countdown data with searched solutions and a tokenizer "
                        "(data/countdown/searched.py), which a base may be trained on: it is not "
                        "replaced by prepare.py's; give another --out")
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    knobs = dict(min_numbers=min_numbers, max_numbers=max_numbers, max_number=max_number, max_target=MAX_TARGET,
                 seed=seed, sizes=sizes)
    meta_path = os.path.join(out, "meta.json")
    if os.path.exists(meta_path):
        problem = check_task_dir(out, 'countdown', knobs)
        if problem is None:
            return out
        print(f"warning: {out} is damaged or stale ({problem}): building it again")
    if verbose:
        print(f"preparing Countdown task data in {out} ...")
    n_total = n_train + n_val + n_test
    rows = [row(*p) for p in draw_distinct(random.Random(seed), n_total, min_numbers, max_numbers, max_number)]
    if len(rows) < n_total:
        raise UserError(f"bad task knob n_train={n_train}: found only {len(rows)} distinct problems for "
                        f"min_numbers={min_numbers}, max_numbers={max_numbers}, max_number={max_number}, "
                        f"not n_train + n_val + n_test = {n_total}; lower them or raise max_number")
    splits = {"train": rows[n_test + n_val:], "val": rows[n_test:n_test + n_val], "test": rows[:n_test]}
    write_task_dir(out, "countdown", splits, {"task": "countdown", **knobs, "template": TEMPLATE})
    if verbose:
        print(f"  {sizes} problems")
    return out


def main(argv):
    print(prepare(**configure(DEFAULTS, argv)))


if __name__ == "__main__":
    cli_main(main)
