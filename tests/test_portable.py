# Run directories are portable: a checkpoint records its task data relative to the project root, so a
# second copy of the project (a clone, a copied out/) reads its OWN data, never the first copy's; older
# checkpoints with absolute paths still load; a missing data directory is built again or named.
# Run: python -m pytest tests/test_portable.py -q
#
# Independent references: two real copies of the project in a temporary directory, each script run in a
# subprocess of its own copy (so each has its own project root); the first copy's data is marked, then
# deleted, so that reading it would show or fail; a rebuilt directory compared byte for byte.
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from data import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "data/gsm_synth/s1_m5_a_n0_t300"  # the knobs below, spelled as prepare.py names them
BASE = ["--task_steps=1", "--task_max_operand=5", "--task_ops=+", "--n_train=300", "--max_iters=1", "--n_layer=1",
        "--n_embd=16", "--n_head=2", "--block_size=64", "--batch_size=4", "--eval_n=2", "--eval_interval=1",
        "--max_new_tokens=4", "--warmup_iters=0", "--dtype=float32", "--out_dir=out/base"]
GRPO = ["--base_ckpt=out/base/ckpt.pt", "--out_dir=out/grpo", "--batch_size=2", "--group_size=2",
        "--micro_batch_size=4", "--max_new_tokens=4", "--eval_n=2", "--eval_k=1", "--dtype=float32"]


def copy_project(dst):
    """The project's code (no out/, no data built yet) in dst."""
    for path in glob.glob(f"{ROOT}/**/*.py", recursive=True):  # the lecture, its folders, data/ and config/
        if os.path.relpath(path, ROOT).split(os.sep)[0] in ("tests", "out"):
            continue
        target = os.path.join(dst, os.path.relpath(path, ROOT))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy(path, target)
    return dst


def python(copy, *args, cwd=None):
    """Run a script of one copy (from that copy's directory unless cwd is given)."""
    return subprocess.run([sys.executable, *args], cwd=cwd or copy, capture_output=True, text=True, timeout=300)


def first_question(data_dir):
    with open(os.path.join(data_dir, "test.jsonl")) as f:
        return json.loads(f.readline())["question"]


def set_data_dir(ckpt_path, data_dir):
    ck = torch.load(ckpt_path, weights_only=True)
    torch.save({**ck, "data_dir": data_dir}, ckpt_path)


@pytest.fixture(scope="module")
def two_copies(tmp_path_factory):
    """Copy A trains a tiny base and one GRPO step; copy B is A copied whole (code, data, out/) after that."""
    a = copy_project(str(tmp_path_factory.mktemp("a") / "project"))
    for script, args in (("train_base.py", BASE), ("train_grpo.py", GRPO)):
        r = python(a, script, *args, "--max_iters=1")
        assert r.returncode == 0, r.stderr
    b = str(tmp_path_factory.mktemp("b") / "project")
    shutil.copytree(a, b)
    return a, b


def test_checkpoints_record_the_data_relative_to_the_project(two_copies):
    a, _ = two_copies
    assert torch.load(f"{a}/out/base/ckpt.pt", weights_only=True)["data_dir"] == DATA
    grpo = torch.load(f"{a}/out/grpo/ckpt.pt", weights_only=True)
    assert grpo["data_dir"] == DATA and grpo["config"]["data_dir"] == ""


def test_a_second_copy_reads_its_own_data(two_copies):
    """B's sample.py, even run from A's directory, reads B's test split; B's GRPO run resumes with A's data
    gone; an older checkpoint naming A's data by its absolute path reads B's."""
    a, b = two_copies
    ours = first_question(f"{b}/{DATA}")
    rows = open(f"{a}/{DATA}/test.jsonl").read().splitlines(True)
    marked = {**json.loads(rows[0]), "question": "Copy A's question. How many?"}
    open(f"{a}/{DATA}/test.jsonl", "w").write(json.dumps(marked) + "\n" + "".join(rows[1:]))
    sample = [f"{b}/sample.py", f"--ckpt={b}/out/base/ckpt.pt", "--num_questions=1", "--num_samples=1",
              "--max_new_tokens=2"]
    r = python(b, *sample, cwd=a)
    assert r.returncode == 0 and f"--- {ours}" in r.stdout and "Copy A" not in r.stdout, r.stderr
    set_data_dir(f"{b}/out/base/ckpt.pt", os.path.join(a, DATA))  # as older checkpoints recorded it
    r = python(b, *sample, cwd=a)
    assert r.returncode == 0 and f"--- {ours}" in r.stdout, r.stderr
    shutil.rmtree(f"{a}/data/gsm_synth")  # reading A's data now fails
    r = python(b, "train_grpo.py", "--out_dir=out/grpo", "--init_from=resume", "--max_iters=2")
    assert r.returncode == 0 and "resuming out/grpo at iter 1" in r.stdout, r.stderr
    r = python(b, "-m", "analysis.attribute", "--out_dir=out/grpo", f"--question={ours}", "--n_probe=2")  # its model loads
    assert r.returncode == 0 or "nothing to attribute" in r.stderr, r.stderr  # (tied rewards: no rollout to score)


def test_a_missing_data_directory_is_built_again_or_named(two_copies, tmp_path):
    """B's data deleted: loading the base builds it again, byte for byte. A directory outside any project
    that is gone: one line naming it and the command that builds it."""
    _, b = two_copies
    before = {n: open(f"{b}/{DATA}/{n}", "rb").read() for n in os.listdir(f"{b}/{DATA}")}
    shutil.rmtree(f"{b}/{DATA}")
    code = "import runs.loading; print(runs.loading.load_policy('out/base/ckpt.pt')[2])"
    r = python(b, "-c", code)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == f"{b}/{DATA}", r.stderr
    assert {n: open(f"{b}/{DATA}/{n}", "rb").read() for n in os.listdir(f"{b}/{DATA}")} == before
    gone = str(tmp_path / "elsewhere" / os.path.basename(DATA))
    set_data_dir(f"{b}/out/base/ckpt.pt", gone)
    r = python(b, "sample.py", "--ckpt=out/base/ckpt.pt", "--num_questions=1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: {gone}/tokenizer.json: No such file")
    assert f"--root={tmp_path}/elsewhere" in r.stderr


def test_paths_recorded_and_resolved(tmp_path):
    """In process: relative inside the project, absolute outside; resolved against the project root, never
    the working directory; another copy's task data becomes this copy's."""
    inside = os.path.join(tasks.PROJECT, "data", "gsm8k", "prepared")
    assert tasks.portable_path(inside) == "data/gsm8k/prepared"
    assert tasks.portable_path(str(tmp_path / "d")) == str(tmp_path / "d") and tasks.portable_path("") == ""
    assert tasks.resolve_data_dir("data/gsm8k/prepared") == inside
    other = tmp_path / "clone"
    (other / "data" / "gsm8k").mkdir(parents=True)
    (other / "data" / "gsm8k" / "prepare.py").write_text("")
    assert tasks.resolve_data_dir(str(other / "data" / "gsm8k" / "prepared")) == inside
    assert tasks.resolve_data_dir(str(tmp_path / "mine" / "d")) == str(tmp_path / "mine" / "d")
