"""
GSM8K (grade-school math word problems) as task data, from the official files you download once:

    wget https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/train.jsonl -O data/gsm8k/train.jsonl
    wget https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/test.jsonl -O data/gsm8k/test.jsonl
    python data/gsm8k/prepare.py                   # -> data/gsm8k/prepared
    python data/gsm8k/prepare.py --n_val=200 --seed=1

Nothing is downloaded here. An official line is {"question": ..., "answer": "...reasoning...\\n#### 72"};
this writes <out>/{train,val,test}.jsonl (read by data/datadir.py's load_split) and
meta.json, written last to mark a complete directory. A row of ours:
    question: the problem, a newline, INSTRUCTION (the whole user message the model sees)
    solution: the official reasoning without the calculator annotations ("48/2 = <<48/2=24>>24"
              becomes "48/2 = 24"), then a last line "#### 72": what the format reward wants
              (no commas, no decimals), for base training and TracIn's 'nll' validation loss
    answer:   the final answer as an int ("1,234" -> 1234, "-3" -> -3, "72.0" -> 72), read as the GSM8K
              reward reads a completion's: "1,2,3" or a 101-digit number is an error naming the line

Splits: val is n_val problems drawn from the official train file (seeded shuffle); train is the rest;
test is the official test file. No question is in two splits: an exact duplicate (same text up to
whitespace) is kept once, and a test question also in train is dropped from test, each with a count.
A final answer that is not a whole number ("2.5") cannot be scored as an int, and an empty question
asks nothing: such a row is skipped, counted in meta.json and printed (not an error: the official files
have none, so one means an edited file, and the rest of it is still good data; a file that is not GSM8K
fails on its first line anyway). --out is never a folder this script did not make (data/datadir.py).

Running it again returns the directory untouched when meta.json says it was built from the same
knobs and the same source files (their sha256); a damaged or stale directory is built again.
"""
import hashlib
import json
import os
import random
import re
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(ROOT))
if REPO not in sys.path:  # run as a script: configurator.py is at the repository root
    sys.path.append(REPO)
from configurator import UserError, cli_main, configure, quiet_start  # noqa: E402
quiet_start(__name__)  # run as a script: a Ctrl-C while starting is one line
from data.datadir import MAX_ROWS, check_out, check_task_dir, knob_error  # noqa: E402
from data.datadir import write_task_dir  # noqa: E402
from data.gsm8k.names import DEFAULTS, data_dir_for  # noqa: E402

INSTRUCTION = "Solve it step by step. Then write the final answer on a last line as '#### N' (N a whole number)."
URL = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/{}.jsonl"
ANNOTATION = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator calls, "<<48/2=24>>"
# the final answer after "####" as the GSM8K reward reads it (rewards.extract_answer): a sign, ASCII digits
# with well-grouped thousands commas or none ("1,234", never "1,2,3", which is not 123), an optional decimal part
NUMBER = re.compile(r"([+-]?)([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.([0-9]+))?")
MAX_DIGITS = 100  # far above any count or amount; a longer answer is a garbled file (and beyond int() limits)


def fetch_hint(path, role):
    """What to do about a bad source file: where the official one is and the command that gets it."""
    return (f"download it from https://github.com/openai/grade-school-math, e.g. "
            f"`wget {URL.format(role)} -O {path}`")


def parse_answer(text):
    """(reasoning, final answer as int or None if not a whole number) of an official answer text;
    ValueError (what is wrong) if it has no '#### N' line."""
    marker = text.rfind("####")
    if marker < 0:
        raise ValueError("its answer does not end in a line '#### N' (a truncated or different file?)")
    final = text[marker + 4:].strip()
    m = NUMBER.fullmatch(final)
    if m is None:
        shown = repr(final[:40]) + ("..." if len(final) > 40 else "")
        raise ValueError(f"its final answer {shown} is not a number: the last line must be '#### N' "
                         f"('#### 72', '#### 1,234')")
    sign, digits, frac = m.groups()
    if len(digits.replace(",", "")) > MAX_DIGITS:
        raise ValueError(f"its final answer has {len(digits.replace(',', ''))} digits (at most {MAX_DIGITS}: a "
                         f"garbled file?)")
    if frac is not None and frac.strip("0"):
        return text[:marker], None
    value = int(digits.replace(",", ""))
    return text[:marker], -value if sign == "-" else value


def read_gsm8k(path, role):
    """(rows, skipped, empty) of an official GSM8K file: rows [{"question", "solution", "answer"}], skipped
    the line numbers whose final answer is not a whole number, empty those whose question is blank. A
    one-line UserError naming the file (and the line) if it is missing, empty or not GSM8K."""
    def bad(why, n=None):
        where = f"{path}, line {n}" if n else path
        return UserError(f"{where}: {why}; {fetch_hint(path, role)}")
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError as e:
        raise bad(e.strerror or e) from None
    rows, skipped, empty = [], [], []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue  # the newline at the end of the file
        try:
            obj = json.loads(raw.decode("utf-8-sig"))  # -sig: a byte-order mark some editors write is no error
        except (ValueError, RecursionError) as e:  # also a UnicodeDecodeError; nesting too deep
            why = f"{e.msg}, column {e.colno}" if isinstance(e, json.JSONDecodeError) else \
                "nested too deep" if isinstance(e, RecursionError) else e
            raise bad(f"not a line of JSON ({why}; a truncated download?)", n) from None
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in ("question", "answer")):
            raise bad("not a GSM8K problem (a JSON object with text fields 'question' and 'answer')", n)
        try:
            reasoning, answer = parse_answer(obj["answer"])
        except ValueError as e:
            raise bad(e, n) from None
        if answer is None:
            skipped.append(n)
            continue
        if not obj["question"].strip():  # nothing to ask: no prompt, no lesson
            empty.append(n)
            continue
        reasoning = ANNOTATION.sub("", reasoning).strip()
        rows.append({"question": obj["question"].strip(), "answer": answer,
                     "solution": f"{reasoning}\n#### {answer}" if reasoning else f"#### {answer}"})
    if not rows:
        raise bad("no problem with a question and a whole-number answer in it" if skipped or empty
                  else "empty: no problem in it")
    return rows, skipped, empty


def key(question):
    """What makes two questions the same: their text up to whitespace."""
    return " ".join(question.split())


def dedupe(rows, exclude=()):
    """rows without repeats (the first copy stays) and without questions in `exclude`; file order kept."""
    seen, out = set(exclude), []
    for r in rows:
        if key(r["question"]) not in seen:
            seen.add(key(r["question"]))
            out.append(r)
    return out


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def prepare(train_file=DEFAULTS["train_file"], test_file=DEFAULTS["test_file"], n_val=500, seed=1337,
            out=None, verbose=True):
    """Build GSM8K task data from the official train and test files if it is missing, damaged or stale;
    return its directory (out, or data_dir_for(n_val, seed))."""
    if not isinstance(n_val, int) or isinstance(n_val, bool) or n_val < 1:
        raise UserError(f"bad task knob n_val={n_val!r}: must be an int >= 1")
    if n_val > MAX_ROWS:  # before the files are read: GSM8K's train file has 7473 problems
        raise knob_error("n_val", n_val, f"at most {MAX_ROWS}, the rows a data directory may hold "
                                         f"(and below the problems of the train file)")
    out = str(out) if out else data_dir_for(n_val, seed)
    check_out(out, "gsm8k")  # never a directory someone else made (the official files' own included)
    for source in (train_file, test_file):
        if os.path.realpath(os.path.dirname(os.path.abspath(source))) == os.path.realpath(out):
            raise UserError(f"out {out} holds the source file {source}, which the splits would overwrite: "
                            f"give another --out")
    (train_rows, train_skipped, train_empty), (test_rows, test_skipped, test_empty) = read_gsm8k(
        train_file, "train"), read_gsm8k(test_file, "test")  # read on every call: a stale directory is rebuilt
    knobs = {"n_val": n_val, "seed": seed, "train_sha256": sha256(train_file), "test_sha256": sha256(test_file)}
    meta_path = os.path.join(out, "meta.json")
    if os.path.exists(meta_path):
        problem = check_task_dir(out, 'gsm8k', knobs)
        if problem is None:
            return out
        print(f"warning: {out} is damaged or stale ({problem}): building it again")
    if verbose:
        print(f"preparing GSM8K task data in {out} ...")
        for path, lines, why in ((train_file, train_skipped, "whose final answer is not a whole number"),
                                 (test_file, test_skipped, "whose final answer is not a whole number"),
                                 (train_file, train_empty, "with an empty question"),
                                 (test_file, test_empty, "with an empty question")):
            if lines:
                print(f"  {path}: skipped {len(lines)} problem(s) {why} "
                      f"(line {', '.join(map(str, lines[:5]))}{' ...' if len(lines) > 5 else ''})")
    train = dedupe(train_rows)
    test = dedupe(test_rows, exclude={key(r["question"]) for r in train})
    if not test:
        raise UserError(f"{test_file}: every problem in it is also in {train_file}; give the official test file")
    if n_val >= len(train):
        raise UserError(f"bad task knob n_val={n_val}: must be below the {len(train)} distinct problems of "
                        f"{train_file} (val is carved out of them)")
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    in_val = set(order[:n_val])
    splits = {"train": [r for i, r in enumerate(train) if i not in in_val],  # both in file order
              "val": [r for i, r in enumerate(train) if i in in_val], "test": test}
    for rows in splits.values():
        for r in rows:
            r["question"] = f"{r['question']}\n{INSTRUCTION}"
    meta = {"task": "gsm8k", "sizes": {k: len(v) for k, v in splits.items()}, **knobs,
            "dropped": {"train_duplicates": len(train_rows) - len(train),
                        "test_duplicates_or_in_train": len(test_rows) - len(test),
                        "train_not_whole": len(train_skipped), "test_not_whole": len(test_skipped),
                        **{f"{k}_empty_question": len(v) for k, v in (("train", train_empty), ("test", test_empty))
                           if v}},  # (only where there were: the official files have none)
            "instruction": INSTRUCTION}
    write_task_dir(out, "gsm8k", {k: [{f: r[f] for f in ("question", "solution", "answer")} for r in rows]
                                  for k, rows in splits.items()}, meta)
    if verbose:
        print(f"  {meta['sizes']} problems; dropped {meta['dropped']}")
    return out


def main(argv):
    print(prepare(**configure(DEFAULTS, argv)))


if __name__ == "__main__":
    cli_main(main)
