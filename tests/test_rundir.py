# Tests for runs/rundir.py (run directories), runs/checkpoint.base_fingerprint and configurator.cli_main. Run: python -m pytest tests/test_rundir.py -q
# References: real processes for the lock (a live `sleep` holds it, a finished one left it stale),
# files written by hand for the JSONL readers, and weights changed by one element for the fingerprint.
import json
import os
import subprocess
import sys

import pytest
import torch

from ctrl_c import default_ctrl_c
from runs.checkpoint import save_checkpoint, tensors_fingerprint
from runs import base, rundir
from configurator import Interrupted, UserError, cli_main


def test_lock_refuses_a_live_pid_and_takes_over_a_dead_one(tmp_path, capsys):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / rundir.LOCK_NAME).write_text(f"{live.pid}\n")
        with pytest.raises(UserError, match=f"in use by another run \\(PID {live.pid}\\)"):
            with rundir.run_lock(str(tmp_path)):
                pass
        assert (tmp_path / rundir.LOCK_NAME).read_text() == f"{live.pid}\n"   # the holder's lock is untouched
    finally:
        live.kill()
        live.wait()
    with rundir.run_lock(str(tmp_path)):  # the PID is dead now: a stale lock, taken over
        assert (tmp_path / rundir.LOCK_NAME).read_text() == f"{os.getpid()}\n"
    assert "stale lock" in capsys.readouterr().out
    assert not (tmp_path / rundir.LOCK_NAME).exists()    # released on exit


def test_lock_released_on_error_and_reentrant(tmp_path):
    with pytest.raises(RuntimeError):
        with rundir.run_lock(str(tmp_path)):
            with rundir.run_lock(str(tmp_path)):  # the same process again (train_grpo -> train_base): no-op
                pass
            assert (tmp_path / rundir.LOCK_NAME).exists()
            raise RuntimeError("boom")
    assert not (tmp_path / rundir.LOCK_NAME).exists()


def test_second_process_refused(tmp_path):
    code = ("import sys, time; sys.path.insert(0, %r); import rundir\n"
            "with rundir.run_lock(%r):\n    print('locked', flush=True); time.sleep(60)") % (
        os.path.dirname(rundir.__file__), str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=f"PID {holder.pid}"):
            with rundir.run_lock(str(tmp_path)):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_unwritable_out_dir(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="cannot write to out_dir .*file/run"):
        rundir.check_writable(str(tmp_path / "file" / "run"))   # a path under a regular file
    with pytest.raises(UserError, match="out_dir is empty"):
        rundir.check_writable("")


def test_read_jsonl_drops_a_cut_off_line(tmp_path, capsys):
    p = tmp_path / "log.jsonl"
    p.write_text('{"iter": 1}\n{"iter": 2}\nnot json\n{"iter": 3}\n{"iter": 4, "rew')
    assert [r["iter"] for r in rundir.read_jsonl(str(p))] == [1, 2, 3]
    out = capsys.readouterr().err
    assert "line 3 is not valid JSON" in out and "line 5 is not valid JSON (cut off" in out


def test_truncate_jsonl_keeps_the_resumed_steps_only(tmp_path):
    p = tmp_path / "rollouts.jsonl"
    p.write_text("".join(json.dumps({"iter": i, "x": [i] * 3}) + "\n" for i in range(6)) + '{"iter": 6, "x"')
    rundir.truncate_jsonl(str(p), 3)
    assert [json.loads(line)["iter"] for line in p.read_text().splitlines()] == [0, 1, 2, 3]
    assert not list(tmp_path.glob("*.tmp"))


def test_fingerprint_sees_one_changed_weight():
    sd = {"a.weight": torch.randn(4, 3), "b": torch.arange(5), "h": torch.randn(2).to(torch.bfloat16)}
    fp = tensors_fingerprint(sd.items())
    assert fp == tensors_fingerprint({k: v.clone() for k, v in reversed(list(sd.items()))}.items())  # order-free
    changed = {k: v.clone() for k, v in sd.items()}
    changed["a.weight"][2, 1] += 1e-3
    assert tensors_fingerprint(changed.items()) != fp
    assert tensors_fingerprint({**sd, "h": sd["h"].float()}.items()) != fp   # same values, another dtype
    with pytest.raises(UserError, match=r"another base than base.pt holds now \(changed: its weights"):
        base.check_same_base({"base_fingerprint": fp}, "run/ckpt.pt", tensors_fingerprint(changed.items()), "base.pt")
    base.check_same_base({"base_fingerprint": fp}, "run/ckpt.pt", fp, "base.pt")


@pytest.mark.parametrize("exc, code, line", [
    (UserError("bad knob"), 2, "error: bad knob"),
    (OSError(28, "No space left on device", "out/ckpt.pt"), 2, "error: out/ckpt.pt: No space left on device"),
    (OSError(28, "No space left on device"), 2, "error: No space left on device"),
    (Interrupted("train_grpo.py stopped at iter 3"), 130, "interrupted: train_grpo.py stopped at iter 3"),
    (KeyboardInterrupt(), 130, "interrupted (Ctrl-C)"),
])
def test_cli_main_one_line_and_exit_code(exc, code, line, capsys):
    def main(argv):
        raise exc
    with pytest.raises(SystemExit) as e:
        cli_main(main, [])
    assert e.value.code == code
    err = capsys.readouterr().err
    assert err.strip() == line and "Traceback" not in err


def test_lock_of_a_killed_but_unreaped_process_is_stale(tmp_path, capsys):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    for _ in range(100):  # wait until it is a zombie (killed, not yet reaped by us)
        state = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] if os.path.exists(
            f"/proc/{child.pid}/stat") else "gone"
        if state in ("Z", "gone"):
            break
        __import__("time").sleep(0.05)
    try:
        (tmp_path / rundir.LOCK_NAME).write_text(f"{child.pid}\n")
        with rundir.run_lock(str(tmp_path)):
            pass
        assert "stale lock" in capsys.readouterr().out
    finally:
        child.wait()


def test_full_disk_is_one_line_with_the_os_reason(tmp_path, monkeypatch):
    import builtins
    real_open = builtins.open

    def full_disk(path, mode="r", *a, **k):  # the checkpoint's temp file lands on a full device
        return real_open("/dev/full", mode, *a, **k) if str(path).endswith(".tmp") else real_open(path, mode, *a, **k)
    monkeypatch.setattr(builtins, "open", full_disk)
    with pytest.raises(UserError, match=f"cannot write checkpoint {tmp_path}/c.pt: No space left on device"):
        save_checkpoint({"w": torch.zeros(1000)}, str(tmp_path / "c.pt"))
    assert os.listdir(tmp_path) == []


def test_ctrl_c_at_start_up_is_one_line(tmp_path):
    """Ctrl-C while a script is still importing torch (here sent right after its first line,
    `from configurator import quiet_start; quiet_start(__name__)`): exit 130, one line, no traceback."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(rundir.__file__)))
    code = (f"import sys; sys.path.insert(0, {root!r})\n"
            "from configurator import quiet_start; quiet_start(__name__)\n"
            "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport torch\nprint('not reached')")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       preexec_fn=default_ctrl_c)
    assert p.returncode == 130 and p.stdout == "" and "Traceback" not in p.stderr
    assert p.stderr == "interrupted (Ctrl-C) while starting up: nothing was done\n"
