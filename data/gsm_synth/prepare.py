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

The tokenizer is a tiktoken.Encoding over bytes (so any text encodes) plus a small BPE
trained here on the training split: frequent words become one token, digits never merge
(the split pattern isolates every digit), and <|endoftext|> is a special token.
"""
import json
import os
import random
import re
import shlex
import sys
from collections import Counter

import regex  # tiktoken's own dependency: the same pattern semantics as tiktoken
import tiktoken

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(ROOT))
if REPO not in sys.path:  # run as a script: configurator.py is at the repository root
    sys.path.append(REPO)
from configurator import UserError, cli_main, configure  # noqa: E402
from data.datadir import check_out, write_task_dir  # noqa: E402

DEFAULTS = dict(steps=2, max_operand=20, ops="+-", noise=0.0, n_train=20000, n_val=500, n_test=500,
                num_merges=150, seed=1337, min_steps=0, root=ROOT)
SPLITS = ("train", "val", "test")
FIELDS = ("question", "solution", "answer")
EOT = "<|endoftext|>"
# GPT-2's split pattern, except that a digit is always a piece of its own: numbers are
# spelled digit by digit, so the model sees the same tokens for "14" in every context.
PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

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


def train_bpe(texts, num_merges):
    """Byte-level BPE merges learned from `texts` (deterministic: ties broken by the bytes)."""
    words = Counter(w for t in texts for w in regex.findall(PAT_STR, t))
    words = {tuple(bytes([b]) for b in w.encode()): c for w, c in sorted(words.items())}
    merges = []
    for _ in range(num_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < 2:
            break
        merges.append(a + b)
        new_words = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return merges


def tokenizer_json(name, merges):
    """tokenizer.json as load_tokenizer reads it: the split pattern and the merges (hex bytes)."""
    return json.dumps({"name": name, "pat_str": PAT_STR, "merges": [m.hex() for m in merges]})


def build_encoding(merges, name="gsm_synth"):
    """A tiktoken.Encoding: 256 byte tokens, then the merges in rank order, then <|endoftext|>."""
    ranks = {bytes([i]): i for i in range(256)}
    for m in merges:
        ranks[m] = len(ranks)
    return tiktoken.Encoding(name=name, pat_str=PAT_STR, mergeable_ranks=ranks,
                             special_tokens={EOT: len(ranks)})


def read_json(path):
    """The JSON in a file; OSError if it cannot be read, ValueError if it is not JSON."""
    with open(path) as f:
        try:
            return json.load(f)
        except ValueError as e:
            raise ValueError(f"not valid JSON ({e})") from None


def read_tokenizer(path):
    """The tiktoken.Encoding in a tokenizer.json; OSError or ValueError if it is missing or damaged."""
    tok = read_json(path)
    try:
        return build_encoding([bytes.fromhex(h) for h in tok["merges"]], tok["name"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a tokenizer ({type(e).__name__}: {e})") from None


def read_split(path):
    """The problems in a split file; OSError or ValueError (naming the line) if it is missing or damaged."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict) or not all(k in row for k in FIELDS):
                raise ValueError(f"line {n} is not a problem (a JSON object with {', '.join(FIELDS)})")
            rows.append(row)
    if not rows:
        raise ValueError("it holds no problem")
    return rows


def read_meta(data_dir):
    """meta.json as a dict; OSError or ValueError if it is missing or lacks the split sizes and vocab size."""
    meta = read_json(os.path.join(data_dir, "meta.json"))
    if not isinstance(meta, dict) or not isinstance(meta.get("vocab_size"), int) \
            or not isinstance(meta.get("sizes"), dict) or sorted(meta["sizes"]) != sorted(SPLITS):
        raise ValueError("it lacks the split sizes or the vocab size")
    return meta


def knobs_from_name(data_dir):
    """The knobs data_dir_for() spelled in the directory's name ({} if the name is not one of its)."""
    name = os.path.basename(os.path.normpath(data_dir))
    m = re.fullmatch(r"s(\d+)_m(\d+)_([asmd]+)_n([\d.e-]+)((?:_[tvebrl]\d+)*)", name)
    if not m:
        return {}
    letters = {letter: k for k, letter in EXTRA_KNOBS}
    return dict(steps=int(m[1]), max_operand=int(m[2]), ops=m[3].translate(str.maketrans("asmd", "+-*/")),
                noise=float(m[4]) / 100, **{letters[x[0]]: int(x[1:]) for x in m[5].split("_")[1:]})


def rebuild_command(data_dir):
    """The command line that builds data_dir again, byte for byte: its knobs from meta.json, or from its name
    when meta.json cannot be read; a gsm8k or countdown directory gets its own prepare.py's command."""
    if (task := read_meta_task(data_dir)) in ("gsm8k", "countdown"):
        return __import__(f"data.{task}.prepare", fromlist=["rebuild_command"]).rebuild_command(data_dir)
    named = knobs_from_name(data_dir)
    try:
        meta = read_meta(data_dir)
        knobs = {k: meta[k] for k in ("steps", "max_operand", "ops", "noise")}
        knobs.update({f"n_{k}": meta["sizes"][k] for k in SPLITS}, seed=meta["seed"],
                     min_steps=meta.get("min_steps", 0))
        # the merges ASKED for (meta.json records a non-default number; older ones: the name's _b), never
        # the number learned (vocab_size - 257), which a small training split leaves below it
        knobs["num_merges"] = meta.get("num_merges", named.get("num_merges", DEFAULTS["num_merges"]))
    except (OSError, ValueError, KeyError, TypeError):
        if not named:
            return "python data/gsm_synth/prepare.py with the knobs of the run that made it"
        knobs = named
    root = os.path.dirname(os.path.abspath(data_dir))
    knobs["root"] = root if root != ROOT else None
    args = [shlex.quote(f"--{k}={v}") for k, v in knobs.items()
            if k in ("steps", "max_operand", "ops", "noise") or v not in (None, DEFAULTS[k])]
    return " ".join(["python data/gsm_synth/prepare.py"] + args)


def read_meta_task(data_dir):
    """Which prepare.py made data_dir: meta.json's task (gsm8k, countdown; none here), else its folder's name."""
    try:
        return read_json(os.path.join(data_dir, "meta.json")).get("task")
    except (OSError, ValueError, AttributeError):
        parent = os.path.basename(os.path.dirname(os.path.abspath(data_dir)))
        return parent if parent in ("gsm8k", "countdown") else None


def damaged(path, e):
    """The UserError for a missing or unreadable data file: what is wrong, and how to build it again."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else e
    return UserError(f"{path}: {why}; build the task data again with: {rebuild_command(os.path.dirname(path))}")


def load_tokenizer(data_dir):
    """The task's tokenizer, read from data_dir/tokenizer.json (no network, ever)."""
    path = os.path.join(data_dir, "tokenizer.json")
    try:
        return read_tokenizer(path)
    except (OSError, ValueError) as e:
        raise damaged(path, e) from None


def load_split(data_dir, split):
    """List of {"question", "solution", "answer"} dicts."""
    path = os.path.join(data_dir, f"{split}.jsonl")
    try:
        return read_split(path)
    except (OSError, ValueError) as e:
        raise damaged(path, e) from None


def check_data_dir(data_dir):
    """None if data_dir is complete (every file meta.json promises, with the sizes it says), else what is wrong."""
    name = "meta.json"
    try:
        meta = read_meta(data_dir)
        for split, n in meta["sizes"].items():
            name = f"{split}.jsonl"
            rows = read_split(os.path.join(data_dir, name))
            if len(rows) != n:
                return f"{name} has {len(rows)} problems, meta.json says {n}"
        name = "tokenizer.json"
        enc = read_tokenizer(os.path.join(data_dir, name))
        if enc.n_vocab != meta["vocab_size"]:
            return f"{name} has {enc.n_vocab} tokens, meta.json says {meta['vocab_size']}"
    except OSError as e:
        return f"{name}: {e.strerror or e}"
    except ValueError as e:
        return f"{name}: {e}"
    return None


def check_task_dir(data_dir, task, knobs):
    """For the other tasks' directories (data/gsm8k, data/countdown): None if data_dir is complete and
    was built for `task` from `knobs` (meta.json says so, every split has the size it promises), else
    what is wrong or different."""
    name = "meta.json"
    try:
        meta = read_json(os.path.join(data_dir, name))
        if not isinstance(meta, dict) or meta.get("task") != task or not isinstance(meta.get("sizes"), dict):
            return f"{name} is not a {task} meta.json"
        changed = [k for k, v in knobs.items() if meta.get(k) != v]
        if changed:
            return f"built with other {', '.join(changed)}"
        for split in SPLITS:
            name = f"{split}.jsonl"
            n = len(read_split(os.path.join(data_dir, name)))
            if n != meta["sizes"].get(split):
                return f"{name} has {n} problems, meta.json says {meta['sizes'].get(split)}"
    except (OSError, ValueError) as e:
        return f"{name}: {getattr(e, 'strerror', None) or e}"
    return None


# knobs that change the data but are not in the directory name at their defaults (letter in the name)
EXTRA_KNOBS = (("n_train", "t"), ("n_val", "v"), ("n_test", "e"), ("num_merges", "b"), ("seed", "r"),
               ("min_steps", "l"))


def data_dir_for(steps, max_operand, ops, noise=0.0, root=ROOT, **extra):
    """One directory per set of knobs, so two sets never share (or silently reuse) a directory:
    s{steps}_m{max_operand}_{ops}_n{noise %}, plus _t{n_train}, _v{n_val}, ... when not the default."""
    safe_ops = ops.replace("+", "a").replace("-", "s").replace("*", "m").replace("/", "d")
    name = f"s{steps}_m{max_operand}_{safe_ops}_n{noise * 100:.10g}"
    name += "".join(f"_{letter}{extra[k]}" for k, letter in EXTRA_KNOBS if extra.get(k, DEFAULTS[k]) != DEFAULTS[k])
    return os.path.join(root, name)


def check_knobs(steps, max_operand, ops, noise, n_train, n_val, n_test, min_steps=0):
    """Raise a one-line UserError naming the first knob out of range, its value and what is allowed."""
    rules = [("steps", steps, steps >= 1, ">= 1"),
             ("min_steps", min_steps, 0 <= min_steps <= steps, f"in [0, steps={steps}] (0 = steps)"), ("max_operand", max_operand, max_operand >= 1, ">= 1"),
             ("ops", ops, bool(ops) and not set(ops) - set(TEMPLATES), "a non-empty subset of '+-*/'"),
             ("noise", noise, 0 <= noise <= 1, "between 0 and 1"),
             ("noise", noise, noise == 0 or steps >= 2, f"0 with steps={steps} (stopping one step early needs "
                                                         f"steps >= 2)"),
             ("n_train", n_train, n_train >= 1, ">= 1"), ("n_val", n_val, n_val >= 1, ">= 1"),
             ("n_test", n_test, n_test >= 1, ">= 1")]
    for name, value, ok, allowed in rules:
        if not ok:
            raise UserError(f"bad task knob {name}={value!r}: must be {allowed}")


def prepare(steps=2, max_operand=20, ops="+-", noise=0.0, n_train=20000, n_val=500, n_test=500,
            num_merges=150, seed=1337, verbose=True, root=ROOT, min_steps=0):
    """Build the data set for these knobs if it is missing or damaged; return its directory.

    min_steps: if set (1 <= min_steps < steps), each problem has between min_steps and steps
    operations, drawn uniformly, in every split; 0 = exactly `steps`.
    noise: fraction of TRAINING solutions that stop one step early (stop_early) while their
    `answer` field stays correct. A base model trained on them has both habits; a correctness
    reward can teach it to finish. Validation and test solutions are always clean."""
    check_knobs(steps, max_operand, ops, noise, n_train, n_val, n_test, min_steps)
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
        os.remove(meta_path)  # until the rebuild is complete, the directory is marked incomplete
    if verbose:
        print(f"preparing task data in {data_dir} ...")
    rng = random.Random(seed)
    n_total = n_train + n_val + n_test
    examples = distinct_problems(n_total, lambda: make_problem(  # unique questions: the splits share none
        rng, rng.randint(min_steps, steps) if min_steps else steps, max_operand, ops))  # no extra draw by default
    if len(examples) < n_total:
        raise UserError(f"only {len(examples)} distinct problems for these knobs; "
                        f"lower n_train or raise max_operand/steps")
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
