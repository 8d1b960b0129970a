"""
The Countdown demo's figure: how GRPO and TracIn-GRPO runs learned (reward, test accuracy and TracIn's
selection rate, each against steps) and what the model writes for the same test problems before
training (the base: LoRA off) and after it (each run's last adapter), greedy, with the reward's verdict.

    bash experiments/countdown.sh       # the whole demo: base (if missing), both runs, this figure
    python -m analysis.countdown_demo RUN_DIR [RUN_DIR ...] [--out=countdown.png] [--problems=3]
        [--base_ckpt=PATH]

The runs must share one base and one task (the "before" column is that base; the title names
the task); --base_ckpt: that base where it is now, if it moved. --out is never a file this script
did not write. Needs matplotlib (pip install matplotlib).
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, cli_main, quiet_start
quiet_start(__name__)
import os
import textwrap

import torch

from analysis.outputs import check_new_file, figure_format, has_mark, save_figure
from analysis.plot import (SMOOTH, has_matplotlib, kind, load_log, moving_average, run_labels,
                           split_args)
from data.tasks import TASKS, load_task_split
from lora import disable_lora
from runs.checkpoint import load_checkpoint
from rewards import REWARD_FUNCS
from data.prompts import decode_completions, encode_prompt, stop_tokens
from model import Sampling, generate
from runs.loading import load_policy

PANELS = [("reward", "reward (moving average)"), ("test/accuracy", "greedy test accuracy"),
          ("selection_rate", "rollouts trained on")]
WRAP = 62  # characters per line of a completion in the text panel
# by the runs' task
TITLES = {"arith": "Arithmetic word problems", "gsm8k": "GSM8K", "countdown": "Countdown"}
KIND_NAMES = {"standard": "GRPO", "TracIn": "TracIn-GRPO", "curriculum": "curriculum GRPO"}
# in the figure's metadata: the only file --out replaces
MARK = "GRPO demo figure by analysis.countdown_demo"
USAGE = ("analysis.countdown_demo takes run directories, --out=FILE.png, --problems=N and "
         "--base_ckpt=PATH")


def written_here(path):
    return has_mark(path, (MARK.encode(),))


def final_ckpt(run_dir):
    path = os.path.join(run_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise UserError(f"no ckpt.pt in {run_dir}: is it the --out_dir of a finished train_grpo.py run?")
    return path


def greedy_answers(run_dirs, n_problems, base_ckpt=""):
    """(problems, {column name: [completion per problem]}, reward, task): the first n_problems test
    problems of the runs' task, answered greedily by the base (every adapter off) and by each run's
    last adapter. base_ckpt: the runs' base where it is now, if it moved."""
    columns, problems, base_of, tasks = {}, None, None, []
    for d, label in zip(run_dirs, run_labels(run_dirs)):
        ckpt = load_checkpoint(final_ckpt(d))
        if base_of is not None and ckpt.get("base_identity", {}).get("tensors") != base_of:
            raise UserError(f"{d} was trained on another base than {run_dirs[0]}: the figure shows one base")
        base_of = ckpt.get("base_identity", {}).get("tensors")
        task, max_new = ckpt["config"].get("task", "arith"), ckpt["config"]["max_new_tokens"]
        tasks.append(task)
        if task != tasks[0]:
            raise UserError(f"{d} is a {task} run and {run_dirs[0]} a {tasks[0]} run: the figure "
                            f"shows one task; give runs of one task")
        model, enc, data_dir = load_policy(final_ckpt(d), base_ckpt=base_ckpt)
        if problems is None:
            problems = load_task_split(data_dir, "test")[:n_problems]
            if not problems:
                raise UserError(f"the test split of {data_dir} is empty: nothing to show")
        prompts = [encode_prompt(enc, e["question"]) for e in problems]

        def answer():
            with torch.no_grad():
                greedy = Sampling(temperature=0, vocab_size=enc.n_vocab)
                idx, _, mask = generate(model, prompts, max_new, stop_tokens(enc), sampling=greedy)
            return decode_completions(enc, idx, mask)

        if not columns:
            with disable_lora(model):  # the base as every run started from it (B = 0 at step 0)
                columns["base (step 0)"] = answer()
        columns[f"{label} (step {ckpt['iter_num']})"] = answer()
    return problems, columns, REWARD_FUNCS[TASKS[task]["correct"]], task


def make_figure(run_dirs, n_problems, base_ckpt=""):
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    logs = [(label, load_log(d)) for d, label in zip(run_dirs, run_labels(run_dirs))]
    problems, columns, correct, task = greedy_answers(run_dirs, n_problems, base_ckpt)
    fig = Figure(figsize=(16, 4.5 + 1.3 * len(problems)), dpi=100, layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[4, 1.3 * len(problems)])
    axes = top.subplots(1, len(PANELS))
    colors = {"standard": colormaps["Blues"], "TracIn": colormaps["Oranges"], "curriculum": colormaps["Greens"]}
    for i, (label, log) in enumerate(logs):
        color = colors[kind(log)](0.85 - 0.4 * i / max(len(logs) - 1, 1))
        for ax, (key, _) in zip(axes, PANELS):
            pts = [line for line in log if key in line]
            xs, ys = [p["iter"] for p in pts], [p[key] for p in pts]
            if key == "test/accuracy":
                ax.plot(xs, ys, "-o", color=color, label=label)
            elif key == "selection_rate" and not pts:  # standard GRPO trains on every rollout
                ax.plot([log[0]["iter"], log[-1]["iter"]], [1, 1], "-", color=color, label=label)
            else:
                ax.plot(xs, moving_average(ys, SMOOTH), "-", color=color, label=label)
    for ax, (_, title) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[1].set_ylim(bottom=0)
    axes[2].set_ylim(0, 1.05)
    axes[0].legend(fontsize="small")
    # below: the same problems, one row each, one column per model
    grid = bottom.subplots(len(problems), len(columns), squeeze=False)
    for r, e in enumerate(problems):
        for c, (name, texts) in enumerate(columns.items()):
            ax, ok = grid[r][c], correct(texts[r], e["answer"]) == 1.0
            ax.set_axis_off()
            body = "\n".join(textwrap.fill(line, WRAP) for line in texts[r].split("\n"))
            ax.text(0, 1, f"{name}: {'correct' if ok else 'wrong'}\n{body}", va="top", ha="left",
                    family="monospace", fontsize=8.5, color="darkgreen" if ok else "darkred", wrap=True,
                    transform=ax.transAxes)
            if c == 0:
                ax.set_title(e["question"], loc="left", fontsize=10)
    fig.suptitle(figure_title(task, [log for _, log in logs], len(problems)))
    return fig


def figure_title(task, logs, n_problems):
    """The figure's title: the runs' task and their kinds (GRPO, TracIn-GRPO, curriculum)."""
    methods = " and ".join(dict.fromkeys(KIND_NAMES[kind(log)] for log in logs))
    return (f"{TITLES.get(task, task)}: {methods} from one base ({SMOOTH}-step moving averages); "
            f"greedy completions of {n_problems} test problems before and after")


def main(argv):
    opts = {"out": "countdown.png", "problems": "3", "base_ckpt": ""}
    run_dirs, opts = split_args(argv, opts, USAGE)
    if not run_dirs:
        raise UserError("no run directory given; usage: python -m analysis.countdown_demo RUN_DIR [RUN_DIR ...] "
                        "[--out=countdown.png] [--problems=3] [--base_ckpt=PATH]")
    if not opts["problems"].isdecimal() or not 1 <= int(opts["problems"]) <= 8:
        raise UserError(f"--problems={opts['problems']}: give a whole number from 1 to 8")
    figure_format(opts["out"], "out")  # checked before any model runs
    check_new_file(opts["out"], "--out", written_here, "analysis.countdown_demo")
    for d in run_dirs:  # every run directory read before anything is drawn
        load_log(d), final_ckpt(d)
    if not has_matplotlib():
        raise UserError("analysis/countdown_demo.py needs matplotlib: pip install matplotlib")
    fig = make_figure(run_dirs, int(opts["problems"]), opts["base_ckpt"])
    print(f"wrote {save_figure(fig, opts['out'], MARK, written_here, 'analysis.countdown_demo')}")


if __name__ == "__main__":
    cli_main(main)
