"""
The file primitives under data/, runs/ and pretrained/: writes that never leave half a file, output
directories refused before any work, JSON read in one way, a process asked whether it is alive.

    write_atomic(path, text, what)          temporary file + rename: task data, a resumed run's JSONL, results
    check_output_dir(path, key, ours)       export, data preparation: never a directory someone else made
    read_json(path)                         the JSON in a file; OSError or ValueError, one line
    pid_alive(pid)                          whether a lock's or a partial export's process still runs
"""
import json
import os
import tempfile

from configurator import UserError


def pid_alive(pid):
    """Whether process pid runs (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)  # signal 0: no signal sent, only "does this process exist?"
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by another user
    try:  # Linux: a killed process not yet reaped by its parent (a zombie) holds nothing
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def check_output_dir(path, key, ours, own_names=()):
    """Whether a command may write the directory `path` (key: its name for messages), decided before any
    work: False where it is new (or an empty directory: nothing to lose), True where it exists and
    ours(path) says this command wrote it (it may be replaced). Anything else is refused in one line: a
    file, a symbolic link, a directory someone else filled (named: first the files not in own_names,
    the names this command writes), a place that takes no new file."""
    if not path:
        raise UserError(f"{key} is empty: give a directory")
    if os.path.islink(path):
        raise UserError(f"{key} {path} is a symbolic link: it is never replaced; give another path")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{key} {path} is a file: it is never overwritten; give another path")
    if os.path.isdir(path) and os.listdir(path) and not ours(path):
        names = sorted(os.listdir(path), key=lambda n: (n in own_names, n))  # another's files first
        more = f" and {len(names) - 8} more" if len(names) > 8 else ""
        raise UserError(f"{key} {path} exists and holds files this command did not write "
                        f"({', '.join(names[:8])}{more}): nothing there is overwritten; "
                        f"give another path, or remove it")
    existing = os.path.dirname(os.path.abspath(path))  # the new directory goes beside the target, first
    while not os.path.exists(existing):                 # as a temporary one: where it will be created
        existing = os.path.dirname(existing)
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(20, "Not a directory")
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        raise UserError(f"cannot write {key} {path}: {existing} takes no new file ({e.strerror or e}); give a "
                        f"path in a writable directory") from None
    return os.path.isdir(path) and bool(os.listdir(path))


def write_atomic(path, text, what="the task data"):
    """Write via a temporary file and a rename: an interrupted write never leaves a half file under
    path. A failed write (a full disk) removes the temporary file and names path. The project's one
    text write of this kind (task data, a resumed run's JSONL, post-hoc results' JSON;
    checkpoints: runs/checkpoint.save_checkpoint)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise OSError(e.errno, f"{e.strerror or e} (writing {what})", path) from None


def read_json(path):
    """The JSON in a file; OSError if it cannot be read, ValueError (one line) if it is not JSON: not
    UTF-8, malformed, or nested so deep that Python's parser recurses out (RecursionError)."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except RecursionError:
            raise ValueError("not valid JSON (nested too deeply for Python's parser)") from None
        except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise ValueError(f"not valid JSON ({e})") from None
