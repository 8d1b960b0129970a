"""
A task's data directory: which task it holds, how it is written, how it is read back.

Each prepare.py writes TASK_FILE (.task: the task's name) into its directory before any split, so a
directory records its task from its first file on:
    check_out(out, task)         prepare's output: new, empty or this task's own; anything else refused
    mark(out, task)              then: the directory is this task's (before the splits are written)
    write_task_dir(out, task, splits, meta, files)   the whole write: mark, splits, files, meta.json last
    check_task_data(d, task)     a run's data must be its task's: one line naming both otherwise
    load_split, load_tokenizer   what every script reads; a damaged file is named with the command
                                 that builds its directory again (rebuild_command: its prepare.py)
    data_fingerprint, bound_data what a GRPO checkpoint is bound to: its data as it was

Every file that tells is heard, so data prepared before .task existed still reads (meta.json's 'task', or
gsm_synth's meta.json for arith), a directory made by hand (no meta.json) is judged by its answers (a
Countdown answer is [numbers, target], a gsm8k or arith answer a number: either task may use it), and one
whose files disagree (another task's splits copied over it) is refused. A .task that names no known
task is damaged: never taken as a task, it is named with the way to build the directory again.
"""
import hashlib
import json
import os
import re

from configurator import UserError
from data.countdown import names as countdown_names
from data.gsm8k import names as gsm8k_names
from data.gsm_synth import names as synth_names
from data.tokenizer import build_encoding
from fileio import check_output_dir, read_json, write_atomic

TASK_FILE = ".task"
TASKS = ("arith", "gsm8k", "countdown")
PREPARE = {"arith": "data/gsm_synth/prepare.py", "gsm8k": "data/gsm8k/prepare.py",
           "countdown": "data/countdown/prepare.py"}
SPLITS = ("train", "val", "test")
FIELDS = ("question", "solution", "answer")
MAX_ROWS = 1_000_000  # rows one directory may hold: more is beyond this project's models and memory


# --- knobs: one-line errors naming the key the user typed -----------------------------------------
def knob_error(name, value, allowed, keys=None):
    """The UserError for a prepare.py knob out of range. keys: {knob: the config key a script reads
    it from} (train_base.py's countdown_max_number for max_number); else the knob's own name."""
    if keys:
        key = keys.get(name, name)
        return UserError(f"config key '{key}' = {value!r} is not allowed: must be {allowed}")
    return UserError(f"bad task knob {name}={value!r}: must be {allowed}")


def check_sizes(sizes, limit, what, keys=None):
    """Before any work: the split sizes ({knob: rows}) must add up to at most `limit`, which `what`
    says ('the 288 distinct problems these knobs allow'); the largest is named, with the most it may
    be."""
    total = sum(sizes.values())
    if total <= limit:
        return
    key = (keys or {}).get
    name = max((k for k in sizes if not keys or k in keys), key=sizes.get)  # one the user may set
    most = limit - (total - sizes[name])
    plus = " + ".join(key(k, k) for k in sizes)
    allowed = f"at most {most}" if most >= 1 else "smaller"
    raise knob_error(name, sizes[name], f"{allowed}: {plus} = {total} is more than {what}", keys)


def row_limit(bound, what):
    """(limit, what it is): the smaller of a bound on the distinct problems (what: "with KNOB=V,
    ...") and MAX_ROWS."""
    if bound < MAX_ROWS:
        return bound, f"the at most {bound} distinct problems {what}"
    return MAX_ROWS, f"the {MAX_ROWS} rows a data directory may hold"


# --- which task a directory holds -----------------------------------------------------------------
def _read(d, name, read):
    try:
        with open(os.path.join(d, name), errors="replace") as f:
            return read(f)
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return None


def _marker(d):
    """(present, task) of d's .task: task None where it names no known task (damaged)."""
    path = os.path.join(d, TASK_FILE)
    if not os.path.lexists(path):
        return False, None
    text = _read(d, TASK_FILE, lambda f: f.read(64))
    return True, (text.strip() if text is not None and text.strip() in TASKS else None)


def check_marker(d, fix):
    """A .task that is there but names no known task (cut, garbled, a directory) is damaged: one
    line saying so, and `fix`. Nothing is concluded from it."""
    present, task = _marker(d)
    if present and task is None:
        text = _read(d, TASK_FILE, lambda f: f.read(40))
        said = f"it reads {text.strip()!r}" if text is not None else "it cannot be read"
        raise UserError(f"{os.path.join(d, TASK_FILE)} is damaged ({said}, not one of "
                        f"{', '.join(TASKS)}): {fix}")


def evidence(d):
    """[(file, tasks it allows)] for what d's files say: .task its task (a known one); meta.json its
    'task' (gsm8k, countdown), or arith for gsm_synth's (a vocab_size, no task); the first training
    row's answer: a list [numbers, target] Countdown, a number gsm8k or arith."""
    said = []
    task = _marker(d)[1]
    if task is not None:
        said.append((TASK_FILE, (task,)))
    meta = _read(d, "meta.json", json.load)
    if isinstance(meta, dict) and (meta.get("task") in TASKS or isinstance(meta.get("vocab_size"), int)):
        said.append(("meta.json", (meta.get("task") or "arith",)))
    for split in SPLITS:  # each split's: a test.jsonl of another task copied in is seen
        row = _read(d, f"{split}.jsonl", lambda f: json.loads(f.readline()))
        form = answer_form(row.get("answer")) if isinstance(row, dict) else None
        if form:
            said.append((f"{split}.jsonl", ANSWER_TASKS[form]))
    return said


ANSWER_TASKS = {"number": ("arith", "gsm8k"), "countdown": ("countdown",)}


def answer_form(answer):
    """'number' (arith, gsm8k: a whole number), 'countdown' ([numbers, target], whole numbers) or
    None (neither: no task of this project scores it)."""
    whole = lambda x: type(x) is int  # noqa: E731 (not a bool, not a float)
    if whole(answer):
        return "number"
    if isinstance(answer, list) and len(answer) == 2 and isinstance(answer[0], list) \
            and answer[0] and all(map(whole, answer[0])) and whole(answer[1]):
        return "countdown"
    return None


def marked_task(d):
    """The task a prepare.py recorded in d (.task, or an older meta.json), or None if none did."""
    for name, tasks in evidence(d):
        if not name.endswith(".jsonl"):
            return tasks[0]
    return None


def check_task_data(d, task, resuming=False, base=""):
    """A run's data directory must hold its task's data, by every file that says (a missing directory is
    named, with the command that builds it, when its files are read). resuming: the run cannot change
    its task, so the fix is the data, not --task. base: the train_base.py checkpoint whose own data d
    is: neither another task nor another directory would do, only d built again."""
    if not d or not os.path.isdir(d):
        return
    check_marker(d, f"remove {d} and build it again with: {rebuild_command(d)}")
    said = evidence(d)
    agreed = sorted(set.intersection(set(TASKS), *(set(tasks) for _, tasks in said)))
    if task in agreed:
        return
    # prepare.py builds no directory another task's files claim: it is removed first
    again = f"remove {d} and build it again with: {task_builder(d, task)}"
    how = ", ".join(f"{name}: {' or '.join(tasks)}" for name, tasks in said)
    holds = f"{' or '.join(agreed)} data" if agreed else f"files of different tasks ({how})"
    if base:
        raise UserError(f"data_dir {d} holds {holds}, not the {task} data the base {base} was "
                        f"trained on: {again}")
    if not agreed:  # the files disagree: another task's files copied over some of them
        raise UserError(f"data_dir {d} holds {holds}: {again}, or give another data_dir")
    if resuming:
        raise UserError(f"data_dir {d} holds {' or '.join(agreed)} data, not the {task} data the run "
                        f"was trained on (replaced since?): {again}, or train a new run with another "
                        "--out_dir")
    raise UserError(f"data_dir {d} holds {' or '.join(agreed)} data, not {task}'s: give --task={agreed[0]}, or a "
                    f"{task} data directory (python {PREPARE[task]} makes one)")


def task_builder(d, task):
    """The command that builds `task`'s data in d: with the knobs d's name records where it is named as
    that task's are (a Countdown base's search_* directory is data/countdown/searched.py's, not
    prepare.py's), else the task's prepare.py."""
    names = {"arith": synth_names, "countdown": countdown_names}.get(task)
    if task == "countdown" and countdown_names.is_searched(d) or \
            task == "arith" and synth_names.knobs_from_name(d):
        return names.rebuild_command(d)  # (from the name alone: meta.json may be another task's)
    return f"python {PREPARE[task]}"


# --- writing --------------------------------------------------------------------------------------
def check_out(out, task, key="out", fix="give another --out"):
    """Before any work: out may be written by task's prepare.py (new, empty, or its own); returns whether it
    is its own already. Another task's directory, a file or a directory someone else filled: refused."""
    if os.path.isdir(out):
        check_marker(out, f"remove {out} and run this again to build it anew, or {fix}")
    other = marked_task(out) if os.path.isdir(out) else None
    if other == task:
        return True  # its own (through a symbolic link too): checked, and rebuilt if stale, by prepare.py
    if other:
        raise UserError(f"{key} {out} holds {other} data (made by {PREPARE[other]}), which a run may use: it is "
                        f"not replaced by {task} data; {fix}")
    return check_output_dir(out, key, lambda d: False)


def mark(out, task):
    """Create out if needed and record its task there, before any split is written (so a directory cut
    off half-way is still known as this task's own, and built again next time)."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, TASK_FILE)
    if not os.path.exists(path):
        write_atomic(path, task + "\n")


def write_task_dir(out, task, splits, meta, files=None):
    """Write a task's data directory: its mark, each split as <split>.jsonl (one JSON row a line), the other
    files ({name: text}, e.g. tokenizer.json), then meta.json LAST: a directory holding it is complete.
    A stale meta.json goes first, only now: a build refused before writing leaves the directory whole."""
    mark(out, task)
    if os.path.lexists(os.path.join(out, "meta.json")):
        os.remove(os.path.join(out, "meta.json"))  # until the rebuild is complete, it is incomplete
    for split, rows in splits.items():
        write_atomic(os.path.join(out, f"{split}.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    for name, text in (files or {}).items():
        write_atomic(os.path.join(out, name), text)
    write_atomic(os.path.join(out, "meta.json"), json.dumps(meta, indent=1))


# --- reading: what every script reads from a task's directory -------------------------------------
def read_tokenizer(path):
    """The tiktoken.Encoding in a tokenizer.json; OSError or ValueError if it is missing or damaged."""
    tok = read_json(path)
    try:
        return build_encoding([bytes.fromhex(h) for h in tok["merges"]], tok["name"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a tokenizer ({type(e).__name__}: {e})") from None


def read_split(path):
    """The problems in a split file; OSError or ValueError (naming the line) if it is missing or damaged:
    each a question and a solution (text) and an answer of one form for the whole split (answer_form)."""
    rows, forms = [], set()
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                row = None
            if not isinstance(row, dict) or not all(k in row for k in FIELDS) \
                    or not (isinstance(row["question"], str) and isinstance(row["solution"], str)):
                raise ValueError(f"line {n} is not a problem (a JSON object with {', '.join(FIELDS)}, "
                                 "the first two text)")
            forms.add(answer_form(row["answer"]))
            if None in forms or len(forms) > 1:
                raise ValueError(f"line {n}'s answer {json.dumps(row['answer'])[:40]} is not "
                                 + ("a whole number, nor [numbers, target]" if None in forms else
                                    "of the form of the lines above (another task's problem)"))
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
    """For directories without a tokenizer (data/gsm8k, data/countdown): None if data_dir is
    complete and was built for `task` from `knobs` (meta.json says so, every split has the size it
    promises), else what is wrong or different."""
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


def directory_task(data_dir, meta):
    """Which prepare.py made data_dir, for the command that builds it again: its .task, meta.json,
    its name as that prepare.py spells it, or its folder (data/gsm_synth, data/gsm8k,
    data/countdown)."""
    task = _marker(data_dir)[1] if os.path.isdir(data_dir) else None
    if task is None and isinstance(meta, dict):
        said = meta.get("task")
        task = said if said in TASKS else "arith" if "vocab_size" in meta else None
    name = os.path.basename(os.path.normpath(data_dir))
    if task is None:
        task = ("countdown" if re.fullmatch(r"search_n\d.*|n\d+-\d+_m\d+.*", name) else
                "gsm8k" if re.fullmatch(r"prepared(_v\d+)?(_r\d+)?", name) else
                "arith" if synth_names.knobs_from_name(data_dir) else None)
    if task is None:
        folder = os.path.basename(os.path.dirname(os.path.abspath(data_dir)))
        task = {"gsm_synth": "arith", "gsm8k": "gsm8k", "countdown": "countdown"}.get(folder)
    return task


def rebuild_command(data_dir):
    """The command line that builds data_dir again, byte for byte, with its task's own prepare.py:
    its knobs from meta.json, or from its name when meta.json cannot be read."""
    try:
        meta = read_json(os.path.join(data_dir, "meta.json"))
    except (OSError, ValueError):
        meta = None
    task = directory_task(data_dir, meta)
    if task is None:
        return (f"the prepare.py of its task ({', '.join(PREPARE.values())}, or "
                f"data/countdown/searched.py) with the knobs that made it")
    names = {"arith": synth_names, "gsm8k": gsm8k_names, "countdown": countdown_names}[task]
    return names.rebuild_command(data_dir, meta)


def damaged(path, e):
    """The UserError for a missing or unreadable data file: what is wrong, and how to build it again."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else e
    command = rebuild_command(os.path.dirname(path))
    return UserError(f"{path}: {why}; build the task data again with: {command}")


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


# --- what a GRPO checkpoint is bound to -----------------------------------------------------------
def data_fingerprint(data_dir):
    """What a model or an adapter is bound to besides its weights: a short sha256 of each split's bytes
    and of the tokenizer.json (where the directory has one: what its token ids mean), as they are now.
    train_base.py and train_grpo.py record it in their checkpoints and check it on resume."""
    out = {}
    for name in list(SPLITS) + ["tokenizer"]:
        path = os.path.join(data_dir, f"{name}.json" if name == "tokenizer" else f"{name}.jsonl")
        if name == "tokenizer" and not os.path.exists(path):
            continue
        try:
            with open(path, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()[:16]
        except OSError as e:
            raise damaged(path, e) from None
    return out


def changed_data(saved, now):
    """The parts of a directory that differ from a checkpoint's record of them ('train split',
    'tokenizer', ...); none when the checkpoint has no record (written before it existed)."""
    if not isinstance(saved, dict):
        return [] if saved is None else ["every file"]
    return [k if k == "tokenizer" else f"{k} split" for k in saved if saved[k] != now.get(k)]


def bound_data(data_dir, resume=None):
    """The fingerprint a GRPO checkpoint records of the run's data; resuming (resume: the checkpoint),
    data_dir must hold the same bytes as when that run started (a checkpoint without one is taken as
    it is)."""
    now = data_fingerprint(data_dir)
    changed = changed_data((resume or {}).get("data_fingerprint"), now)
    if changed:
        raise UserError(f"data_dir {data_dir} is not the data this run was trained on (changed: "
                        f"{', '.join(changed)}: built again from other files since): put it back, "
                        f"or start a new run in another out_dir")
    return now
