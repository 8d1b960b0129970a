"""
Run directories (out_dir): one process at a time, nothing half-written, logs that survive a crash.

    with run_lock(out_dir):              # a second run in the same out_dir is refused, naming the PID
    with reader_lock(out_dir, False):    # the same, or none where a reader cannot write and need not
        ...
    rows = read_jsonl(path)              # a line cut off by a crash is dropped with a warning
    rewind(out_dir, iter_num)            # resume: drop what was written after the checkpoint
    stop_note(script, out_dir, last_ckpt)  # Ctrl-C or a full disk: the command that goes on from there
"""
import glob
import json
import os
import re
import shlex
import sys
from contextlib import contextmanager

from configurator import UserError
from fileio import pid_alive, write_atomic

LOCK_NAME = "run.lock"
MAX_ITER = 2 ** 53  # a larger iter is damage: as a float (a figure's axis) it loses its neighbours
_held = set()  # lock paths this process holds: a nested lock on the same directory is a no-op



def _command(pid):
    """' (the command line)' of a process where /proc shows it (Linux), else ''."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().decode(errors="replace").split("\0")
    except OSError:
        return ""
    text = " ".join(w for w in words if w)[:80]
    return f" ({text})" if text else ""


def check_writable(out_dir):
    """Create out_dir and prove a file can be written there, before any work that could be lost.
    Returns whether out_dir was created."""
    if not out_dir:
        raise UserError("out_dir is empty: give a directory, e.g. --out_dir=out/run1")
    created = not os.path.isdir(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f".write_test_{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise UserError(f"cannot write to out_dir {out_dir}: {e.strerror or e}") from None
    return created


@contextmanager
def _one_taker_at_a_time(folder):
    """Only one process at a time reads a lock and replaces it when stale: otherwise two processes that
    both find the same dead PID would each remove a lock (the second removing the first one's new lock)
    and both go on. flock is released by the kernel when its process dies, so this lock is never stale."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the hard link below still makes creation exclusive
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a file system without flock (some network mounts): creation alone stays exclusive
        yield
    finally:
        os.close(fd)  # releases the flock


def _lock_pid(path):
    """The PID in a lock file; -1 if it holds none (a lock is never read half-written: see run_lock)."""
    try:
        with open(path) as f:
            return int(f.read().strip() or -1)
    except (OSError, ValueError):
        return -1


@contextmanager
def run_lock(out_dir, busy="wait for it to end, or use another --out_dir"):
    """Hold out_dir/run.lock (it holds our PID) for the duration of the block.
    Held by a live process: refused at once (busy: what to do then). Left by a dead one (kill -9, power
    cut): taken over, by one process only when several try at once."""
    created = check_writable(out_dir)
    path = os.path.abspath(os.path.join(out_dir, LOCK_NAME))
    if path in _held:
        yield
        return
    # the PID is written into a file of our own first, which a hard link then puts under the lock's name:
    # creation is exclusive (link fails if the name exists) and the lock is never seen empty
    mine = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.new"
    with open(mine, "w") as f:
        f.write(f"{os.getpid()}\n")
    try:
        with _one_taker_at_a_time(os.path.dirname(path)):
            while True:
                try:
                    os.link(mine, path)
                    break
                except FileExistsError:
                    pid = _lock_pid(path)
                    if pid > 0 and pid != os.getpid() and pid_alive(pid):
                        hint = (f"if PID {pid}{_command(pid)} is not a run, the lock may be stale "
                                f"(its PID reused after a crash): remove {path}")
                        raise UserError(f"{out_dir} is in use by another run (PID {pid}); {busy}; "
                                        f"{hint}") from None
                    print(f"warning: stale lock {path} (PID {pid} is not running): taking it over")
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass
    finally:
        os.remove(mine)
    _held.add(path)
    try:
        yield
    finally:
        _held.discard(path)
        try:
            if _lock_pid(path) == os.getpid():  # never another process's lock (ours deleted by hand, then taken)
                os.remove(path)
            if created:
                os.rmdir(out_dir)  # a run refused before it wrote anything leaves no empty directory behind
        except OSError:
            pass  # not empty: the run wrote its files there


@contextmanager
def reader_lock(out_dir, writes_there):
    """run_lock(out_dir) for a command that reads a run (attribution). A run it cannot write (a
    read-only disk, another user's) is read without the lock when none of its outputs goes there
    (writes_there False); a run that may still be training is then the user's to rule out."""
    if not writes_there:
        try:
            check_writable(out_dir)
        except UserError:
            print(f"note: {out_dir} cannot be written: read without its lock (every output "
                  "goes elsewhere)", file=sys.stderr)
            yield
            return
    with run_lock(out_dir):
        yield



RUN_FILES = ("ckpt.pt", "ckpt_[0-9]*.pt", "log.jsonl", "rollouts.jsonl")  # what a train_grpo.py run writes


def run_files(out_dir):
    return [f for pattern in RUN_FILES for f in glob.glob(os.path.join(out_dir, pattern))]


def refuse_existing_run(out_dir):
    """A new run never writes into a directory that holds another run's files (nor mixes logs with it)."""
    found = run_files(out_dir)
    if found and not os.path.exists(os.path.join(out_dir, "ckpt.pt")):  # nothing a resume could start from
        raise UserError(f"{out_dir} holds the files of a run that stopped before its first checkpoint "
                        f"({', '.join(sorted(os.path.basename(f) for f in found))}): delete them, or use another "
                        f"--out_dir")
    if found:
        raise UserError(f"{out_dir} already holds a run ({os.path.basename(found[0])}): continue it with "
                        f"--init_from=resume, or start a new one with another --out_dir (or delete {out_dir})")


def unused_out_dir(path):
    """path, or path_2, path_3, ...: the first that holds no run, for a command a message suggests."""
    n, candidate = 1, path
    while run_files(candidate):
        n += 1
        candidate = f"{path}_{n}"
    return candidate


def stop_note(script, out_dir, last_ckpt, remove_files=True):
    """Where a stopped run (Ctrl-C, a full disk) goes on from: its last checkpoint and the command that
    resumes it; or, when it wrote none, the same command again, its first files removed so that the
    command is not refused (remove_files: the process that wrote them)."""
    if last_ckpt is None:
        for f in run_files(out_dir) if remove_files else ():
            os.remove(f)
        return "no checkpoint written yet: run the same command again to start over"
    return (f"last checkpoint {os.path.join(out_dir, 'ckpt.pt')} (iter {last_ckpt}); resume with: "
            f"python {script} --out_dir={shlex.quote(out_dir)} --init_from=resume")


def rewind(out_dir, iter_num):
    """Resume from the checkpoint of iter_num: what the stopped run wrote after it is dropped, so that no
    iteration is logged twice and TracIn's checkpoint history is one trajectory: the log and rollout lines
    of later iterations, and the ckpt_NNNNNN.pt of later iterations (left when ckpt.pt could not follow)."""
    for name in ("log.jsonl", "rollouts.jsonl"):
        truncate_jsonl(os.path.join(out_dir, name), iter_num)
    for path in glob.glob(os.path.join(out_dir, "ckpt_[0-9]*.pt")):
        m = re.fullmatch(r"ckpt_(\d+)\.pt", os.path.basename(path))
        if m and int(m[1]) > iter_num:
            os.remove(path)


def read_jsonl(path):
    """The dicts in a JSONL file (numbered_jsonl, without the line numbers)."""
    return [row for _, row in numbered_jsonl(path)]


def numbered_jsonl(path):
    """(line number, dict) for each line of a JSONL file. A malformed line (a crash cut the last one
    off, or a hand edit), or one nested too deep for Python's JSON reader (it recurses: a line of
    100,000 brackets would raise RecursionError), is dropped with a warning naming it, so one bad
    line never blocks a resume or a plot."""
    rows = []
    with open(path, errors="replace") as f:  # a garbled byte spoils its line only
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("not a JSON object")
            except (ValueError, RecursionError) as e:
                why = "nested too deep" if isinstance(e, RecursionError) else str(e)[:60]
                cut = "" if line.endswith("\n") else " (cut off: written during a crash?)"
                print(f"warning: {path} line {n} is not valid JSON{cut}; skipped ({why})",
                      file=sys.stderr)  # stdout may be a table (summarize > table.md)
                continue
            rows.append((n, row))
    return rows



def truncate_jsonl(path, max_iter):
    """Keep the lines with iter <= max_iter (those of the checkpoint we resume from), so resume never
    duplicates a step; rewritten atomically (temp file + rename)."""
    if not os.path.exists(path):
        return
    keep = [r for r in read_jsonl(path) if isinstance(r.get("iter"), int) and r["iter"] <= max_iter]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep), "a run's log")


def finite_or_none(obj):
    """obj with every NaN / inf float as None (JSON null): an AUC without a target is undefined, and bare
    NaN is not JSON that every reader accepts."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    return [finite_or_none(v) for v in obj] if isinstance(obj, (list, tuple)) else obj


def write_json(path, obj, replacing_note):
    """obj as indented JSON at path (undefined metrics as null); says so, and what it replaced."""
    again = os.path.exists(path)
    text = json.dumps(finite_or_none(obj), indent=1, allow_nan=False)
    write_atomic(path, text, "a JSON result")  # a full disk keeps the earlier file whole
    print(f"wrote {path}" + (f" (replacing {replacing_note})" if again else ""))


def open_logs(out_dir, main=True):
    """A GRPO run's log.jsonl and rollouts.jsonl, opened to append; under torchrun rank 0 (main)
    writes them and the other ranks write nowhere."""
    names = ("log.jsonl", "rollouts.jsonl")
    if main:
        return [open(os.path.join(out_dir, n), "a") for n in names]
    return [open(os.devnull, "w") for n in names]


def close_logs(*files):
    """Close what open_logs opened (None: not opened); a last flush that fails (a full disk, already
    said) is let go: the earlier lines were flushed."""
    for f in files:
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
