# runs/rundir.run_lock and who holds a lock: this very process (its PID in a lock an earlier process
# left, e.g. PID 1 in a restarted container: stale), another user's live process (os.kill(pid, 0)
# raises PermissionError: alive, never taken over), a live process that is not a run (refused, with
# the hint that the lock may be stale: the PID, the process, and the file to remove). References:
# real processes (a `sleep`), the lock file's content read back, and the stated rule for os.kill's
# PermissionError.
# Run: python -m pytest -q tests/test_run_lock_owners.py
import os
import subprocess
import sys
import time

import pytest

from configurator import UserError
from runs import rundir


def test_a_left_lock_holding_our_own_pid_is_stale(tmp_path, capsys):
    lock = tmp_path / rundir.LOCK_NAME
    lock.write_text(f"{os.getpid()}\n")  # written by an earlier process that had our PID
    with rundir.run_lock(str(tmp_path)):
        assert lock.read_text() == f"{os.getpid()}\n"
    assert "stale lock" in capsys.readouterr().out
    assert not lock.exists()


def test_a_lock_of_another_users_live_process_is_refused(tmp_path, monkeypatch):
    pid = 4194000  # above any default pid_max: no such process, only the PermissionError says alive
    real_kill = os.kill

    def kill(p, sig):
        if p == pid:
            raise PermissionError(1, "Operation not permitted")  # exists, owned by another user
        return real_kill(p, sig)

    monkeypatch.setattr(rundir.os, "kill", kill)
    lock = tmp_path / rundir.LOCK_NAME
    lock.write_text(f"{pid}\n")
    with pytest.raises(UserError, match=f"in use by another run \\(PID {pid}\\)"):
        with rundir.run_lock(str(tmp_path)):
            pass
    assert lock.read_text() == f"{pid}\n"  # never taken over
    monkeypatch.setattr(rundir.os, "kill", real_kill)
    with rundir.run_lock(str(tmp_path)):  # really gone (ProcessLookupError): stale, taken over
        assert lock.read_text() == f"{os.getpid()}\n"


def wait_for_command(pid, words, timeout=10.0):
    """Whether /proc shows `words` as pid's command line, polled until it does (False: no /proc).
    Popen can return before /proc shows the child's exec: until then it shows the parent's command
    line, or nothing, and the hint would name no `sleep`."""
    path = f"/proc/{pid}/cmdline"
    deadline = time.monotonic() + timeout
    while os.path.exists(path):
        with open(path, "rb") as f:
            if f.read().split(b"\0")[:-1] == [w.encode() for w in words]:
                return True
        assert time.monotonic() < deadline, f"PID {pid} never showed {words} in {path}"
        time.sleep(0.01)
    return False


def test_a_live_process_that_is_not_a_run_gets_the_stale_hint(tmp_path):
    live = subprocess.Popen(["sleep", "60"])
    lock = tmp_path / rundir.LOCK_NAME
    try:
        shown = wait_for_command(live.pid, ["sleep", "60"])
        lock.write_text(f"{live.pid}\n")
        with pytest.raises(UserError) as e:
            with rundir.run_lock(str(tmp_path)):
                pass
        msg = str(e.value)
        assert "\n" not in msg and msg.count(str(live.pid)) >= 2  # the PID, and again in the hint
        assert "stale" in msg and "not a run" in msg
        assert f"remove {os.path.abspath(lock)}" in msg   # the file to remove, by its full path
        assert "sleep 60" in msg or not shown             # what that process is, where /proc says
        assert lock.read_text() == f"{live.pid}\n"        # refused: the lock is untouched
    finally:
        live.kill()
        live.wait()
