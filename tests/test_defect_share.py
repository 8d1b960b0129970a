# experiments/defect_share.py: of the positive advantage a run trained on, the share from defective
# prompts. Reference: the sums written out by hand for two steps of two prompts x two rows.
# Run: python -m pytest -q tests/test_defect_share.py
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from defect_share import share  # noqa: E402

STEPS = [  # prompt 0 defective at step 1, prompt 1 at step 2; the skipped step 3 moved no weight
    {"iter": 1, "prompts": ["a", "b"], "advantages": [1.0, -1.0, 0.5, -0.5], "defective": [True, False]},
    {"iter": 2, "prompts": ["c", "d"], "advantages": [2.0, -2.0, 0.0, 0.0], "defective": [False, True]},
    {"iter": 3, "prompts": ["e", "f"], "advantages": [9.0, -9.0, 9.0, -9.0], "defective": [True, True],
     "skipped": True},
]


def write(run, selected=None):
    os.makedirs(run)
    with open(os.path.join(run, "rollouts.jsonl"), "w") as f:
        for step, sel in zip(STEPS, selected or [None] * len(STEPS)):
            f.write(json.dumps({**step, **({"selected": sel} if sel else {})}) + "\n")
    return run


def test_standard_grpo_counts_every_row_and_tracin_only_the_kept_ones(tmp_path):
    grpo = write(str(tmp_path / "grpo"))
    # positive advantages trained on: 1.0 (defective), 0.5, 2.0; rows: 2 of 4 defective each step
    assert share(grpo) == pytest.approx((1.0 / 3.5, 4 / 8))
    kept = [[False, True, True, False], [True, False, False, False], [True] * 4]
    tracin = write(str(tmp_path / "tracin"), kept)
    assert share(tracin) == pytest.approx((0.0, 4 / 8))  # the defective 1.0 was not kept


def test_no_run_given_is_one_line():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "defect_share.py")],
                       capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.startswith("usage: ") and len(p.stderr.splitlines()) == 1
