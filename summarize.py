"""
Markdown table comparing train_grpo.py runs from their log.jsonl files.

    python summarize.py out/cmp/grpo_s1 out/cmp/tracin_s1 ...

Per run: test accuracy at the start and at the last step, accuracy at equal wall time (the
last evaluation no later than the fastest run's total time), mean seconds per step, selection
rate and selection precision (TracIn runs with a planted defect).
"""
from configurator import UserError, cli_main
from plot import load_log  # the same checks on a run directory (plot.py imports matplotlib only to draw)


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def fmt(x):
    return "-" if x is None else f"{x:.2f}"


def main(runs):
    if not runs or any(r.startswith("--") for r in runs):
        raise UserError("usage: python summarize.py RUN_DIR [RUN_DIR ...] (the --out_dir of train_grpo.py runs)")
    logs = {r: load_log(r) for r in runs}
    evals = {r: [(l["elapsed"], l["iter"], l["test/accuracy"]) for l in L if "test/accuracy" in l] for r, L in logs.items()}
    budget = min(e[-1][0] for e in evals.values())  # wall time of the fastest run
    print(f"| run | test acc start | test acc end (step) | test acc at {budget:.0f} s (step) | s/step "
          f"| selection rate | selection precision / clean base rate |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r, L in logs.items():
        steps = [l for l in L if "step_seconds" in l]
        ev = evals[r]
        at_budget = [e for e in ev if e[0] <= budget + 1e-9][-1]
        sel = mean([l.get("selection_rate") for l in steps])
        prec = mean([l.get("defect/selection_precision") for l in steps])
        base = mean([l.get("defect/clean_base_rate") for l in steps])
        print(f"| {r} | {ev[0][2]:.3f} | {ev[-1][2]:.3f} ({ev[-1][1]}) | {at_budget[2]:.3f} ({at_budget[1]}) "
              f"| {fmt(mean([l['step_seconds'] for l in steps]))} | {fmt(sel)} | {fmt(prec)} / {fmt(base)} |")


if __name__ == "__main__":
    cli_main(main)
