# torchrun's ranks when the job cannot go on: --device=cuda on a machine without a GPU for each
# process ends every rank with status 2 and one line from the node's first rank (no traceback per
# rank). References: torch.cuda's counts set by hand; the rank processes started as torchrun would.
# Run: python -m pytest -q tests/test_rank_failures.py
import os
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
    try:
        for local in range(per_node):
            launch_env(monkeypatch, local, per_node)
            assert distributed.setup("cuda")[2] == f"cuda:{local}"
    finally:
        distributed._state.update(rank=0, world_size=1)
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
