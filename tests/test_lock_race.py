# The run lock under contention: many processes enter runs/rundir.run_lock on the same directory at the
# same instant (a barrier releases them together), on a free directory and on one holding a stale lock
# (a dead PID); in every trial exactly one must hold it. Run: python -m pytest tests/test_lock_race.py -q
# Reference: the count of holders, recorded by each holder while all the others are still trying.
# The export lock (export.claimed): a lock file its holder removed as it let go is not held.
import multiprocessing
import os
import random
import subprocess
import sys
import time

import pytest

from configurator import UserError
from runs import rundir

WORKERS, TRIALS = 6, 50


def slowed(f):
    """f after a random pause of up to 2 ms: a busy machine or a slow file system, which widens every
    window between two file operations where another process can act."""
    def slow(*a, **k):
        time.sleep(random.random() * 0.002)
        return f(*a, **k)
    return slow


def contender(dirs, start, tried):
    """Enter the lock of each trial directory together with the other workers; a holder leaves a file
    naming itself and keeps the lock until every worker has tried."""
    import builtins
    builtins.print = lambda *a, **k: None  # the stale-lock warnings of 300 entries
    random.seed(os.getpid())
    for name in ("open", "link", "remove", "rename", "replace"):  # this process only (a fork)
        setattr(os, name, slowed(getattr(os, name)))
    builtins.open = slowed(builtins.open)
    for d in dirs:
        start.wait(timeout=60)
        try:
            with rundir.run_lock(d):
                open(os.path.join(d, f"held_by_{os.getpid()}"), "w").close()
                tried.wait(timeout=60)
        except UserError:
            tried.wait(timeout=60)


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_exactly_one_holder_when_many_enter_at_once(tmp_path):
    dirs = []
    for t in range(TRIALS):
        d = tmp_path / f"trial{t}"
        d.mkdir()
        if t % 2:  # every other trial starts from a stale lock: all contenders find the same dead PID
            (d / rundir.LOCK_NAME).write_text(f"{dead_pid()}\n")
        dirs.append(str(d))
    ctx = multiprocessing.get_context("fork")
    start, tried = ctx.Barrier(WORKERS), ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=contender, args=(dirs, start, tried)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0, "a contender failed (or hung)"
    holders = {d: [n for n in os.listdir(d) if n.startswith("held_by_")] for d in dirs}
    assert {d: len(h) for d, h in holders.items()} == {d: 1 for d in dirs}
    for d in dirs:  # every lock released, no temporary file left behind
        assert sorted(os.listdir(d)) == holders[d], os.listdir(d)


def test_a_lock_never_read_empty_and_released_only_by_its_holder(tmp_path):
    """The lock file holds the PID from the moment it exists; a lock that another process holds at
    exit (ours removed by hand and retaken) is left to that process."""
    with rundir.run_lock(str(tmp_path)):
        assert (tmp_path / rundir.LOCK_NAME).read_text() == f"{os.getpid()}\n"
        assert os.listdir(tmp_path) == [rundir.LOCK_NAME]  # the file it was linked from is gone
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (tmp_path / rundir.LOCK_NAME).write_text(f"{other.pid}\n")
    try:
        assert (tmp_path / rundir.LOCK_NAME).read_text() == f"{other.pid}\n"
    finally:
        other.kill()
        other.wait()


def test_busy_message_says_what_to_do(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / rundir.LOCK_NAME).write_text(f"{live.pid}\n")
        with pytest.raises(UserError, match=f"in use by another run \\(PID {live.pid}\\); wait for the run"):
            with rundir.run_lock(str(tmp_path), busy="wait for the run to end"):
                pass
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("holders", [1, 2])
def test_an_export_lock_file_its_holder_just_removed_is_not_held(tmp_path, monkeypatch, holders):
    """Between an export opening .<name>.export.lock and locking it, the export holding it lets go
    (it removes the file, then its lock), `holders` times in a row: the lock then taken is on a
    removed file and holds nothing, so the export takes it again on the file at the path; a second
    export meanwhile is refused."""
    import fcntl
    import export
    target, lock = tmp_path / "adapter", tmp_path / ".adapter.export.lock"
    real, opened = fcntl.flock, []

    def holder_lets_go(fd, op):
        opened.append(os.fstat(fd).st_ino)
        if len(opened) <= holders:
            os.remove(lock)
        return real(fd, op)
    lock.write_text("999999\n")  # the holder's
    monkeypatch.setattr(fcntl, "flock", holder_lets_go)
    with export.claimed(str(target), "adapter_dir"):
        monkeypatch.setattr(fcntl, "flock", real)
        assert lock.read_text() == f"{os.getpid()}\n"
        assert len(opened) == holders + 1 and lock.stat().st_ino == opened[-1]
        with pytest.raises(UserError, match=f"adapter_dir {target} is taken: another export "
                                            rf"\(PID {os.getpid()}\)"):
            with export.claimed(str(target), "adapter_dir"):
                pass
    assert not lock.exists()
