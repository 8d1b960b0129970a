"""
Plot train_grpo.py runs from their log.jsonl: reward, test accuracy, TracIn selection rate and
seconds per step, each against steps (left) and against wall time (right), all runs on the same axes.

    python -m analysis.plot out/cmpB/grpo_s1 out/cmpB/tracin_s1 [--out=plot.png] [--labels=grpo,tracin]
    python -m analysis.plot out/tracin/tracin_<hash>.json [more of the same run] --out=influence.png

Standard GRPO runs are solid blue lines, TracIn runs (those that log a selection_rate) dashed
orange-red ones, curriculum runs (those that log curriculum/level) dash-dotted green ones, whose
third row is the curriculum level instead of the selection rate; several seeds of a kind get
several shades. Labels default to the directory names.
Also the slide figure of a post-hoc attribution (influence_figure): every scored rollout's TracIn score
against its iteration, planted-defect rollouts marked, the top helpful and harmful labelled;
analysis.attribute writes it (--figure); from the JSON files analysis.attribute wrote (an attribution or an
audit), analysis/plot.py draws it again, their scores summed.
Needs matplotlib, which requirements.txt leaves optional: pip install matplotlib.
"""
# configurator first: a Ctrl-C during the imports below is one line, not a traceback
from configurator import UserError, cli_main, quiet_start
quiet_start(__name__)
import json
import math
import os
import sys

from analysis.outputs import check_new_file, figure_format, has_mark, save_figure
from runs.rundir import MAX_ITER, numbered_jsonl

SMOOTH = 10  # reward, selection rate and step time are noisy step to step: also draw their moving average
ROWS = [("reward", "reward"), ("test/accuracy", "test accuracy"),
        ("selection_rate", "selection rate"), ("step_seconds", "step time (s)")]
KINDS = {"standard": ("Blues", "-"), "TracIn": ("Oranges", "--"), "curriculum": ("Greens", "-.")}


# in each file's metadata
RUNS_MARK, INFLUENCE_MARK = "GRPO runs figure by analysis.plot", "TracIn influence figure"


def written_by_plot(path):
    """Whether the file at path is a figure analysis/plot.py (or analysis.attribute) drew: the only kind
    --out replaces."""
    return has_mark(path, (RUNS_MARK.encode(), INFLUENCE_MARK.encode()))


def kind(log):
    if any("selection_rate" in line for line in log):
        return "TracIn"
    return "curriculum" if any("curriculum/level" in line for line in log) else "standard"
COLS = [("iter", "step"), ("elapsed", "wall time (s, evaluations included)")]


TEXT_KEYS = ("skip_reason",)  # the log's only text; any other value: a number, true / false, null


def load_log(run_dir):
    """The list of dicts in run_dir/log.jsonl, one per line. A malformed line (half written by a run
    still going, or cut off by a crash), or one whose iter or elapsed is not a number a figure can
    place, is skipped with a warning naming it; another key's value that is not a number (text
    written by hand) is left out with a warning; two lines of the same iteration (two runs' logs in
    one file) are an error."""
    if not os.path.isdir(run_dir):
        raise UserError(f"{run_dir} is not a directory: pass the --out_dir of train_grpo.py runs")
    path = os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(path):
        raise UserError(f"no log.jsonl in {run_dir}: is it the --out_dir of a train_grpo.py run?")
    log = []
    for n, line in numbered_jsonl(path):
        step, elapsed = line.get("iter"), line.get("elapsed")
        if type(step) is not int or not 0 <= step <= MAX_ITER or not is_finite(elapsed):
            text = json.dumps(line)[:60]
            print(f"warning: {path} line {n}: a line without iter (a whole number from 0 to "
                  f"2**53) and elapsed (a finite number); skipped ({text})", file=sys.stderr)
            continue
        for key in [k for k, v in line.items() if not plain(k, v)]:
            print(f"warning: {path} line {n}: {key} is {json.dumps(line.pop(key))[:30]}, not a "
                  f"number; left out", file=sys.stderr)
        log.append(line)
    if not log:
        raise UserError(f"{path} holds no log line: the run logs its first line after the evaluation at step 0")
    seen = set()
    for line in log:
        if line["iter"] in seen:
            raise UserError(f"{path} has two lines for iteration {line['iter']}: the logs of two runs mixed in "
                            f"one file? Each run needs its own --out_dir")
        seen.add(line["iter"])
    return log


def plain(key, value):
    """Whether a log value is what a run writes: a number, true / false, null, or TEXT_KEYS' text."""
    text = key in TEXT_KEYS and isinstance(value, str)
    return value is None or isinstance(value, (int, float)) or text


def is_finite(x):
    return is_number(x) and math.isfinite(x)


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def moving_average(ys, w):
    """Mean of the last w values at each point (fewer at the start, so the line starts at the first step)."""
    return [sum(ys[max(0, i - w + 1):i + 1]) / (i + 1 - max(0, i - w + 1)) for i in range(len(ys))]


def make_figure(runs):
    """runs: list of (label, log). Returns a matplotlib Figure with a 4x2 grid of axes (row-major in fig.axes)."""
    try:
        from matplotlib import colormaps
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("analysis/plot.py needs matplotlib: pip install matplotlib") from None
    # a bare Figure (no pyplot) renders with the Agg backend: no display needed, no global figure state
    fig = Figure(figsize=(12, 12), dpi=100, layout="constrained")
    axes = fig.subplots(len(ROWS), len(COLS), sharex="col")
    kinds = [kind(log) for _, log in runs]
    rows = list(ROWS)
    if "TracIn" not in kinds and "curriculum" in kinds:  # no selection rate to show: the level instead
        rows[2] = ("curriculum/level", "curriculum level")
    # one colour family and line style per kind, one shade per run of that kind: readable in grey too.
    # (lists, not generators: a generator would read cmap and n only later, after the loop changed them)
    shades = {k: iter([colormaps[cmap](0.85 - 0.35 * i / max(kinds.count(k) - 1, 1)) for i in range(kinds.count(k))])
              for k, (cmap, _) in KINDS.items()}
    for (label, log), k in zip(runs, kinds):
        color, style = next(shades[k]), KINDS[k][1]
        for r, (key, _) in enumerate(rows):
            # a number only: null (sampling gave NaN/Inf: no rollouts) or a hand-edited string is no point
            pts = [l for l in log if is_number(l.get(key))]
            for c, (xkey, _) in enumerate(COLS):
                ax, xs, ys = axes[r][c], [l[xkey] for l in pts], [l[key] for l in pts]
                if key == "test/accuracy":  # a handful of evaluations: markers, the step-0 one included
                    ax.plot(xs, ys, style, marker="o", color=color, label=label)
                elif xs:
                    ax.plot(xs, ys, "-", color=color, alpha=0.25, linewidth=0.8, label="_per step")
                    ax.plot(xs, moving_average(ys, SMOOTH), style, color=color, linewidth=1.8, label=label)
    for r, (key, ylabel) in enumerate(rows):
        axes[r][0].set_ylabel(ylabel)
        for c in range(len(COLS)):
            axes[r][c].grid(alpha=0.3)
    for c, (_, xlabel) in enumerate(COLS):
        axes[-1][c].set_xlabel(xlabel)
        axes[0][c].set_title(f"against {xlabel.split(' (')[0]}")
    axes[1][0].set_ylim(bottom=0)
    axes[1][1].set_ylim(bottom=0)
    if rows[2][0] == "selection_rate" and kinds.count("TracIn") < len(kinds):  # why the others are missing
        for ax in axes[2]:
            note, = ax.plot([], [], color=colormaps["Blues"](0.85))
            ax.legend([note], ["standard GRPO trains on all rollouts (rate 1)"], loc="best", fontsize="small")
    # one legend for the whole figure (the same runs are in every panel), below: above, it covers the title.
    # Its handles: the accuracy panel's lines, exactly one per run, in order (drawn even with no evaluation)
    names = [f"{label} ({k})" for (label, _), k in zip(runs, kinds)]
    fig.legend(axes[1][0].get_lines(), names, loc="outside lower center", ncols=min(len(names), 4))
    styles = {"-": "solid", "--": "dashed", "-.": "dash-dotted"}
    shown = ", ".join(f"{k} ({styles[KINDS[k][1]]})" for k in KINDS if k in kinds)
    fig.suptitle(f"GRPO runs: {shown}\nfaint lines: each step; "
                 f"bold: moving average over {SMOOTH} steps; dots: test evaluations")
    return fig


def has_matplotlib():
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


def summed_scores(results):
    """Every scored rollout once, its TracIn score summed over the results (find_critical_samples' dicts of
    one run and one n_probe: the same rollouts, in the same order, in each; any other mix is refused)."""
    key = lambda e: (e.get("index"), e.get("iter"), e.get("prompt"), e.get("completion"))  # noqa: E731
    entries = {key(e): {**e, "tracin_score": 0.0} for e in results[0]["scores"]}
    scored = sorted(entries, key=repr)
    for res in results:
        if sorted(map(key, res["scores"]), key=repr) != scored:
            raise UserError("the attributions score different rollouts (another run, or another n_probe): "
                            "sum only the attributions of one run made with the same --n_probe")
        for e in res["scores"]:
            entries[key(e)]["tracin_score"] += e["tracin_score"]
    return list(entries.values())


def influence_figure(entries, title, top_k=3):
    """The slide figure of a post-hoc attribution: every scored rollout's TracIn score against the iteration
    it was sampled at (jittered within the iteration, so that a step's rollouts do not sit on one line),
    rollouts of planted-defect prompts marked, the top_k most helpful (H1..) and harmful (R1..) labelled and
    listed below the axes."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("the influence figure needs matplotlib: pip install matplotlib") from None
    fig = Figure(figsize=(11, 6.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    jitter = lambda e: e["iter"] + 0.7 * ((e["index"] * 0.618034) % 1 - 0.5)  # noqa: E731 (golden-ratio spread)
    kinds = [("clean prompt", lambda e: not e.get("defective"), dict(marker="o", s=9, color="0.55", alpha=0.45)),
             ("defective prompt, rewarded (A > 0)", lambda e: e.get("defective") and e["advantage"] > 0,
              dict(marker="^", s=30, color="#c0392b")),
             ("defective prompt, A < 0", lambda e: e.get("defective") and e["advantage"] <= 0,
              dict(marker="v", s=18, facecolors="none", edgecolors="#e67e22", linewidths=0.8))]
    for label, keep, style in kinds:
        pts = [e for e in entries if keep(e)]
        if pts:
            ax.scatter([jitter(e) for e in pts], [e["tracin_score"] for e in pts], label=f"{label} ({len(pts)})",
                       **style)
    ax.axhline(0.0, color="black", linewidth=0.8)
    order = sorted(entries, key=lambda e: -e["tracin_score"])
    top = [(f"H{r}", e) for r, e in enumerate(order[:top_k], 1) if e["tracin_score"] > 0]
    top += [(f"R{r}", e) for r, e in enumerate(order[::-1][:top_k], 1) if e["tracin_score"] < 0]
    key = []
    for name, e in top:
        ax.annotate(name, (jitter(e), e["tracin_score"]), xytext=(6, 4 if name[0] == "H" else -10),
                    textcoords="offset points", fontsize=10, fontweight="bold")
        flag = "  [defective prompt]" if e.get("defective") else ""
        text = ascii(" ".join(e["completion"].split())[:48])  # any character a font lacks, as \\uXXXX
        key.append(f"{name}: iter {e['iter']}, A {e['advantage']:+.2f}, score {e['tracin_score']:+.2e}{flag}: {text}")
    ax.set_xlabel("training iteration the rollout was sampled at")
    ax.set_ylabel("TracIn score (positive: its step lowered the test loss)")
    ax.set_title(ascii(title[:110])[1:-1], fontsize=12, parse_math=False)  # a '$' in a question is no math
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    if key:  # H = most helpful, R = most harmful
        ax.text(0.0, -0.13, "\n".join(key), transform=ax.transAxes, va="top", fontsize=9, family="monospace",
                parse_math=False)
    return fig


def plot_influence(results, out_path, title, top_k=3, ours=written_by_plot):
    """Write influence_figure of the summed scores of `results` to out_path; returns out_path. A
    file there is replaced only where ours(out_path) says a script of this project wrote it."""
    fig = influence_figure(summed_scores(results), title, top_k)
    return save_figure(fig, out_path, INFLUENCE_MARK, ours, "analysis.plot or analysis.attribute")


def run_labels(run_dirs):
    """A label per run: its directory's name, or the paths as given where two runs share a name; the
    same run given twice is refused (its lines would hide each other)."""
    if len({os.path.realpath(d) for d in run_dirs}) < len(run_dirs):
        raise UserError("a run directory is given twice: give each run once")
    labels = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    return labels if len(set(labels)) == len(labels) else list(run_dirs)


def plot_runs(run_dirs, out_path="plot.png", labels=None):
    """Draw the runs in run_dirs into out_path (its extension names the format); returns out_path.
    A file there is replaced only if analysis/plot.py drew it."""
    labels = run_labels(run_dirs) if labels is None else labels
    if len(labels) != len(run_dirs):
        raise UserError(f"--labels has {len(labels)} names for {len(run_dirs)} run directories: give one per run")
    fig = make_figure([(label, load_log(d)) for label, d in zip(labels, run_dirs)])
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    return save_figure(fig, out_path, RUNS_MARK, written_by_plot, "analysis.plot")


def split_args(argv, opts, takes):
    """(paths, opts): the arguments without '--', and opts updated from '--key=value' for its keys; any
    other '--' argument is a one-line error ending in `takes` (what the script accepts)."""
    paths = []
    for arg in argv:
        key, _, value = arg[2:].partition("=")
        if arg.startswith("--") and key in opts and value:
            opts[key] = value
        elif arg.startswith("--"):
            raise UserError(f"bad argument {arg!r}: {takes}")
        else:
            paths.append(arg)
    return paths, opts


def main(argv):
    run_dirs, opts = split_args(argv, {"out": "plot.png", "labels": None},
                                "analysis.plot takes run directories, --out=FILE.png and --labels=a,b")
    if not run_dirs:
        raise UserError("no run directory given; usage: python -m analysis.plot RUN_DIR [RUN_DIR ...] "
                        "[--out=plot.png] [--labels=a,b], or python -m analysis.plot TRACIN.json [...] --out=influence.png")
    figure_format(opts["out"], "out")  # all three checked before any log is read
    check_new_file(opts["out"], "--out", written_by_plot, "analysis.plot")
    jsons = [a for a in run_dirs if a.endswith(".json")]
    if jsons:
        if len(jsons) < len(run_dirs) or opts["labels"]:
            raise UserError("give either run directories or analysis.attribute's JSON files (no --labels), not both")
        results = [load_attribution(f) for f in jsons]
        title = results[0][1] if len(results) == 1 else f"TracIn scores summed over {len(results)} attributions"
        print(f"wrote {plot_influence([r for r, _ in results], opts['out'], title)}")
        return
    labels = opts["labels"].split(",") if opts["labels"] else None
    print(f"wrote {plot_runs(run_dirs, opts['out'], labels)}")


def load_attribution(path):
    """(find_critical_samples' result, a title) from a JSON file analysis.attribute wrote: an attribution of one
    answer (the result itself, with the question) or an audit (the result under 'result')."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e}); give a tracin_*.json that analysis.attribute wrote") from None
    res = obj.get("result", obj) if isinstance(obj, dict) else None
    if not isinstance(res, dict) or not isinstance(res.get("scores"), list) or not res["scores"]:
        raise UserError(f"{path} holds no TracIn scores: give a tracin_*.json or tracin_audit.json that analysis.attribute wrote")
    title = obj.get("question") or f"audit of {len(obj.get('wrong', []))} wrong answers"
    return res, title


if __name__ == "__main__":
    cli_main(main)
