"""
Which task a data directory holds, and which directories a prepare.py may write.

Each prepare.py writes TASK_FILE (.task: the task's name) into its directory before any split, so a
directory records its task from its first file on:
    check_out(out, task)         prepare's output: new, empty or this task's own; anything else refused
    mark(out, task)              then: the directory is this task's (before the splits are written)
    write_task_dir(out, task, splits, meta, files)   the whole write: mark, splits, files, meta.json last
    check_task_data(d, task)     a run's data must be its task's: one line naming both otherwise

Every file that tells is heard, so data prepared before .task existed still reads (meta.json's 'task', or
gsm_synth's meta.json for arith), a directory made by hand (no meta.json) is judged by its answers (a
Countdown answer is [numbers, target], a gsm8k or arith answer a number: either task may use it), and one
whose files disagree (another task's splits copied over it) is refused.
"""
import json
import os

from configurator import UserError

TASK_FILE = ".task"
TASKS = ("arith", "gsm8k", "countdown")
PREPARE = {"arith": "data/gsm_synth/prepare.py", "gsm8k": "data/gsm8k/prepare.py",
           "countdown": "data/countdown/prepare.py"}


def _read(d, name, read):
    try:
        with open(os.path.join(d, name), errors="replace") as f:
            return read(f)
    except (OSError, ValueError):
        return None


def evidence(d):
    """[(file, tasks it allows)] for what d's files say: .task its task; meta.json its 'task' (gsm8k,
    countdown), or arith for gsm_synth's (a vocab_size, no task); the first training row's answer:
    a list [numbers, target] Countdown, a number gsm8k or arith."""
    said = []
    task = _read(d, TASK_FILE, lambda f: f.read().strip())
    if task is not None:
        said.append((TASK_FILE, (task,)))
    meta = _read(d, "meta.json", json.load)
    if isinstance(meta, dict) and (meta.get("task") in TASKS or isinstance(meta.get("vocab_size"), int)):
        said.append(("meta.json", (meta.get("task") or "arith",)))
    row = _read(d, "train.jsonl", lambda f: json.loads(f.readline()))
    answer = row.get("answer") if isinstance(row, dict) else None
    if isinstance(answer, list):
        said.append(("train.jsonl", ("countdown",)))
    elif isinstance(answer, int) and not isinstance(answer, bool):
        said.append(("train.jsonl", ("arith", "gsm8k")))
    return said


def marked_task(d):
    """The task a prepare.py recorded in d (.task, or an older meta.json), or None if none did."""
    for name, tasks in evidence(d):
        if name != "train.jsonl":
            return tasks[0] if tasks[0] in TASKS else None
    return None


def check_task_data(d, task):
    """A run's data directory must hold its task's data, by every file that says (a missing directory is
    named, with the command that builds it, when its files are read)."""
    if not d or not os.path.isdir(d):
        return
    said = evidence(d)
    agreed = sorted(set.intersection(set(TASKS), *(set(tasks) for _, tasks in said)))
    if task in agreed:
        return
    if not agreed:  # the files disagree: another task's files copied over some of them
        how = ", ".join(f"{name}: {' or '.join(tasks)}" for name, tasks in said)
        raise UserError(f"data_dir {d} holds files of different tasks ({how}): build it again with "
                        f"python {PREPARE[task]}, or give another data_dir")
    raise UserError(f"data_dir {d} holds {' or '.join(agreed)} data, not {task}'s: give --task={agreed[0]}, or a "
                    f"{task} data directory (python {PREPARE[task]} makes one)")


def check_out(out, task, key="out", fix="give another --out"):
    """Before any work: out may be written by task's prepare.py (new, empty, or its own); returns whether it
    is its own already. Another task's directory, a file or a directory someone else filled: refused."""
    from runs.rundir import check_output_dir
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
        with open(path, "w") as f:
            f.write(task + "\n")


def write_atomic(path, text):
    """Write via a temporary file and a rename: an interrupted write never leaves a half file under path."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_task_dir(out, task, splits, meta, files=None):
    """Write a task's data directory: its mark, each split as <split>.jsonl (one JSON row a line), the other
    files ({name: text}, e.g. tokenizer.json), then meta.json LAST: a directory holding it is complete."""
    mark(out, task)
    for split, rows in splits.items():
        write_atomic(os.path.join(out, f"{split}.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    for name, text in (files or {}).items():
        write_atomic(os.path.join(out, name), text)
    write_atomic(os.path.join(out, "meta.json"), json.dumps(meta, indent=1))
