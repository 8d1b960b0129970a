# experiments/defect_curve.sh for real on a tiny setting (a random 1-layer base on two-step problems,
# 2 steps a run, a length reward beside correctness so that the random base's groups have a signal):
# every run of the grid trained, the standard run with a defect audited, the summary's accuracy table
# equal to the runs' own last evaluations, read here from their logs; the same settings from scratch
# write the same tables (the thread count fixed); a bad list of shares or kinds is refused before
# any work. (The fake-python checks of every experiments/*.sh: tests/test_experiments_sh.py.)
# Run: python -m pytest -q tests/test_defect_curve.py
import json
import os
import subprocess
import sys

import pytest

from conftest import tiny_base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("--max_iters=2 --batch_size=2 --group_size=4 --micro_batch_size=8 --max_new_tokens=120 --eval_n=4 "
        "--tracin_val_batch_size=2 --ckpt_interval=1 --dtype=float32 --temperature=0.7 "
        "--reward_funcs=('correctness','length') --reward_weights=(1.0,0.1)")  # length: a signal at once


@pytest.fixture(scope="module")
def long_base(tmp_path_factory):
    """The tiny two-step base with room for 120 new tokens: long enough that the length reward
    varies within a group."""
    return tiny_base(tmp_path_factory, steps=2, block_size=256)


def curve(out, base, shares="0 0.5", kinds="grpo nll pg"):
    env = {**os.environ, "OUT": str(out), "SHARES": shares, "SEEDS": "1", "JOBS": "2", "THREADS": "1",
           "KINDS": kinds,
           "EXTRA": f"--base_ckpt={base} {TINY}",
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}  # this interpreter's python
    return subprocess.run(["bash", os.path.join(ROOT, "experiments", "defect_curve.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def last_accuracy(run):
    with open(os.path.join(run, "log.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    return [line["test/accuracy"] for line in lines if "test/accuracy" in line][-1]


def test_the_curve_trains_audits_and_tabulates_what_its_runs_logged(long_base, tmp_path):
    out = tmp_path / "curve"
    done = curve(out, long_base)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = sorted(p for p in os.listdir(out) if os.path.isdir(out / p))
    assert runs == sorted(f"{m}_f{f}_s1" for f in ("0", "0.5") for m in ("grpo", "nll", "pg"))
    assert (out / "grpo_f0.5_s1__audit16.json").is_file()  # the standard run with a defect, audited
    assert not (out / "grpo_f0_s1__audit16.json").exists()  # no defect: nothing to find
    summary = (out / "summary.md").read_text()
    for f in ("0", "0.5"):
        accs = [last_accuracy(out / f"{m}_f{f}_s1") for m in ("grpo", "nll", "pg")]
        row = f"| {f} | " + " | ".join(f"{a:.3f} [{a:.3f}-{a:.3f}]" for a in accs) + " |"
        assert row in summary, (row, summary)
    assert "| 0.5 | " in summary.split("Post-hoc TracIn")[1]  # the detector's row for the planted share
    again = curve(tmp_path / "again", long_base)  # from scratch: the same numbers at the same thread count
    assert again.returncode == 0, again.stderr[-2000:]
    tables = lambda s: s.split("\n", 2)[2].replace(str(out), "OUT")  # noqa: E731 (provenance: the date)
    assert tables((tmp_path / "again" / "summary.md").read_text().replace(str(tmp_path / "again"), "OUT")) \
        == tables(summary)


def test_a_bad_share_is_refused_before_any_work(tmp_path):
    out = tmp_path / "curve"
    done = curve(out, "unused", shares="0 1.5")
    assert done.returncode == 2 and "\"1.5\" is not a share from 0 to 1" in done.stderr
    assert not out.exists()


def test_a_bad_kind_is_refused_before_any_work(tmp_path):
    out = tmp_path / "curve"
    done = curve(out, "unused", kinds="grpo topk_norm")
    assert done.returncode == 2 and "\"topk_norm\" is none of grpo, nll, pg, topk_dot, topk_cos" in done.stderr
    assert not out.exists()
