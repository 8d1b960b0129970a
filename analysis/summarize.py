"""
Markdown table comparing train_grpo.py runs from their log.jsonl files.

    python -m analysis.summarize out/cmp/grpo_s1 out/cmp/tracin_s1 ...

Per run: test accuracy at the start and at the last step, accuracy at equal wall time (the
last evaluation no later than the fastest run's total time), mean seconds per step, selection
rate and selection precision (TracIn runs with a planted defect). A run with no evaluation in its log
(interrupted before the first one) shows '-' for the accuracies and does not count for the equal wall time.
"""
# configurator first: a Ctrl-C during the imports below is one line, not a traceback
from configurator import UserError, cli_main, quiet_start
quiet_start(__name__)
from analysis.plot import is_number, load_log  # the same checks on a run directory (plot imports matplotlib only to draw)


def mean(xs):
    # null (no rollouts that step), NaN or a hand-edited string: left out
    xs = [x for x in xs if is_number(x) and x == x]
    return sum(xs) / len(xs) if xs else None


def fmt(x):
    return "-" if x is None else f"{x:.2f}"


def last_acc(evals):
    """The last of a list of evaluations (elapsed, iter, accuracy) as 'accuracy (step)'; '-' if there is none."""
    return f"{evals[-1][2]:.3f} ({evals[-1][1]})" if evals else "-"


def main(runs):
    bad = [r for r in runs if r.startswith("--")]
    if not runs or bad:
        raise UserError((f"analysis.summarize takes no option {bad[0]!r}; " if bad else "") + "usage: "
                        "python -m analysis.summarize RUN_DIR [RUN_DIR ...] (the --out_dir of train_grpo.py runs)")
    logs = {r: load_log(r) for r in runs}
    evals = {r: [(l["elapsed"], l["iter"], l["test/accuracy"]) for l in L  # (a NaN one: an evaluation skipped)
                 if isinstance(l.get("test/accuracy"), (int, float)) and l["test/accuracy"] == l["test/accuracy"]]
             for r, L in logs.items()}
    ends = [e[-1][0] for e in evals.values() if e]  # a run without an evaluation (yet) has no say in the budget
    budget = min(ends) if ends else None  # wall time of the fastest run
    print(f"| run | test acc start | test acc end (step) | test acc at {'-' if budget is None else f'{budget:.0f}'} s "
          f"(step) | s/step | selection rate | selection precision / clean base rate |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r, L in logs.items():
        steps = [l for l in L if "step_seconds" in l]
        ev = evals[r]
        at_budget = [e for e in ev if e[0] <= budget + 1e-9]  # budget is None only if no run has one
        sel = mean([l.get("selection_rate") for l in steps])
        prec = mean([l.get("defect/selection_precision") for l in steps])
        base = mean([l.get("defect/clean_base_rate") for l in steps])
        print(f"| {r} | {f'{ev[0][2]:.3f}' if ev else '-'} | {last_acc(ev)} | {last_acc(at_budget)} "
              f"| {fmt(mean([l['step_seconds'] for l in steps]))} | {fmt(sel)} | {fmt(prec)} / {fmt(base)} |")


if __name__ == "__main__":
    cli_main(main)
