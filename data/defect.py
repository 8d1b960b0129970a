"""
The planted defect, to see whether TracIn's selection matters (defect_frac > 0): a share of the training
problems carry a wrong reference answer that the correctness reward trusts. The run knows which prompts
are defective and logs how clean the rollouts it trained on were; the selector does not know; the
validation and test answers stay clean. Where it plugs in: train_grpo.py draws the defective problems
once at set-up (draw_defective), hands their planted answers out with the prompts of each step
(plant) and writes what the step's selection kept (defect_record); the step itself sees only answers.
"""
import random

import torch


def planted_answer(example, task):
    """The planted wrong answer the reward trusts. arith: the result of the solution's first equation
    ("8-7=1" -> 1), what stopping early gives. countdown: the target plus one, so the reward accepts an
    equation that overshoots the target by one and refuses the one that makes it."""
    if task == "countdown":
        numbers, target = example["answer"]
        return (numbers, target + 1)  # hashable, as load_task_split gives it
    return int(example["solution"].split("\n")[0].split("=")[1])


def draw_defective(train, defect_frac, seed, task):
    """The indices of the defective rows of the train split: int(defect_frac x its problems) drawn
    once per seed, less those whose planted answer is right (below). Whole problems: a problem written several times (countdown_variants) is defective in
    every row. A problem whose planted answer is its right one (arith: a one-step solution, whose
    first equation is the answer) carries no defect: it is not counted as one."""
    problems = list(dict.fromkeys(e["question"] for e in train))
    n_bad = int(defect_frac * len(problems))
    bad = set(random.Random(seed + 7).sample(problems, n_bad))
    return {i for i, e in enumerate(train) if e["question"] in bad and planted_answer(e, task) != e["answer"]}


def plant(train, picks, defective, task):
    """The rows of the train split at `picks`, a defective one with its planted answer."""
    return [{**train[i], "answer": planted_answer(train[i], task)} if i in defective else train[i]
            for i in picks]


def defect_record(log, rollouts, picks, defective, cfg):
    """How clean the step's rollouts were, into its log line: the share of clean rollouts, and with
    TracIn the share of clean ones among those it kept (the selection's precision: only where the
    step kept some and updated on them; a skipped step moved no weight); which prompts were
    defective, into its rollouts.jsonl line."""
    clean = torch.tensor([i not in defective for i in picks]).repeat_interleave(cfg["group_size"])
    log["defect/clean_base_rate"] = clean.float().mean().item()
    if cfg["tracin"] and log["n_selected"] > 0 and not log["skipped"]:
        kept = clean[torch.tensor(rollouts["selected"])]
        log["defect/selection_precision"] = kept.float().mean().item()
    rollouts["defective"] = [i in defective for i in picks]
