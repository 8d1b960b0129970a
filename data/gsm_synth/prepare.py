"""
Synthetic GSM8K-style word problems and their tokenizer, built offline and deterministically.

    python data/gsm_synth/prepare.py --steps=2 --max_operand=20 --ops=+-
    python data/gsm_synth/prepare.py --steps=3 --min_steps=1      # 1 to 3 operations per problem

writes data/gsm_synth/<knobs>/{train,val,test}.jsonl, tokenizer.json and meta.json. Every
training script calls prepare() itself, so a fresh clone needs no manual step. Running it
twice gives byte-identical files (fixed seed, sorted/deterministic iteration, no timestamps).
An existing directory is checked first (the files meta.json lists, their line counts, the
tokenizer's size); a damaged or half-written one is rebuilt.

An example (GSM8K form: a worked solution, then a final line `#### <integer>`):
    question: "Mia has 12 pears. She buys 5 more pears. Then she gives 3 pears to Sam.
               How many pears does Mia have now?"
    solution: "12+5=17\n17-3=14\n#### 14"

The tokenizer (data/tokenizer.py) is a tiktoken.Encoding over bytes (so any text encodes) plus a
small BPE trained here on the training split. The directory's name and the command that builds it
again: names.py; reading it back: data/datadir.py (load_split, load_tokenizer).
"""
import os
import random
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(ROOT))
if REPO not in sys.path:  # run as a script: configurator.py is at the repository root
    sys.path.append(REPO)
from configurator import UserError, cli_main, configure, quiet_start  # noqa: E402
quiet_start(__name__)  # run as a script: a Ctrl-C while starting is one line
from data.datadir import MAX_ROWS, check_data_dir, check_out, check_sizes, knob_error  # noqa: E402
from data.datadir import row_limit, write_task_dir  # noqa: E402
from data.gsm_synth.names import DEFAULTS, data_dir_for  # noqa: E402
from data.tokenizer import build_encoding, tokenizer_json, train_bpe  # noqa: E402

MAX_STEPS = 50  # operations in one problem: a longer one fits no base's context here
# the config keys train_base.py reads these knobs from (its errors name them)
BASE_KEYS = {"steps": "task_steps", "min_steps": "task_min_steps",
             "max_operand": "task_max_operand", "ops": "task_ops", "noise": "task_noise",
             "n_train": "n_train"}

NAMES = [("Mia", "she", "her"), ("Sam", "he", "him"), ("Ava", "she", "her"), ("Leo", "he", "him"),
         ("Zoe", "she", "her"), ("Max", "he", "him"), ("Ivy", "she", "her"), ("Tom", "he", "him"),
         ("Eva", "she", "her"), ("Ben", "he", "him"), ("Lily", "she", "her"), ("Noah", "he", "him")]
ITEMS = ["apples", "pears", "cards", "coins", "books", "shells", "stickers", "marbles",
         "pencils", "cookies", "stamps", "beads"]
# one template per operation; {n} is the operand, {f} another child's name
TEMPLATES = {
    "+": ["{P} buys {n} more {item}.", "{P} finds {n} more {item}.", "{f} gives {o} {n} {item}."],
    "-": ["{P} gives {n} {item} to {f}.", "{P} loses {n} {item}.", "{P} sells {n} {item}."],
    "*": ["Then the number of {item} {p} has is multiplied by {n}."],
    "/": ["{P} splits the {item} into {n} equal piles and keeps one pile."],
}


def make_problem(rng, steps, max_operand, ops):
    """One problem with `steps` operations drawn from `ops`; returns (question, solution, answer)."""
    (name, p, o), item = rng.choice(NAMES), rng.choice(ITEMS)
    friend = rng.choice([n for n, _, _ in NAMES if n != name])
    cur = rng.randint(1, max_operand)
    sentences, lines = [f"{name} has {cur} {item}."], []
    for _ in range(steps):
        op = rng.choice(ops)
        if op == "-" and cur == 0:
            op = "+"  # nothing left to take away
        if op == "*":
            n = rng.randint(2, 3)  # keep products small enough for a tiny model
        elif op == "/":
            divisors = [d for d in range(2, 6) if cur % d == 0]
            if not divisors:
                op, n = "+", rng.randint(1, max_operand)
            else:
                n = rng.choice(divisors)
        elif op == "-":
            n = rng.randint(1, min(cur, max_operand))
        else:
            n = rng.randint(1, max_operand)
        new = {"+": cur + n, "-": cur - n, "*": cur * n, "/": cur // max(n, 1)}[op]
        s = rng.choice(TEMPLATES[op]).format(P=p.capitalize(), p=p, o=o, n=n, item=item, f=friend)
        sentences.append(s)
        lines.append(f"{cur}{op}{n}={new}")
        cur = new
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), "\n".join(lines + [f"#### {cur}"]), cur


def distinct_problems(n, draw, exclude=()):
    """Up to n problems from draw() -> (question, solution, answer), no two with the same question and
    none whose question is in `exclude`; fewer if 50 * n draws do not find n (the caller says why)."""
    seen, out = set(exclude), []
    for _ in range(50 * n):
        question, solution, answer = draw()
        if question not in seen:
            seen.add(question)
            out.append({"question": question, "solution": solution, "answer": answer})
            if len(out) == n:
                break
    return out


def stop_early(solution):
    """The slip planted by `noise`: the solution stops one step early and reports the
    intermediate result ("12+5=17\n#### 17" instead of going on to 17-3=14)."""
    eqs = solution.split("\n")[:-1]
    return "\n".join(eqs[:-1] + [f"#### {eqs[-2].split('=')[1]}"])


def prompt_text(question):
    """The prompt the model sees; the completion it must write is the solution."""
    return question + "\n"


def count_problems(steps, max_operand, ops, min_steps=0):
    """An upper bound on the distinct questions make_problem can write, capped just above MAX_ROWS
    (the most any directory holds): names x items x friends x first numbers x each step's
    choices."""
    ops = set(ops) | ({"+"} if set(ops) & set("-/") else set())  # '-' at 0, '/' at a prime: '+'
    operands = {"+": max_operand, "-": max_operand, "*": 2, "/": 4}
    per_step = sum(len(TEMPLATES[op]) * operands[op] for op in ops)
    first = len(NAMES) * len(ITEMS) * max_operand * ((len(NAMES) - 1) if ops & set("+-") else 1)
    total = 0
    for s in range(min_steps or steps, steps + 1):
        count = first
        for _ in range(s):
            count *= per_step
            if count > MAX_ROWS:
                return MAX_ROWS + 1
        total += count
        if total > MAX_ROWS:
            return MAX_ROWS + 1
    return total


def check_knobs(steps, max_operand, ops, noise, n_train, n_val, n_test, min_steps=0, keys=None):
    """Before any work: a one-line UserError naming the first knob out of range (as the user typed
    it: keys maps a knob to its config key), its value and what is allowed; the split sizes at most
    the distinct problems the knobs allow."""
    key = lambda k: (keys or {}).get(k, k)  # noqa: E731
    rules = [("steps", steps, steps >= 1, ">= 1"),
             ("steps", steps, steps <= MAX_STEPS, f"<= {MAX_STEPS} (longer fits no context)"),
             ("min_steps", min_steps, 0 <= min_steps <= steps,
              f"in [0, {key('steps')}={steps}] (0 = {key('steps')})"),
             ("max_operand", max_operand, max_operand >= 1, ">= 1"),
             ("ops", ops, bool(ops) and not set(ops) - set(TEMPLATES), "a non-empty subset of '+-*/'"),
             ("noise", noise, 0 <= noise <= 1, "between 0 and 1"),
             ("noise", noise, noise == 0 or steps >= 2,
              f"0 with {key('steps')}={steps} (stopping one step early needs {key('steps')} >= 2)"),
             ("n_train", n_train, n_train >= 1, ">= 1"), ("n_val", n_val, n_val >= 1, ">= 1"),
             ("n_test", n_test, n_test >= 1, ">= 1")]
    for name, value, ok, allowed in rules:
        if not ok:
            raise knob_error(name, value, allowed, keys)
    shown = ", ".join(f"{key(k)}={v}" for k, v in (("steps", steps), ("max_operand", max_operand),
                                                   ("ops", ops)))
    limit, what = row_limit(count_problems(steps, max_operand, ops, min_steps), f"with {shown}")
    check_sizes({"n_train": n_train, "n_val": n_val, "n_test": n_test}, limit, what, keys)


def prepare(steps=2, max_operand=20, ops="+-", noise=0.0, n_train=20000, n_val=500, n_test=500,
            num_merges=150, seed=1337, verbose=True, root=ROOT, min_steps=0, keys=None):
    """Build the data set for these knobs if it is missing or damaged; return its directory.

    min_steps: if set (1 <= min_steps < steps), each problem has between min_steps and steps
    operations, drawn uniformly, in every split; 0 = exactly `steps`.
    noise: fraction of TRAINING solutions that stop one step early (stop_early) while their
    `answer` field stays correct. A base model trained on them has both habits; a correctness
    reward can teach it to finish. Validation and test solutions are always clean.
    keys: {knob: config key} for errors (train_base.py's task_steps for steps)."""
    check_knobs(steps, max_operand, ops, noise, n_train, n_val, n_test, min_steps, keys)
    if not num_merges >= 0:  # (a name with _b-1 would not parse back into its knobs)
        raise knob_error("num_merges", num_merges, ">= 0", keys)
    min_steps = 0 if min_steps == steps else min_steps  # the same data as the default: the same directory
    data_dir = data_dir_for(steps, max_operand, ops, noise, root, n_train=n_train, n_val=n_val, n_test=n_test,
                            num_merges=num_merges, seed=seed, min_steps=min_steps)
    check_out(data_dir, "arith", "data directory", "give another --root")  # never a directory someone else made
    meta_path = os.path.join(data_dir, "meta.json")
    if os.path.exists(meta_path):
        problem = check_data_dir(data_dir)
        if problem is None:
            return data_dir
        print(f"warning: {data_dir} is damaged ({problem}): building it again")
    if verbose:
        print(f"preparing task data in {data_dir} ...")
    rng = random.Random(seed)
    n_total = n_train + n_val + n_test
    examples = distinct_problems(n_total, lambda: make_problem(  # unique questions: the splits share none
        rng, rng.randint(min_steps, steps) if min_steps else steps, max_operand, ops))  # no extra draw by default
    if len(examples) < n_total:
        key = (keys or {}).get
        raise UserError(f"only {len(examples)} distinct problems for these knobs, not {n_total}; "
                        f"lower {key('n_train', 'n_train')} or raise "
                        f"{key('max_operand', 'max_operand')} or {key('steps', 'steps')}")
    splits = {"test": examples[:n_test], "val": examples[n_test:n_test + n_val],
              "train": examples[n_test + n_val:]}
    noise_rng = random.Random(seed + 1)
    splits["train"] = [{**e, "solution": stop_early(e["solution"])}  # a 1-step solution cannot stop early
                       if noise_rng.random() < noise and e["solution"].count("\n") >= 2 else e
                       for e in splits["train"]]
    merges = train_bpe([prompt_text(e["question"]) + e["solution"] for e in splits["train"][:5000]],
                       num_merges)
    enc = build_encoding(merges)
    meta = {"steps": steps, "max_operand": max_operand, "ops": ops, "noise": noise, "seed": seed,
            **({"min_steps": min_steps} if min_steps else {}),  # (both only when not the default: default
            **({"num_merges": num_merges} if num_merges != DEFAULTS["num_merges"] else {}),  # dirs unchanged)
            "vocab_size": enc.n_vocab, "eot_token": enc.eot_token,
            "sizes": {k: len(v) for k, v in splits.items()}}
    write_task_dir(data_dir, "arith", splits, meta, {"tokenizer.json": tokenizer_json("gsm_synth", merges)})
    if verbose:
        print(f"  {meta['sizes']} problems, vocab {enc.n_vocab} tokens")
    return data_dir


def main(argv):
    print(prepare(**configure(DEFAULTS, argv)))


if __name__ == "__main__":
    cli_main(main)
