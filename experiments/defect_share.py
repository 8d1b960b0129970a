"""
Where a run's learning signal came from under a planted defect (train_grpo.py --defect_frac=F): of the
positive advantage it trained on (every row for standard GRPO, the selected rows for TracIn-GRPO), the
share that came from defective prompts, next to the share of rows from defective prompts.

    python experiments/defect_share.py out/cmpC/grpo_s1 out/cmpC/nll_s1 ...
"""
import json
import os
import sys


def share(run):
    """(defective share of the positive advantage trained on, defective share of the rows)."""
    bad_adv = all_adv = bad_rows = rows = 0
    with open(os.path.join(run, "rollouts.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("skipped"):
                continue  # no weight moved
            group = len(r["advantages"]) // len(r["prompts"])
            trained = r.get("selected") or [True] * len(r["advantages"])
            for i, (a, kept) in enumerate(zip(r["advantages"], trained)):
                bad = r["defective"][i // group]
                rows, bad_rows = rows + 1, bad_rows + bad
                if kept and a > 0:
                    all_adv, bad_adv = all_adv + a, bad_adv + (a if bad else 0.0)
    return bad_adv / max(all_adv, 1e-12), bad_rows / max(rows, 1)


if __name__ == "__main__":
    if len(sys.argv) < 2 or any(a.startswith("-") for a in sys.argv[1:]):
        sys.exit("usage: python experiments/defect_share.py RUN_DIR [RUN_DIR ...] (runs with --defect_frac > 0)")
    print("| run | positive advantage trained on, from defective prompts | rows from defective prompts |")
    print("| --- | --- | --- |")
    for run in sys.argv[1:]:
        adv, rows = share(run)
        print(f"| {run} | {adv:.2f} | {rows:.2f} |")
