# torchrun's ranks when the job cannot go on. --device=cuda on a machine without a GPU for each
# process: every rank ends with status 2, one line from the node's first rank (no traceback per
# rank). A rank killed mid-job (kill -9): the ranks left name it, rank and PID, and the training
# loops add the last checkpoint and the resume command. References: torch.cuda's counts set by
# hand; two rank processes started as torchrun would, one killing itself; a reaped process's PID.
# Run: python -m pytest -q tests/test_rank_failures.py
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from configurator import UserError
from scale import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch_env(monkeypatch, local, per_node, rank=None):
    monkeypatch.setenv("RANK", str(local if rank is None else rank))
    monkeypatch.setenv("WORLD_SIZE", str(per_node))
    monkeypatch.setenv("LOCAL_RANK", str(local))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))


@pytest.mark.parametrize("gpus, per_node, said", [
    (0, 2, "torch.cuda.is_available\\(\\) is False"), (0, 1, "is False"),
    (2, 4, "4 processes on this machine, one GPU each, but it has 2; start at most "
           "--nproc_per_node=2"),
    (1, 2, "at most --nproc_per_node=1")])
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_too_few_gpus_under_torchrun_is_one_line_from_the_first_rank(monkeypatch, gpus, per_node,
                                                                     said, device):
    """Before: torch.cuda.set_device's AttributeError (no CUDA build) on every rank."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    touched = []
    monkeypatch.setattr(torch.cuda, "set_device", touched.append)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: touched.append(a))
    for local in range(per_node):
        launch_env(monkeypatch, local, per_node, rank=local + per_node)  # the second node's
        if local == 0:
            with pytest.raises(UserError, match=f"device='{device}'.*{said}"):
                distributed.setup(device)
        else:
            with pytest.raises(SystemExit) as e:
                distributed.setup(device)
            assert e.value.code == 2
    assert touched == []  # nothing started: no GPU taken, no process group


@pytest.mark.parametrize("gpus, per_node", [(2, 2), (4, 2)])
def test_enough_gpus_under_torchrun_take_one_each(monkeypatch, gpus, per_node):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    taken = []
    monkeypatch.setattr(torch.cuda, "set_device", taken.append)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "all_gather_object", lambda found, mine: None)
    try:
        for local in range(per_node):
            launch_env(monkeypatch, local, per_node)
            assert distributed.setup("cuda")[2] == f"cuda:{local}"
    finally:
        distributed._state.update(rank=0, world_size=1, peers=[])
    assert taken == [f"cuda:{i}" for i in range(per_node)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA is unavailable")
def test_torchrun_ranks_given_cuda_without_a_gpu_end_in_one_line(tmp_path):
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, "train_grpo.py", "--device=cuda", f"--out_dir={tmp_path}/r"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    (_, err0), (_, err1) = (p.communicate(timeout=120) for p in procs)
    assert [p.returncode for p in procs] == [2, 2]
    assert err0.startswith("error: device='cuda' but torch.cuda.is_available() is False")
    assert len(err0.splitlines()) == 1 and err1 == ""
    assert not os.path.exists(tmp_path / "r")


PAIR = """
import os, signal, sys
sys.path.insert(0, {root!r})
import torch
from scale import distributed
distributed.setup("cpu")
if distributed.rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 of one rank, mid-job
try:
    {collective}
except RuntimeError as e:
    print(distributed.lost_peer(e))
"""


@pytest.mark.parametrize("collective", [
    "distributed.all_gather_cat(torch.ones(2, 2))", "distributed.teardown()"])
def test_a_rank_killed_mid_job_is_named_by_the_one_left(tmp_path, collective):
    """Before: gloo's 'Connection closed by peer' traceback, no rank named."""
    script = tmp_path / "pair.py"
    script.write_text(PAIR.format(root=ROOT, collective=collective))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2",
                                   "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": port})
             for r in range(2)]
    (out0, err0), _ = (p.communicate(timeout=120) for p in procs)
    # rank 0 may still be aborted by gloo's own threads as it exits (SIGABRT, "terminate called
    # without an active exception"), after it has said what happened: what is checked is that line
    assert procs[1].returncode == -9 and procs[0].returncode in (0, -signal.SIGABRT), err0
    assert "Traceback" not in err0, err0
    assert out0.startswith(f"rank 1 (PID {procs[1].pid}) ended during a step, so this job "
                           "cannot go on (") and len(out0.splitlines()) == 1


@pytest.fixture
def two_ranks(monkeypatch):
    """This process as rank 0 of two, rank 1 a process that has ended (its PID reaped)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setitem(distributed._state, "peers", [(socket.gethostname(), os.getpid()),
                                                      (socket.gethostname(), gone.pid)])
    return lambda: monkeypatch.setitem(distributed._state, "world_size", 2), gone.pid


GLOO = ("[pair.cc:553] Connection closed by peer [127.0.0.1]:5. This is typically caused by a "
        "remote worker crashing.")


def test_another_error_or_one_process_is_no_lost_rank(two_ranks):
    join, _ = two_ranks
    assert distributed.lost_peer(RuntimeError(GLOO)) is None  # one process: no peer to lose
    join()
    assert distributed.lost_peer(RuntimeError("sizes differ")) is not None  # rank 1 is gone
    distributed._state["peers"] = distributed._state["peers"][:1]
    assert distributed.lost_peer(RuntimeError("sizes differ")) is None
    assert distributed.lost_peer(ValueError(GLOO)) is None


def losing_a_rank_at(n, real, join):
    """`real`, except that its n-th call finds rank 1 gone (join: as under torchrun) and raises
    gloo's error, as a collective does."""
    calls = []

    def call(*a, **k):
        calls.append(1)
        if len(calls) < n:
            return real(*a, **k)
        join()
        raise RuntimeError(GLOO)
    return call


def test_a_grpo_run_that_loses_a_rank_says_how_to_resume(tiny_setup, tmp_path, monkeypatch,
                                                       chars_reward, two_ranks):
    import train_grpo as tg
    from test_train_grpo import run
    out = tmp_path / "r"
    join, pid = two_ranks
    monkeypatch.setattr(tg, "grpo_step", losing_a_rank_at(3, tg.grpo_step, join))
    with pytest.raises(UserError) as e:
        run(tiny_setup, out, "--max_iters=5", "--ckpt_interval=2")
    msg = str(e.value)
    # the rank that says it first (distributed.process_group), as cli_main prints it
    assert msg.startswith(f"rank 0: rank 1 (PID {pid}) ended during a step") and "\n" not in msg
    assert f"{out}/ckpt.pt (iter 2)" in msg
    assert msg.endswith(f"python train_grpo.py --out_dir={out} --init_from=resume")
    assert not (out / "run.lock").exists()


def test_a_base_run_that_loses_a_rank_says_how_to_resume(tmp_path, monkeypatch, two_ranks):
    import train_base as tb
    from test_train_base import ARGS
    out = tmp_path / "b"
    join, pid = two_ranks
    monkeypatch.setattr(tb, "evaluate", losing_a_rank_at(2, tb.evaluate, join))
    with pytest.raises(UserError) as e:
        tb.main([f"--out_dir={out}", "--max_iters=20", "--eval_interval=10", *ARGS])
    msg = str(e.value)
    # the rank that says it first (distributed.process_group), as cli_main prints it
    assert msg.startswith(f"rank 0: rank 1 (PID {pid}) ended during a step") and "\n" not in msg
    assert msg.endswith(f"python train_base.py --out_dir={out} --init_from=resume")


def test_a_rank_that_stops_answering_elsewhere_is_one_line(monkeypatch):
    monkeypatch.setitem(distributed._state, "world_size", 2)
    monkeypatch.setitem(distributed._state, "peers", [])  # on another machine: no PID to ask
    assert distributed.lost_peer(RuntimeError(GLOO)) == (
        "a rank stopped answering during a step (it ended on another machine, or is stuck), so "
        "this job cannot go on (Connection closed by peer [127.0.0.1]:5)")
