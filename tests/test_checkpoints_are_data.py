# Checkpoints are data, never code: a checkpoint whose unpickling would run code (here an object whose
# __reduce__ opens a file for writing, i.e. creates it) is refused by every script that loads one, from
# its command line, in one line naming the file and the object, and the code never ran (the file it
# would create does not exist). Every torch.load in the project passes weights_only=True (read here
# from the source). Run: python -m pytest -q tests/test_checkpoints_are_data.py
import ast
import os
import shutil
import subprocess
import sys

import pytest
import torch

from test_tracin_cli import grpo_dir  # noqa: F401 (fixture: a tiny finished GRPO run)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


class Plant:
    """Unpickled, it would call open(path, 'w'): a file appears where the code ran."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def plant(path, marker, like=None):
    """A checkpoint at path: `like`'s content (or a GRPO checkpoint's keys) with one Plant inside."""
    ckpt = torch.load(like, weights_only=True) if like else {"lora": {}, "iter_num": 1, "config": {}}
    torch.save({**ckpt, "config": {**ckpt.get("config", {}), "note": Plant(str(marker))}}, path)
    return str(path)


def script(*argv):
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def assert_refused(p, path, marker):
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert err[0] == (f"error: checkpoint {path} holds io.open, not only tensors and plain data: "
                      f"refused, since loading it could run code"), err  # open, as pickle names it
    assert not os.path.exists(marker)  # the planted code never ran


@pytest.mark.parametrize("argv", [
    ("train_grpo.py", "--init_from=resume", "--out_dir={run}"),
    ("train_base.py", "--init_from=resume", "--out_dir={run}"),
    ("sample.py", "--ckpt={ckpt}"),
    ("-m", "analysis.attribute", "--out_dir={run}", "--question=Mia has 2 pears. How many?"),
    ("export.py", "--ckpt={ckpt}", "--adapter_dir={tmp}/adapter"),
])
def test_a_checkpoint_that_would_run_code_is_refused_by_every_script(tmp_path, argv):
    run, marker = tmp_path / "run", tmp_path / "code_ran"
    run.mkdir()
    ckpt = plant(run / "ckpt.pt", marker)
    p = script(*(a.format(run=run, ckpt=ckpt, tmp=tmp_path) for a in argv))
    assert_refused(p, ckpt, marker)


def test_a_run_checkpoint_that_would_run_code_is_refused_by_attribution(grpo_dir, tmp_path):
    """The attribution's own checkpoints (every ckpt_*.pt of the run), not only ckpt.pt."""
    run, marker = shutil.copytree(grpo_dir, tmp_path / "run"), tmp_path / "code_ran"
    ckpt = plant(run / "ckpt_000002.pt", marker, like=run / "ckpt_000002.pt")
    p = script("-m", "analysis.attribute", f"--out_dir={run}", "--question=Mia has 2 pears. How many?",
               "--n_probe=4")
    assert_refused(p, ckpt, marker)


def test_every_torch_load_loads_weights_only():
    """Each torch.load call in the project's code (tests aside) passes weights_only=True."""
    calls = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in ("tests", "__pycache__")]
        for f in (f for f in files if f.endswith(".py")):
            tree = ast.parse(open(os.path.join(d, f)).read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.load":
                    safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True
                               for k in node.keywords)
                    calls.append((os.path.relpath(os.path.join(d, f), ROOT), node.lineno, safe))
    assert calls and all(safe for *_, safe in calls), calls
