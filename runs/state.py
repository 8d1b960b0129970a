"""
A GRPO run's state from step to step, what its checkpoints hold, and resuming it: train_grpo.py's
Run record (the policy, its optimizer, its random streams, its data and the step counter),
save_run (the checkpoint dict, written as history and as the latest), and load_resume / saved_config /
resumed_base / restore (a run goes on where its ckpt.pt left it, bit-identically). Where it plugs in:
train_grpo.py's set-up builds the Run and restores a resumed one; its loop saves every ckpt_interval.
Nothing here runs inside a step.
"""
import os
import random
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import tiktoken
import torch

from configurator import UserError
from data.curriculum import Curriculum
from data.tasks import portable_path, resolve_data_dir
from lora import lora_state_dict
from rewards import RewardCache
from runs.base import resolve_base
from runs.checkpoint import load_adapter, load_checkpoint, save_checkpoint
from runs.rundir import rewind
from scale import distributed
from scale.compiled import CompiledDecode

# what a train_grpo.py checkpoint holds, and of which type, before a resume reads anything from it
KINDS = dict(lora=dict, base_ckpt=str, config=dict, optimizer=dict, rng=dict, iter_num=int,
             train_seconds=(int, float))


@dataclass
class Run:
    """One GRPO run in out_dir: the policy (base + LoRA) and its optimizer, the data it draws from, its
    random streams (rng: which prompts; generator: which completions; the validation batch's two) and
    the step counter; checkpoints hold all of them (save_run)."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    enc: tiktoken.Encoding      # the tokenizer
    amp: AbstractContextManager  # every pass computes in this precision (bf16 autocast, or as stored)
    decode: CompiledDecode      # sampling's decode step compiled once; None: eager
    rng: random.Random
    generator: torch.Generator
    val_rng: random.Random      # TracIn's validation batch: which prompts, which completions ('pg')
    val_generator: torch.Generator
    reward_cache: RewardCache   # (reward, text, answer) -> score; None: off
    curriculum: Curriculum      # None: prompts from the base's train split
    train: list                 # the splits' rows; test: eval_n of them, or the curriculum's last level
    val: list
    test: list
    defective: set              # rows of train that carry the planted defect (data/defect.py)
    data_dir: str
    data_fingerprint: dict      # what the run is bound to: its data (bound_data) and its base
    base: dict                  # (runs/base.base_identity)
    iter_num: int = 0
    last_ckpt: int = None       # the iteration of the last checkpoint written, None: none yet
    elapsed_before: float = 0.0  # train_seconds of the runs this one resumes
    t_start: float = field(default_factory=time.time)

    def elapsed(self):
        return self.elapsed_before + time.time() - self.t_start


def load_resume(out_dir):
    """out_dir/ckpt.pt, refused unless it is a train_grpo.py checkpoint."""
    resume = load_checkpoint(os.path.join(out_dir, "ckpt.pt"))
    if any(not isinstance(resume.get(k), t) for k, t in KINDS.items()):
        raise UserError(f"{out_dir}/ckpt.pt is not a train_grpo.py checkpoint (a base model's, or changed "
                        "since): give the out_dir of the GRPO run to resume")
    return resume


def saved_config(resume):
    """The saved run's config, its data directory recorded project-relative read as this copy's."""
    saved = {"base_ckpt": resume["base_ckpt"], **resume.get("config", {})}
    saved["data_dir"] = resolve_data_dir(saved.get("data_dir", ""))
    return saved


def resumed_base(cfg, resume):
    """The base of a resumed run, found as every script finds a run's base (--base_ckpt=PATH if it
    moved; the adapter is checked against it once loaded)."""
    moved = cfg["base_ckpt"] != resume["base_ckpt"]
    given = cfg["base_ckpt"] if moved else ""
    return resolve_base(resume, os.path.join(cfg["out_dir"], "ckpt.pt"), given)


def restore(run, resume, cfg):
    """The saved adapter, optimizer, random streams, step counter and curriculum level into `run`;
    the log lines and checkpoints written after ckpt.pt dropped (that work is redone)."""
    load_adapter(run.model, resume["lora"])
    val = resume["rng"].get("validation")  # None: saved before the validation batch had its own
    try:
        run.optimizer.load_state_dict(resume["optimizer"])
        run.rng.setstate(resume["rng"]["python"])
        if val is not None:
            run.val_rng.setstate(val["python"])
    except (ValueError, KeyError, TypeError) as e:  # another model's groups, a damaged state
        raise UserError(f"{cfg['out_dir']}/ckpt.pt: its optimizer or random state does not fit "
                        f"({type(e).__name__}: {e}); resume another run") from None
    run.iter_num = run.last_ckpt = resume["iter_num"]
    run.elapsed_before = resume["train_seconds"]
    if run.curriculum:  # one given only now, or with fewer levels, starts at its first level
        run.curriculum.load_state_dict(resume.get("curriculum"), verbose=distributed.is_main())
    here = run.generator.device.type
    saved_on = resume["rng"].get("device", here)
    if saved_on == here:
        run.generator.set_state(resume["rng"]["generator"])
    else:  # a CPU generator's state does not fit a CUDA one (nor back)
        seed = cfg["seed"] + run.iter_num
        print(f"warning: run saved on {saved_on}, resumed on {here}: completions are sampled from seed "
              f"{seed} from here on, so they differ from an uninterrupted run")
        run.generator.manual_seed(seed)
    if val is not None and saved_on == here:
        run.val_generator.set_state(val["generator"])
    elif val is None and cfg["tracin"]:
        print("warning: ckpt.pt holds no state of the validation batch's random streams (saved by an "
              "older version): they start again from the seed, so validation batches differ from an "
              "uninterrupted run's")
    if distributed.is_main():
        rewind(cfg["out_dir"], run.iter_num)
        print(f"resuming {cfg['out_dir']} at iter {run.iter_num}")


def save_run(run, cfg, lr):
    """A checkpoint of the run at run.iter_num: ckpt_NNNNNN.pt (the history, for TracIn) and ckpt.pt
    (the latest, for resume). lr, stored as 'lr': the rate of the step FROM these weights, the
    schedule's lr_at(iter_num) (post-hoc TracIn's eta_t pairs theta_t with step t; the last
    checkpoint's is that of a step the run never takes). The same on every rank
    (scale/distributed.py): rank 0 writes it."""
    curriculum = {"curriculum": run.curriculum.state_dict()} if run.curriculum else {}
    validation = {"python": run.val_rng.getstate(), "generator": run.val_generator.get_state()}
    rng = {"python": run.rng.getstate(), "generator": run.generator.get_state(),
           "device": run.generator.device.type, "validation": validation}
    state = {
        "lora": lora_state_dict(run.model),
        "optimizer": run.optimizer.state_dict(),
        "iter_num": run.iter_num,
        "lr": lr,
        "base_ckpt": cfg["base_ckpt"],
        "base_abspath": os.path.abspath(cfg["base_ckpt"]),  # for runs/base.resolve_base
        # another copy of the project reads its own data
        "config": {**cfg, "data_dir": portable_path(cfg["data_dir"])},
        "data_dir": portable_path(run.data_dir),
        "data_fingerprint": run.data_fingerprint,  # splits, tokenizer: bound_data
        "base_fingerprint": run.base["tensors"],  # what the adapter is bound to
        "base_identity": run.base,
        "train_seconds": run.elapsed(),
        **curriculum,
        "rng": rng}
    if distributed.is_main():
        save_checkpoint(state, os.path.join(cfg["out_dir"], f"ckpt_{run.iter_num:06d}.pt"))
        save_checkpoint(state, os.path.join(cfg["out_dir"], "ckpt.pt"))
    run.last_ckpt = run.iter_num
