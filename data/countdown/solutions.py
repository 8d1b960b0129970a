"""
Countdown reference solutions that show a search: a few combinations tried and missed, then the one
that makes the target. The tiny GPT trained from scratch (train_base.py, task='countdown') learns
from them that an answer is found by trying, computing and checking, not guessed in one go:

    numbers [7, 3, 5], target 26
    <think>7+3=10 10+5=15 no. 7-3=4 5*4=20 no. 7*3=21 21+5=26</think>
    <answer>7*3+5</answer>

A try combines the numbers two at a time until one value is left (as data/countdown/prepare.py
builds its targets: every intermediate value a positive integer, a - b only for a > b, a / b only
when b divides a). A miss ends in " no."; the last try reaches the target. Which tries miss, and
how many (0..max_misses), is drawn by a generator seeded by the problem itself, so a problem's
solution never depends on which split or which other problems it sits with.
"""
import random
from math import perm

PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
ATOM = 3  # a bare number binds tightest


def join(a, op, b, sep=""):
    """The expression a op b with only the parentheses it needs; a, b are (value, text, precedence);
    sep around op (prepare.py writes "44 + 19", a searched solution "44+19"). Right of - or /, an
    operand of equal precedence needs them: 9-(5-2), 8/(4/2). Every Countdown expression is built
    here."""
    left = a[1] if a[2] >= PREC[op] else f"({a[1]})"
    right = b[1] if b[2] > PREC[op] or (b[2] == PREC[op] and op in "+*") else f"({b[1]})"
    return f"{left}{sep}{op}{sep}{right}"


def steps_of(a, b):
    """Every allowed one-step combination of two items, larger first: (value, text, prec, 'a op b=v')."""
    if a[0] < b[0]:
        a, b = b, a
    ops = "+*" + ("-" if a[0] > b[0] else "") + ("/" if a[0] % b[0] == 0 else "")
    for op in ops:
        v = {"+": a[0] + b[0], "-": a[0] - b[0], "*": a[0] * b[0], "/": a[0] // max(b[0], 1)}[op]
        yield v, join(a, op, b), PREC[op], f"{a[0]}{op}{b[0]}={v}"


def all_tries(numbers):
    """Every way to combine ALL the numbers two at a time: [(value, expression, [step texts])].
    Pairs are taken in index order, so the same expression may appear once per order of its steps."""
    out = []

    def walk(pool, steps):
        if len(pool) == 1:
            out.append((pool[0][0], pool[0][1], steps))
            return
        for i in range(len(pool)):
            for j in range(i + 1, len(pool)):
                rest = [p for k, p in enumerate(pool) if k not in (i, j)]
                for v, text, prec, step in steps_of(pool[i], pool[j]):
                    walk(rest + [(v, text, prec)], steps + [step])

    walk([(n, str(n), ATOM) for n in numbers], [])
    return out


def max_tries(n_numbers):
    """The most tries all_tries can list for n_numbers numbers: a pair and one of 4 operations per
    step."""
    return 1 if n_numbers <= 1 else n_numbers * (n_numbers - 1) // 2 * 4 * max_tries(n_numbers - 1)


def max_solutions(n_numbers, max_misses):
    """The most distinct solutions searched_solution can write for one problem: up to max_misses
    tries that miss, in order, then a hit."""
    tries = max_tries(n_numbers)
    return sum(perm(tries, k) for k in range(min(max_misses, tries - 1) + 1)) * tries


def problem_rng(numbers, target, seed):
    """A generator seeded by the problem: the same problem gets the same solution in any split."""
    return random.Random(f"{seed}:{','.join(map(str, numbers))}:{target}")


def searched_solution(numbers, target, max_misses=3, seed=0, check=False, ordered=False,
                      closest=False, give_up=False):
    """(solution text, number of misses shown): 0..max_misses distinct tries that miss the target, then
    one that makes it. None if no try makes the target (never for data/countdown/prepare.py's problems).
    check: every try sets its result beside the target ("70-5=65 vs 43 no.", "50-7=43 vs 43</think>"),
    so that the decision to go on or stop compares two neighbouring numbers, not one written far back
    in the question.
    ordered: the hit is the first in all_tries' order, the misses tries before it, in that order (a
    search that walks the tries forward, skipping some): the next try always lies further on.
    closest: one try per way of taking all steps but the last, ending in the last step that comes
    closest to the target (the first such): a search that chooses its last step by the target
    instead of trying each (for 3 numbers, 12 tries at most instead of 48).
    give_up: a search that stops at its last miss and answers it (a wrong answer), when it shows
    a miss at all; the slip a base is taught on purpose, so that RL has something to remove."""
    tries = all_tries(numbers)
    if closest:  # per prefix of steps, the try nearest the target; a dict keeps all_tries' order
        best = {}
        for t in tries:
            prefix = tuple(t[2][:-1])
            if prefix not in best or abs(t[0] - target) < abs(best[prefix][0] - target):
                best[prefix] = t
        tries = list(best.values())
    hits = [t for t in tries if t[0] == target]
    if not hits:
        return None
    rng = problem_rng(numbers, target, seed)
    if ordered:  # the first hit in order; misses among the tries before it, kept in order
        first = tries.index(hits[0])  # hits keep all_tries' order
        picked = sorted(rng.sample(range(first), min(first, rng.randint(0, max_misses))))
        shown = [tries[i] for i in picked] + [tries[first]]
    else:
        misses = [t for t in tries if t[0] != target]
        shown = rng.sample(misses, min(len(misses), rng.randint(0, max_misses))) + [rng.choice(hits)]
    if give_up and len(shown) > 1:  # the hit left out: the last miss ends the search
        shown = shown[:-1]
    beside = f" vs {target}" if check else ""
    think = " no. ".join(" ".join(steps) + beside for _, _, steps in shown)
    think += " no." if shown[-1][0] != target else ""  # a search that gave up
    return f"<think>{think}</think>\n<answer>{shown[-1][1]}</answer>", \
        len(shown) - (shown[-1][0] == target)
