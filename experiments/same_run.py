"""
Whether two runs of train_grpo.py did the same thing, times and memory aside: every log.jsonl line
(its time/*, step_seconds, elapsed and mem_* keys left out), every rollouts.jsonl line, and every line
the console printed (each step's milliseconds and MB, the run's seconds and directory left out; a
first run's data preparation and the times of a base trained first too). Used to check that a change
of the code changes no number.

    OMP_NUM_THREADS=1 python train_grpo.py config/tiny_tracin.py --out_dir=A > A.txt  # one commit
    OMP_NUM_THREADS=1 python train_grpo.py config/tiny_tracin.py --out_dir=B > B.txt  # another
    python experiments/same_run.py A A.txt B B.txt      # exit 0: the same run; 1: what differs
"""
import json
import re
import sys

KEPT_OUT = re.compile(r"^(time/|step_seconds$|elapsed$|mem_)")


def log_lines(run):
    with open(f"{run}/log.jsonl") as f:
        return [{k: v for k, v in json.loads(line).items() if not KEPT_OUT.match(k)} for line in f]


def rollout_lines(run):
    with open(f"{run}/rollouts.jsonl") as f:
        return [json.loads(line) for line in f]


def console_lines(path, run):
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("preparing task data") or "problems, vocab" in line:
                continue
            line = re.sub(r"\| [\d.]+ ms \(.*?\) \| mem [\d.]+ MB", "| T | M", line)
            line = re.sub(r"in \d+s;", "in Ns;", line).replace(run, "RUN")
            line = re.sub(r"\| [\d.]+ ms/iter \| \d+s$", "| T", line)  # a base trained first (train_base.py)
            line = re.sub(r"iters in \d+s,", "iters in Ns,", line)
            out.append(line.rstrip())
    return out


def differences(a, b, what):
    """(what, line number, first differing item) of two lists of lines."""
    if len(a) != len(b):
        return [(what, "lines", f"{len(a)} against {len(b)}")]
    return [(what, n + 1, x if not isinstance(x, dict) else
             {k: (x.get(k), y.get(k)) for k in x.keys() | y.keys() if x.get(k) != y.get(k)})
            for n, (x, y) in enumerate(zip(a, b)) if x != y]


def main(argv):
    if len(argv) != 4:
        sys.exit("usage: python experiments/same_run.py RUN_A CONSOLE_A RUN_B CONSOLE_B")
    run_a, out_a, run_b, out_b = argv
    found = (differences(log_lines(run_a), log_lines(run_b), "log.jsonl")
             + differences(rollout_lines(run_a), rollout_lines(run_b), "rollouts.jsonl")
             + differences(console_lines(out_a, run_a), console_lines(out_b, run_b), "console"))
    for what, n, diff in found[:10]:
        print(f"{what} line {n}: {str(diff)[:200]}")
    print("the same run" if not found else f"{len(found)} lines differ")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
