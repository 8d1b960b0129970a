"""
The tables and the figure of experiments/defect_curve.sh from its runs (OUT/{grpo,nll,pg}_f{share}_s{seed})
and audits (OUT/grpo_f{share}_s{seed}__audit16.json):
  - test accuracy at the end against the planted share, per method: the seeds' mean and range;
  - TracIn's selection: the precision (the clean share of the kept rollouts, over the steps that
    updated) against the clean base rate of all rollouts, and the share of rollouts kept;
  - how the standard runs learned the defect (defective answers among the wrong test answers is what
    the audit reads) and how well each ranking of post-hoc TracIn finds its rewarded rollouts (AUC
    overall and among the rewarded ones, the planted share's base rate);
  - the figure OUT/defect_curve.png (matplotlib, if installed).

    python experiments/curve_table.py out/curve
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# configurator first: a Ctrl-C during the slow imports below is one line, not a traceback
from configurator import UserError, cli_main, quiet_start  # noqa: E402
quiet_start(__name__)
from analysis.audit import defect_targets, detection_table  # noqa: E402
from analysis.summarize import load_log, mean  # noqa: E402

RUN = re.compile(r"^(grpo|nll|pg|topk_dot|topk_cos)_f([0-9.]+)_s([0-9]+)$")
METHODS = {"grpo": "standard GRPO", "nll": "TracIn-GRPO nll", "pg": "TracIn-GRPO pg",
           "topk_dot": "nll, top quarter by dot", "topk_cos": "nll, top quarter by cosine"}


def runs_of(out):
    """{(method, share, seed): log lines} of every run directory in out with a log."""
    found = {}
    for name in sorted(os.listdir(out)):
        m = RUN.match(name)
        if m and os.path.isfile(os.path.join(out, name, "log.jsonl")):
            found[(m[1], float(m[2]), int(m[3]))] = load_log(os.path.join(out, name))
    return found


def final_accuracy(lines):
    accs = [(l["iter"], l["test/accuracy"]) for l in lines
            if isinstance(l.get("test/accuracy"), (int, float)) and l["test/accuracy"] == l["test/accuracy"]]
    return max(accs)[1] if accs else None


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{sum(xs) / len(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"


def cell(x):
    return "-" if x is None else f"{x:.2f}"


def main(argv):
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        raise UserError("usage: python experiments/curve_table.py OUT (the OUT of experiments/defect_curve.sh)")
    out = argv[0]
    runs = runs_of(out)
    if not runs:
        raise UserError(f"{out} holds no run of experiments/defect_curve.sh (e.g. grpo_f0.5_s1 with a log.jsonl)")
    shares = sorted({f for _, f, _ in runs})
    seeds = sorted({s for _, _, s in runs})
    methods = {m: label for m, label in METHODS.items() if any(k[0] == m for k in runs)}
    tracins = [m for m in methods if m != "grpo"]
    acc = {k: final_accuracy(v) for k, v in runs.items()}
    print(f"Test accuracy at the end (greedy, the runs' eval_n problems): mean [min-max] over seeds {seeds}\n")
    print("| planted share | " + " | ".join(methods.values()) + " |")
    print("| --- " * (len(methods) + 1) + "|")
    for f in shares:
        row = [spread([acc.get((m, f, s)) for s in seeds]) for m in methods]
        print(f"| {f:g} | " + " | ".join(row) + " |")
    print("\nTracIn's selection, mean over steps and seeds: precision (clean share of the kept rollouts, "
          "steps that updated) / clean base rate | share of rollouts kept\n")
    print("| planted share | " + " | ".join(f"{methods[m]}: precision / base | kept" for m in tracins) + " |")
    print("| --- " * (2 * len(tracins) + 1) + "|")
    for f in shares:
        row = []
        for m in tracins:
            steps = [l for s in seeds for l in runs.get((m, f, s), []) if "step_seconds" in l]
            prec = mean([l.get("defect/selection_precision") for l in steps])
            base = mean([l.get("defect/clean_base_rate") for l in steps])
            kept = mean([l.get("selection_rate") for l in steps])
            row.append(f"{cell(prec)} / {cell(base)} | {cell(kept)}")
        print(f"| {f:g} | " + " | ".join(row) + " |")
    audits = {}
    for f in shares:
        for s in seeds:
            path = os.path.join(out, f"grpo_f{f:g}_s{s}__audit16.json")
            if os.path.isfile(path):
                with open(path) as fh:
                    a = json.load(fh)
                audits[(f, s)] = detection_table(a["result"], defect_targets(a["result"]["scores"]))
    if audits:
        keys = ("tracin_score", "cosine_score", "self_influence", "advantage")
        print("\nPost-hoc TracIn on the standard runs (analysis.attribute --audit=16): AUC of each ranking for "
              "the defect's rewarded rollouts, overall / among the rewarded ones; mean [min-max] over seeds\n")
        print("| planted share | " + " | ".join(keys) + " | base rate |")
        print("| --- " * (len(keys) + 2) + "|")
        for f in shares:
            tables = [audits[(f, s)] for s in seeds if (f, s) in audits]
            if not tables:
                continue
            row = []
            for k in keys:
                overall = [t[k]["auc"] for t in tables if k in t]
                rewarded = [t[k]["auc_rewarded"] for t in tables if k in t]
                row.append(f"{spread(overall)} / {spread(rewarded)}")
            base = spread([t["advantage"]["base_rate"] for t in tables])
            print(f"| {f:g} | " + " | ".join(row) + f" | {base} |")
    figure(out, shares, seeds, acc, methods)


def figure(out, shares, seeds, acc, methods):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\nmatplotlib not installed: no figure (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, label in methods.items():
        pts = [(f, [acc.get((m, f, s)) for s in seeds]) for f in shares]
        pts = [(f, [x for x in xs if x is not None]) for f, xs in pts]
        pts = [(f, xs) for f, xs in pts if xs]
        if not pts:
            continue
        xs = [f for f, _ in pts]
        style = "--" if m.startswith("topk") else "-"  # the 'topk' variants of TracIn-GRPO nll
        line, = ax.plot(xs, [sum(v) / len(v) for _, v in pts], style, marker="o", label=label)
        ax.fill_between(xs, [min(v) for _, v in pts], [max(v) for _, v in pts], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("share of training problems planted (defect_frac)")
    ax.set_ylabel("test accuracy at the end")
    ax.set_ylim(0, 1)
    ax.set_title(f"the defect curve: mean and range over seeds {', '.join(map(str, seeds))}")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(out, "defect_curve.png")
    fig.savefig(path, dpi=120)
    print(f"\nfigure: {path}")


if __name__ == "__main__":
    cli_main(main)
