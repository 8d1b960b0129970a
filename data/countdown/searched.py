"""
Countdown for a GPT trained from scratch: problems drawn as data/countdown/prepare.py draws them (its
question's first sentence, the same [numbers, target] answer, so the same countdown reward scores them), reference solutions
that show a search (solutions.py), and a tokenizer built here from them, as data/gsm_synth builds
arith's: bytes, a small BPE trained on the training split, digits one token each, <|endoftext|>.

    python data/countdown/searched.py --n_numbers=3 --max_number=12 --max_target=100

writes data/countdown/search_n{n_numbers}_m{max_number}_x{max_target}_s{max_misses}[...]/ with
{train,val,test}.jsonl, tokenizer.json and meta.json (written last: it marks a complete directory),
read by data/datadir.py's load_split / load_tokenizer. train_base.py (task='countdown') calls
prepare() itself. Deterministic: random.Random(seed), no timestamps; a damaged directory is built
again.
No two problems share a multiset of numbers and a target; test is drawn first, then val, then train.
"""
import os
import random
import sys
from math import comb

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(ROOT))
if REPO not in sys.path:  # run as a script: configurator.py is at the repository root
    sys.path.append(REPO)
from configurator import cli_main, configure, quiet_start  # noqa: E402
quiet_start(__name__)  # run as a script: a Ctrl-C while starting is one line
from data.countdown.names import SEARCHED_DEFAULTS as DEFAULTS, searched_dir_for  # noqa: E402
from data.countdown.prepare import MAX_TARGET, TEMPLATE, draw_distinct  # noqa: E402
from data.countdown.solutions import ATOM, max_solutions, max_tries, searched_solution  # noqa: E402
from data.countdown.solutions import steps_of  # noqa: E402
from data.datadir import MAX_ROWS, check_data_dir, check_out, check_sizes, knob_error  # noqa: E402
from data.datadir import row_limit, write_task_dir  # noqa: E402
from data.gsm_synth.prepare import prompt_text  # noqa: E402
from data.tokenizer import build_encoding, tokenizer_json, train_bpe  # noqa: E402

# the question's first sentence: the rest of TEMPLATE is the same for every problem, an instruction that
# a model trained from scratch learns from the examples instead (and 60 tokens less per sequence)
QUESTION = TEMPLATE.split(" You can")[0]
# the config keys train_base.py reads these knobs from (its errors name them)
BASE_KEYS = {"n_numbers": "countdown_numbers", "max_number": "countdown_max_number",
             "max_target": "countdown_max_target", "max_misses": "countdown_max_misses",
             "variants": "countdown_variants", "pairs": "countdown_pairs", "check": "countdown_check",
             "ordered": "countdown_ordered", "closest": "countdown_closest",
             "give_up": "countdown_give_up", "n_train": "n_train"}


def data_dir_for(n_numbers=3, max_number=12, max_target=100, max_misses=3, **extra):
    """One directory per set of knobs (names.searched_dir_for), under ROOT."""
    return searched_dir_for(n_numbers, max_number, max_target, max_misses, root=ROOT, **extra)


def check_knobs(n_numbers, max_number, max_target, max_misses, n_train, n_val, n_test, num_merges,
                variants=1, keys=None, pairs=0, check=False, ordered=False, closest=False,
                give_up=0.0):
    """Before any work: a one-line UserError naming the first knob out of range (as the user typed
    it: keys maps a knob to its config key), its value and what is allowed; every size at most what
    the knobs can produce (distinct problems, distinct searched solutions), MAX_ROWS rows in all."""
    key = lambda k: (keys or {}).get(k, k)  # noqa: E731
    tries = max_tries(n_numbers) if 2 <= n_numbers <= 4 else 0
    rules = [("n_numbers", n_numbers, 2 <= n_numbers <= 4,
              "in [2, 4] (a try lists every step: more is too long)"),
             ("max_number", max_number, 1 <= max_number <= 99, "in [1, 99]"),
             ("max_target", max_target, 1 <= max_target <= MAX_TARGET, f"in [1, {MAX_TARGET}]"),
             ("max_misses", max_misses, 0 <= max_misses < tries,
              f"in [0, {tries - 1}] (the tries of {n_numbers} numbers, but one)"),
             ("n_train", n_train, n_train >= 1, ">= 1"), ("n_val", n_val, n_val >= 1, ">= 1"),
             ("n_test", n_test, n_test >= 1, ">= 1"),
             ("num_merges", num_merges, num_merges >= 0, ">= 0"),
             ("variants", variants, variants >= 1, ">= 1"),
             ("pairs", pairs, 0 <= pairs <= MAX_ROWS // 2, f"in [0, {MAX_ROWS // 2}]"),
             ("check", check, isinstance(check, bool), "True or False"),
             ("ordered", ordered, isinstance(ordered, bool), "True or False"),
             ("closest", closest, isinstance(closest, bool), "True or False"),
             ("give_up", give_up, 0 <= give_up <= 1, "in [0, 1]")]
    # with no miss shown, the knobs that work on misses would do nothing (a directory named for
    # them) or write copies: a variant differs from another by its misses
    misses = f"{key('max_misses')}={max_misses}"
    rules += [("give_up", give_up, give_up == 0 or max_misses >= 1,
               f"0 with {misses}: a solution gives up at its last miss and none shows one; "
               f"raise {key('max_misses')}"),
              ("variants", variants, variants == 1 or max_misses >= 1,
               f"1 with {misses}: variants differ by their misses, so most would be copies; "
               f"raise {key('max_misses')}")]
    for name, value, ok, allowed in rules:
        if not ok:
            raise knob_error(name, value, allowed, keys)
    shown = ", ".join(f"{key(k)}={v}" for k, v in (
        ("n_numbers", n_numbers), ("max_number", max_number), ("max_target", max_target)))
    distinct, rows = max_solutions(n_numbers, max_misses), (MAX_ROWS - n_val - n_test - pairs) // n_train
    # the tighter of the two is the largest allowed; rows < 1: the sizes alone are too large (below)
    if rows >= 1 and variants > min(distinct, rows):
        why = (f"{key('n_train')}={n_train} training problems written {key('variants')} times each "
               f"must fit the {MAX_ROWS} rows a data directory may hold") if rows < distinct else (
            f"the distinct searched solutions one problem has with {key('n_numbers')}={n_numbers}, "
            f"{key('max_misses')}={max_misses}")
        raise knob_error("variants", variants, f"at most {min(distinct, rows)}: {why}", keys)
    bound = comb(max_number + n_numbers - 1, n_numbers) * min(max_target, tries)
    sizes = {"n_train": n_train, "n_val": n_val, "n_test": n_test}
    check_sizes(sizes, *row_limit(bound, f"with {shown}"), keys)


def pair_problems(rng, n, max_number, n_numbers):
    """n two-number problems [v, m] -> target: v a value that the first n_numbers - 2 steps of a
    search can reach from numbers in 1..max_number, m one number, the target one step from them
    (solutions.steps_of). Their searched solutions drill each `a op b=c` that a search can write."""
    values = {(m, str(m), ATOM) for m in range(1, max_number + 1)}
    for _ in range(n_numbers - 2):  # the values a search holds before its last step
        values |= {(v, str(v), ATOM) for a in values for m in range(1, max_number + 1)
                   for v, _, _, _ in steps_of(a, (m, str(m), ATOM))}
    values = sorted(values)
    out = []
    for _ in range(n):
        a, m = rng.choice(values), rng.randint(1, max_number)
        target = rng.choice([v for v, _, _, _ in steps_of(a, (m, str(m), ATOM))])
        out.append(([a[0], m] if rng.random() < 0.5 else [m, a[0]], target))
    return out


def prepare(n_numbers=3, max_number=12, max_target=100, max_misses=3, n_train=20000, n_val=500, n_test=500,
            num_merges=300, seed=1337, variants=1, verbose=True, keys=None, pairs=0, check=False,
            ordered=False, closest=False, give_up=0.0):
    """Build the data and tokenizer for these knobs if missing or damaged; return the directory.
    variants: each training problem is written this many times, each with its own searched solution
    (other misses, possibly another hit): a base learns to search and compute rather than recall one
    trace. pairs: that many two-number training problems added (pair_problems): the arithmetic of
    every step a search can take, in the search's own format. check: every try sets its result
    beside the target; ordered: the tries walked in order; closest: each try's last step the one
    nearest the target (all three: solutions.searched_solution). give_up: that share of the
    TRAINING solutions stop at their last miss and answer it (as arith's noise: RL's room).
    keys: {knob: config key} for errors (train_base.py passes BASE_KEYS)."""
    check_knobs(n_numbers, max_number, max_target, max_misses, n_train, n_val, n_test, num_merges,
                variants, keys, pairs, check, ordered, closest, give_up)
    out = data_dir_for(n_numbers, max_number, max_target, max_misses, n_train=n_train, n_val=n_val,
                       n_test=n_test, num_merges=num_merges, seed=seed, variants=variants, pairs=pairs,
                       check=check, ordered=ordered, closest=closest, give_up=give_up)
    check_out(out, "countdown", "data directory", "remove it or change a knob")  # never someone else's directory
    meta_path = os.path.join(out, "meta.json")
    if os.path.exists(meta_path):
        problem = check_data_dir(out)
        if problem is None:
            return out
        print(f"warning: {out} is damaged ({problem}): building it again")
    if verbose:
        print(f"preparing Countdown data with searched solutions in {out} ...")
    n_total = n_train + n_val + n_test
    problems = [(numbers, target) for numbers, target, _, _ in
                draw_distinct(random.Random(seed), n_total, n_numbers, n_numbers, max_number, max_target)]
    if len(problems) < n_total:
        key = lambda k: (keys or {}).get(k, k)  # noqa: E731
        raise knob_error("n_train", n_train, f"lower: only {len(problems)} distinct problems with "
                         f"{key('n_numbers')}={n_numbers}, {key('max_number')}={max_number}, "
                         f"{key('max_target')}={max_target}, not {n_total} with n_val and n_test; "
                         f"or raise {key('max_number')} or {key('max_target')}", keys)
    slips = random.Random(seed + 1)  # which training solutions give up (drawn in row order)

    def rows(part, seeds, share=0.0):
        return [{"question": QUESTION.format(numbers=numbers, target=target),
                 "solution": searched_solution(numbers, target, max_misses, s, check, ordered,
                                               closest, share > 0 and slips.random() < share)[0],
                 "answer": [numbers, target]} for numbers, target in part for s in seeds]
    splits = {"test": rows(problems[:n_test], [seed]), "val": rows(problems[n_test:n_test + n_val], [seed]),
              "train": rows(problems[n_test + n_val:], range(seed, seed + variants), give_up)}
    merges = train_bpe([prompt_text(r["question"]) + r["solution"] for r in splits["train"][:5000]], num_merges)
    # after the tokenizer, which is learned from the problems' rows alone: the same with pairs
    splits["train"] += rows(pair_problems(random.Random(seed), pairs, max_number, n_numbers), [seed])
    enc = build_encoding(merges, "countdown")
    meta = {"task": "countdown", "n_numbers": n_numbers, "max_number": max_number, "max_target": max_target,
            "max_misses": max_misses, "num_merges": num_merges, "seed": seed, "variants": variants,
            **({"pairs": pairs} if pairs else {}), **({"check": True} if check else {}),
            **({"ordered": True} if ordered else {}), **({"closest": True} if closest else {}),
            **({"give_up": give_up} if give_up else {}),
            "vocab_size": enc.n_vocab,
            "eot_token": enc.eot_token, "sizes": {k: len(v) for k, v in splits.items()}}
    write_task_dir(out, "countdown", splits, meta, {"tokenizer.json": tokenizer_json("countdown", merges)})
    if verbose:
        print(f"  {meta['sizes']} problems, vocab {enc.n_vocab} tokens")
    return out


def main(argv):
    print(prepare(**configure(DEFAULTS, argv)))


if __name__ == "__main__":
    cli_main(main)
