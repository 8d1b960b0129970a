"""
Countdown for a GPT trained from scratch: problems drawn as data/countdown/prepare.py draws them (its
question's first sentence, the same [numbers, target] answer, so the same countdown reward scores them), reference solutions
that show a search (solutions.py), and a tokenizer built here from them, as data/gsm_synth builds
arith's: bytes, a small BPE trained on the training split, digits one token each, <|endoftext|>.

    python data/countdown/searched.py --n_numbers=3 --max_number=12 --max_target=100

writes data/countdown/search_n{n_numbers}_m{max_number}_x{max_target}_s{max_misses}[...]/ with
{train,val,test}.jsonl, tokenizer.json and meta.json (written last: it marks a complete directory),
read by data/gsm_synth's load_split / load_tokenizer. train_base.py (task='countdown') calls prepare()
itself. Deterministic: random.Random(seed), no timestamps; a damaged directory is built again.
No two problems share a multiset of numbers and a target; test is drawn first, then val, then train.
"""
import os
import random
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(ROOT))
if REPO not in sys.path:  # run as a script: configurator.py is at the repository root
    sys.path.append(REPO)
from configurator import UserError, cli_main, configure  # noqa: E402
from data.countdown.prepare import MAX_TARGET, TEMPLATE, draw_distinct  # noqa: E402
from data.datadir import check_out, write_task_dir  # noqa: E402
from data.countdown.solutions import searched_solution  # noqa: E402
from data.gsm_synth.prepare import (build_encoding, check_data_dir, prompt_text, tokenizer_json,  # noqa: E402
                                    train_bpe)

DEFAULTS = dict(n_numbers=3, max_number=12, max_target=100, max_misses=3, n_train=20000, n_val=500, n_test=500,
                num_merges=300, seed=1337, variants=1)
# the question's first sentence: the rest of TEMPLATE is the same for every problem, an instruction that
# a model trained from scratch learns from the examples instead (and 60 tokens less per sequence)
QUESTION = TEMPLATE.split(" You can")[0]
NAME_KNOBS = (("n_train", "t"), ("n_val", "v"), ("n_test", "e"), ("num_merges", "b"), ("seed", "r"), ("variants", "k"))


def data_dir_for(n_numbers=3, max_number=12, max_target=100, max_misses=3, **extra):
    """One directory per set of knobs; the split sizes, merges and seed are in the name when not the default."""
    name = f"search_n{n_numbers}_m{max_number}_x{max_target}_s{max_misses}"
    name += "".join(f"_{letter}{extra[k]}" for k, letter in NAME_KNOBS if extra.get(k, DEFAULTS[k]) != DEFAULTS[k])
    return os.path.join(ROOT, name)


def rebuild_command(data_dir):
    """The command that builds data_dir again, from the knobs its name records (data_dir_for's inverse)."""
    import re
    import shlex
    m = re.fullmatch(r"search_n(\d+)_m(\d+)_x(\d+)_s(\d+)((?:_[tvebrk]\d+)*)", os.path.basename(os.path.normpath(data_dir)))
    if not m:
        return "python data/countdown/searched.py with the knobs of the base that was trained on it"
    knobs = dict(zip(("n_numbers", "max_number", "max_target", "max_misses"), map(int, m.groups()[:4])))
    knobs.update({dict((b, a) for a, b in NAME_KNOBS)[x[0]]: int(x[1:]) for x in m[5].split("_")[1:]})
    where = "" if os.path.abspath(data_dir) == data_dir_for(**knobs) else f" (it writes {data_dir_for(**knobs)}: move it to {data_dir})"
    return " ".join(["python data/countdown/searched.py"] + [shlex.quote(f"--{k}={v}") for k, v in knobs.items()]) + where


def check_knobs(n_numbers, max_number, max_target, max_misses, n_train, n_val, n_test, num_merges, variants=1):
    """A one-line UserError naming the first knob out of range, its value and what is allowed."""
    rules = [("n_numbers", n_numbers, 2 <= n_numbers <= 4, "in [2, 4] (a try lists every step: more is too long)"),
             ("max_number", max_number, 1 <= max_number <= 99, "in [1, 99]"),
             ("max_target", max_target, 1 <= max_target <= MAX_TARGET, f"in [1, {MAX_TARGET}]"),
             ("max_misses", max_misses, max_misses >= 0, ">= 0"), ("n_train", n_train, n_train >= 1, ">= 1"),
             ("n_val", n_val, n_val >= 1, ">= 1"), ("n_test", n_test, n_test >= 1, ">= 1"),
             ("num_merges", num_merges, num_merges >= 0, ">= 0"), ("variants", variants, variants >= 1, ">= 1")]
    for name, value, ok, allowed in rules:
        if not ok:
            raise UserError(f"bad task knob {name}={value!r}: must be {allowed}")


def prepare(n_numbers=3, max_number=12, max_target=100, max_misses=3, n_train=20000, n_val=500, n_test=500,
            num_merges=300, seed=1337, variants=1, verbose=True):
    """Build the data and tokenizer for these knobs if missing or damaged; return the directory.
    variants: each training problem is written this many times, each with its own searched solution
    (other misses, possibly another hit): a base learns to search and compute rather than recall one trace."""
    check_knobs(n_numbers, max_number, max_target, max_misses, n_train, n_val, n_test, num_merges, variants)
    out = data_dir_for(n_numbers, max_number, max_target, max_misses, n_train=n_train, n_val=n_val, n_test=n_test,
                       num_merges=num_merges, seed=seed, variants=variants)
    check_out(out, "countdown", "data directory", "remove it or change a knob")  # never someone else's directory
    meta_path = os.path.join(out, "meta.json")
    if os.path.exists(meta_path):
        problem = check_data_dir(out)
        if problem is None:
            return out
        print(f"warning: {out} is damaged ({problem}): building it again")
        os.remove(meta_path)  # until the rebuild is complete, the directory is marked incomplete
    if verbose:
        print(f"preparing Countdown data with searched solutions in {out} ...")
    n_total = n_train + n_val + n_test
    problems = [(numbers, target) for numbers, target, _, _ in
                draw_distinct(random.Random(seed), n_total, n_numbers, n_numbers, max_number, max_target)]
    if len(problems) < n_total:
        raise UserError(f"bad task knob n_train={n_train}: only {len(problems)} distinct problems with "
                        f"n_numbers={n_numbers}, max_number={max_number}, max_target={max_target}, not "
                        f"n_train + n_val + n_test = {n_total}; lower them or raise max_number or max_target")
    def rows(part, seeds):
        return [{"question": QUESTION.format(numbers=numbers, target=target),
                 "solution": searched_solution(numbers, target, max_misses, s)[0],
                 "answer": [numbers, target]} for numbers, target in part for s in seeds]
    splits = {"test": rows(problems[:n_test], [seed]), "val": rows(problems[n_test:n_test + n_val], [seed]),
              "train": rows(problems[n_test + n_val:], range(seed, seed + variants))}
    merges = train_bpe([prompt_text(r["question"]) + r["solution"] for r in splits["train"][:5000]], num_merges)
    enc = build_encoding(merges, "countdown")
    meta = {"task": "countdown", "n_numbers": n_numbers, "max_number": max_number, "max_target": max_target,
            "max_misses": max_misses, "num_merges": num_merges, "seed": seed, "variants": variants, "vocab_size": enc.n_vocab,
            "eot_token": enc.eot_token, "sizes": {k: len(v) for k, v in splits.items()}}
    write_task_dir(out, "countdown", splits, meta, {"tokenizer.json": tokenizer_json("countdown", merges)})
    if verbose:
        print(f"  {meta['sizes']} problems, vocab {enc.n_vocab} tokens")
    return out


def main(argv):
    print(prepare(**configure(DEFAULTS, argv)))


if __name__ == "__main__":
    cli_main(main)
