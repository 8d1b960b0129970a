"""
The tables of experiments/audit.sh from its audit JSONs (python -m analysis.attribute --audit --out_json=...): how well each
ranking finds the planted defect's rewarded rollouts, and the same TracIn ranking with the checkpoints
weighted otherwise, computed from the per-checkpoint contributions w_t <g_i, G_t> the JSON holds:

    score_i = sum_t v_t * (w_t <g_i, G_t>) / w_t      (v_t: the other weighting; w_t = eta_t k_t as run)

    python experiments/audit_table.py out/audit/*.json
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, cli_main, quiet_start  # noqa: E402
quiet_start(__name__)
from tracin import trapezoid_steps  # noqa: E402
from analysis.audit import defect_targets, detection_table  # noqa: E402


def weightings(a):
    """Other checkpoint weights v_t, from the run's w_t = eta_t k_t and the checkpoint iterations."""
    w, k = a["result"]["checkpoint_weights"], trapezoid_steps(a["iters"])
    n = len(w)
    return {"eta_t k_t (trapezoid, as run)": w,
            "eta_t (plain TracInCP)": [wt / kt for wt, kt in zip(w, k)],
            "equal (1 each)": [1.0] * n,
            "last checkpoint only": [0.0] * (n - 1) + [1.0],
            "without the first (base) checkpoint": [0.0] + w[1:],
            "later half of the checkpoints": [0.0 if t < n // 2 else wt for t, wt in enumerate(w)]}


def fmt(m):
    return (f"{m['auc']:.3f} | {m['auc_rewarded']:.3f} | {100 * m['top_1pct']:.1f} | {100 * m['top_5pct']:.1f} | "
            f"{100 * m['top_10pct']:.1f} | {100 * m['base_rate']:.1f}")


def main(paths):
    if not paths:
        raise UserError("usage: python experiments/audit_table.py AUDIT.json [...]")
    audits = []
    for p in paths:
        with open(p) as f:
            audits.append((os.path.basename(p)[:-len(".json")], json.load(f)))
    head = "AUC | AUC among A > 0 | top 1 % | top 5 % | top 10 % | base rate |"
    print(f"| audit | wrong / answered | rollouts ranked | ranked by | {head}")
    print("| --- " * 10 + "|")
    for name, a in audits:  # every ranking recomputed from the stored scores (analysis/audit.py as it is now)
        for key, m in detection_table(a["result"], defect_targets(a["result"]["scores"])).items():
            print(f"| {name} | {len(a['wrong'])} / {a['n_answered']} | {a['n_scored']} | {key} | {fmt(m)} |")
    print()
    print(f"| audit | checkpoint weights | {head}")
    print("| --- " * 8 + "|")
    means = {}
    for name, a in audits:
        scores = a["result"]["scores"]
        labels = defect_targets(scores)
        if labels is None:
            continue
        w = a["result"]["checkpoint_weights"]
        for label, v in weightings(a).items():
            s = [{"tracin_score": sum(vt * c / wt for vt, wt, c in zip(v, w, e["checkpoint_contributions"]) if wt),
                  "advantage": e["advantage"]} for e in scores]
            m = detection_table({"scores": s}, labels)["tracin_score"]
            means.setdefault(label, []).append(m)
            print(f"| {name} | {label} | {fmt(m)} |")
    print(f"\n| mean over {len(audits)} audits | checkpoint weights | {head}")
    print("| --- " * 8 + "|")
    for label, ms in means.items():
        print(f"| | {label} | {fmt({k: sum(m[k] for m in ms) / len(ms) for k in ms[0]})} |")


if __name__ == "__main__":
    cli_main(main)
