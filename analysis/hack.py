"""
Reward hacking on Countdown (experiments/countdown_hack.sh): runs trained on a verifier that trusts
the claimed result (rewards.countdown_claim_reward), with the exact `countdown` reward scored beside
it at weight 0. Two markdown tables and, with --out, a figure:

    python -m analysis.hack RUN_DIR [RUN_DIR ...] [--out=hack.png]

1. Per run: greedy test accuracy (exact) at the first and last evaluation; the hackable reward, the
   true accuracy of the training rollouts and the hack rate (paid by the hackable verifier, refused
   by the exact one), each averaged over the first and the last 25 steps; the rollouts trained on.
2. Per TracIn run, every rollout of rollouts.jsonl scored again by both verifiers: how many hacks
   and how many right answers it kept, and their mean influence.
The figure: hackable reward, true accuracy and hack rate against steps (moving averages), a line
per run, one colour per method. --out is never a file this script did not write.
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, cli_main, quiet_start
quiet_start(__name__)
import os

import torch

from analysis.outputs import check_new_file, figure_format, has_mark, save_figure
from analysis.plot import (SMOOTH, has_matplotlib, is_number, load_log, moving_average,
                           split_args)
from data.datadir import load_tokenizer
from data.tasks import resolve_data_dir
from runs.checkpoint import load_checkpoint
from rewards import countdown_claim_reward, countdown_reward
from runs.metrics import read_records
from data.prompts import decode_completions

EDGE = 25  # steps averaged at the start and at the end
MARK = "reward hacking figure by analysis.hack"
PANELS = [("rewards/countdown_claim", "hackable reward (claim)"),
          ("rewards/countdown", "true accuracy of the rollouts (exact)"),
          ("hack_rate", "hack rate (claim paid, exact refused)")]
USAGE = "analysis.hack takes run directories and --out=FILE.png"


def method(cfg):
    """GRPO, or TracIn with its validation loss and batch ('TracIn pg, 4 val'), from the run's
    saved config."""
    if not cfg.get("tracin"):
        return "GRPO"
    return f"TracIn {cfg['tracin_val_loss']}, {cfg['tracin_val_batch_size']} val"


def mean(xs):
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def edges(steps, key):
    """(mean over the first EDGE steps, over the last EDGE) of a log key."""
    return mean([s.get(key) for s in steps[:EDGE]]), mean([s.get(key) for s in steps[-EDGE:]])


def load_run(run_dir):
    """(log, saved config, tokenizer) of a finished train_grpo.py run."""
    log, path = load_log(run_dir), os.path.join(run_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise UserError(f"no ckpt.pt in {run_dir}: is it the --out_dir of a train_grpo.py run?")
    ckpt = load_checkpoint(path)
    cfg = ckpt.get("config", {})
    if "countdown_claim" not in cfg.get("reward_funcs", ()):
        raise UserError(f"{run_dir} was not trained on the hackable verifier (reward_funcs "
                        f"{tuple(cfg.get('reward_funcs', ()))}): see experiments/countdown_hack.sh")
    if not any(is_number(s.get("rewards/countdown")) for s in log):  # no true accuracy, no hack rate
        funcs = tuple(cfg["reward_funcs"])
        why = (f"its reward_funcs {funcs} lack it: add it at weight 0, as "
               f"experiments/countdown_hack.sh does" if "countdown" not in funcs
               else "no line of its log that could be read scored it (damaged lines were skipped or "
               "their value left out: see the warnings above)" if damaged_log(run_dir, log)
               else "no training step in its log scored it (stopped before the first?)")
        raise UserError(f"{run_dir} never scored the exact reward 'countdown' (its true accuracy "
                        f"and hack rate are unknown): {why}")
    return log, cfg, load_tokenizer(resolve_data_dir(ckpt.get("data_dir", "")))


def damaged_log(run_dir, log):
    """Whether load_log skipped a line of run_dir/log.jsonl as damaged or left a
    'rewards/countdown' value out (its warnings named them)."""
    with open(os.path.join(run_dir, "log.jsonl"), errors="replace") as f:
        raw = [line for line in f if line.strip()]
    lost = sum('"rewards/countdown"' in line for line in raw) - sum("rewards/countdown" in s for s in log)
    return len(raw) > len(log) or lost > 0


def kept_counts(run_dir, enc):
    """{'hack'/'right'/'other': [rollouts, kept, sum of influence]} over rollouts.jsonl."""
    counts = {k: [0, 0, 0.0] for k in ("hack", "right", "other")}
    path = os.path.join(run_dir, "rollouts.jsonl")
    needs = ("selected", "influence")  # each checked: true / false, a number
    for line in read_records(path, enc.n_vocab, needs, form="countdown", unused=("defective",)):
        group = len(line["completion_tokens"]) // len(line["answers"])
        texts = decode_completions(enc, torch.tensor(line["completion_tokens"]),
                                   torch.tensor(line["completion_mask"]))
        for i, text in enumerate(texts):
            answer = line["answers"][i // group]
            answer = (tuple(answer[0]), answer[1])
            exact = countdown_reward(text, answer) == 1.0
            hack = not exact and countdown_claim_reward(text, answer) == 1.0
            c = counts["right" if exact else "hack" if hack else "other"]
            kept, influence = bool(line["selected"][i]), line["influence"][i]
            c[0], c[1], c[2] = c[0] + 1, c[1] + kept, c[2] + influence
    return counts


def tables(runs):
    """The two markdown tables, as a string."""
    out = ["| run | method | greedy test accuracy first / last (step) | hackable reward "
           f"first / last {EDGE} steps | true accuracy | hack rate | rollouts kept |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for d, (log, cfg, _) in runs.items():
        steps = [s for s in log if "rewards/countdown_claim" in s]
        ev = [(s["iter"], s["test/accuracy"]) for s in log if s.get("test/accuracy") is not None]
        acc = f"{100 * ev[0][1]:.1f} / {100 * ev[-1][1]:.1f} % ({ev[-1][0]})" if ev else "-"
        cells = [" / ".join(f"{100 * x:.1f}" for x in edges(steps, k)) + " %"
                 for k, _ in PANELS]
        kept = mean([s.get("selection_rate") for s in steps])
        out.append(f"| {d} | {method(cfg)} | {acc} | {' | '.join(cells)} | "
                   f"{'all' if kept != kept else f'{100 * kept:.0f} %'} |")
    tracin = {d: r for d, r in runs.items() if r[1].get("tracin")}
    if tracin:
        out += ["", "| run | hacks kept / all | right answers kept / all | others kept / all | "
                "mean influence: hacks / right / others |", "| --- | --- | --- | --- | --- |"]
    for d, (_, _, enc) in tracin.items():
        c = kept_counts(d, enc)
        share = [f"{k} of {n} ({100 * k / max(n, 1):.0f} %)" for n, k, _ in c.values()]
        infl = " / ".join(f"{s / n:+.2e}" if n else "-" for n, _, s in c.values())
        out.append(f"| {d} | {' | '.join(share)} | {infl} |")
    return "\n".join(out)


def make_figure(runs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.8))
    colors, seen = {"GRPO": "tab:red", "TracIn pg": "tab:blue", "TracIn nll": "tab:green"}, {}
    for d, (log, cfg, _) in runs.items():
        name = method(cfg)  # one colour per validation loss, one more per other batch size
        color = seen.get(name) or colors.pop(name.split(",")[0], None) or f"C{len(seen) + 4}"
        for ax, (key, _) in zip(axes, PANELS):
            pts = [s for s in log if key in s]
            ax.plot([p["iter"] for p in pts], moving_average([p[key] for p in pts], SMOOTH), "-",
                    color=color, alpha=0.8, label=None if name in seen else name)
        seen[name] = color
    for ax, (_, title) in zip(axes, PANELS):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle(f"Countdown on a hackable verifier: one line per run ({SMOOTH}-step moving "
                 "averages)")
    fig.tight_layout()
    return fig


def main(argv):
    run_dirs, opts = split_args(argv, {"out": ""}, USAGE)
    if not run_dirs:
        raise UserError("no run directory given; usage: python -m analysis.hack RUN_DIR "
                        "[RUN_DIR ...] [--out=hack.png]")
    ours = lambda p: has_mark(p, (MARK.encode(),))  # noqa: E731
    if opts["out"]:
        figure_format(opts["out"], "out")
        check_new_file(opts["out"], "--out", ours, "analysis.hack")
        if not has_matplotlib():
            raise UserError("--out needs matplotlib: pip install matplotlib")
    runs = {d: load_run(d) for d in run_dirs}  # every run read before anything is written
    print(tables(runs))
    if opts["out"]:
        print(f"wrote {save_figure(make_figure(runs), opts['out'], MARK, ours, 'analysis.hack')}")


if __name__ == "__main__":
    cli_main(main)
