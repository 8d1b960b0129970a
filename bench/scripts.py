"""
What the bench takes from the training scripts without importing them (a script is a leaf: nothing
imports it): their knobs, read from the knobs block as data (its `name = literal` lines, as a config
file holds them; nothing of the script runs), the step's records made from them (knob_records), and
the tiny base, trained by train_base.py in a process
of its own where train_grpo.py would train it first.
"""
import ast
import os
import subprocess
import sys
from dataclasses import fields

from configurator import UserError
from grpo import LossKnobs, StepKnobs
from model import Sampling
from runs.loading import base_to_train
from tracin import TracInKnobs

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script_knobs(script):
    """{knob: default} of a training script of the project (train_grpo.py, train_base.py): the literal
    assignments of its knobs block, up to its `defaults = ...` line, as that `defaults` holds them."""
    with open(os.path.join(PROJECT, script)) as f:
        tree = ast.parse(f.read())
    knobs = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        if any(isinstance(t, ast.Name) and t.id == "defaults" for t in node.targets):
            break  # the end of the knobs block
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError):
            continue  # not a literal: not a knob
        for target in node.targets:  # `beta1, beta2 = 0.9, 0.99` sets two knobs
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = value if isinstance(target, ast.Tuple) else [value]
            knobs.update((n.id, v) for n, v in zip(names, values) if not n.id.startswith("_"))
    return knobs


GRPO_DEFAULTS = script_knobs("train_grpo.py")  # what a train_grpo.py run gets without a config


def knob_records(c):
    """(grpo.StepKnobs, tracin.TracInKnobs or None) of a train_grpo.py config c, each field from the knob of
    its name (TracIn's with 'tracin_' before it), as train_grpo.records builds them (rewards scored beside
    pass 3: never here)."""
    def named(record, prefix="", **given):
        return record(**{f.name: c[prefix + f.name] for f in fields(record) if f.name not in given}, **given)
    sampling = Sampling(temperature=c["temperature"], top_k=c["top_k"] or None, top_p=c["top_p"])
    loss = named(LossKnobs, max_len=c["max_new_tokens"])
    step = named(StepKnobs, sampling=sampling, loss=loss, rewards_during_reference=False)
    return step, named(TracInKnobs, "tracin_") if c["tracin"] else None


def train_missing_base(base_ckpt, device, base_config="config/tiny_base.py"):
    """The tiny base at base_ckpt, trained first where train_grpo.py would train it (runs/loading.
    base_to_train: only where base_config puts it; any other missing base is refused there), by
    train_base.py in its own process."""
    argv = base_to_train(base_ckpt, base_config, script_knobs("train_base.py")["out_dir"])
    if argv is None:
        return
    print(f"base model not found at {base_ckpt}: training it first with {base_config}", flush=True)
    done = subprocess.run([sys.executable, os.path.join(PROJECT, "train_base.py"), *argv, f"--device={device}"])
    if done.returncode != 0:  # train_base.py said why in its own one line, above
        raise UserError(f"training the base with base_config {base_config} failed (train_base.py exited "
                        f"{done.returncode}); the bench rows that need it cannot run")
