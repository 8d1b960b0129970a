"""
Loading what a run stands on, for every script: a base model (a train_base.py checkpoint or a Hugging
Face directory) with its tokenizer and data (load_base), a GRPO run's policy, its adapter on that base
(load_policy: sampling, attribution, export, figures), and train_grpo.py's frozen base (base_to_train:
whether and how train_grpo.py trains a missing tiny base first; load_frozen_base). check_lora refuses by
name what lora.apply_lora would fail on (targets, memory), before it runs.
"""
import os
import re
import shlex

import torch

from configurator import UserError, read_config_file
from data.datadir import check_task_data, load_tokenizer
from data.tasks import load_task_split, resolve_data_dir, set_instruction, task_data
from lora import apply_lora, merge_lora, targeted_linears
from pretrained.hf import from_pretrained
from runs.checkpoint import base_fingerprint, load_adapter, load_checkpoint, model_from_checkpoint
from pretrained.tokenizer import load_hf_tokenizer
from runs.base import base_exists, base_identity, check_same_base, resolve_base
from scale import distributed


def load_base(path, data_dir="", dtype=torch.float32, ckpt=None, **overrides):
    """(model, tokenizer, data_dir) of a base model: a train_base.py checkpoint (with its task's
    tokenizer and data), or a Hugging Face model directory (pretrained/hf.from_pretrained, its own tokenizer,
    and data_dir as given: '' = none yet, see tasks.task_data), in `dtype` (a checkpoint's stays float32:
    cast it after its fingerprint; ckpt: the checkpoint at path, if already loaded). overrides: GPTConfig fields."""
    if not os.path.isdir(path):
        ckpt = ckpt if ckpt is not None else load_checkpoint(path)
        own = resolve_data_dir(ckpt.get("data_dir", ""))  # recorded relative to the project: this copy's data
        if data_dir and os.path.abspath(data_dir) != os.path.abspath(own):
            raise UserError(f"data_dir={data_dir} is for a Hugging Face base directory; the base checkpoint "
                            f"{path} was trained on its own task data ({own}): leave data_dir ''")
        model = model_from_checkpoint(ckpt, path, **overrides)
        return model, load_tokenizer(own), own
    model, enc = from_pretrained(path, dtype, **overrides), load_hf_tokenizer(path)
    if enc.n_vocab > model.config.vocab_size:
        raise UserError(f"{path}: the tokenizer has {enc.n_vocab} tokens but the model only "
                        f"{model.config.vocab_size} embedding rows: tokenizer and weights do not belong together")
    return model, enc, data_dir


def load_policy(ckpt_path, device="cpu", merge=False, base_ckpt=""):
    """(model, tokenizer, data_dir) from a base (checkpoint or Hugging Face directory) or a GRPO
    checkpoint. merge=True folds the adapter into the base weights (W + s B A): plain nn.Linear
    layers, so sampling pays no LoRA matmuls. base_ckpt: a GRPO checkpoint's base where it is now
    ('' = found by runs/base.resolve_base, as every script finds it)."""
    ckpt = None if os.path.isdir(ckpt_path) else load_checkpoint(ckpt_path)
    if ckpt is None or "lora" not in ckpt:
        if base_ckpt:
            raise UserError(f"base_ckpt={base_ckpt} names the base of a GRPO checkpoint; {ckpt_path} is a base "
                            f"model itself: leave base_ckpt ''")
        model, enc, data_dir = load_base(ckpt_path, ckpt=ckpt)
        return model.to(device).eval(), enc, data_dir
    cfg = ckpt["config"]  # a GRPO checkpoint: the adapter on top of the base it was trained from
    base_path = resolve_base(ckpt, ckpt_path, base_ckpt)
    model, enc, data_dir = load_base(base_path, resolve_data_dir(ckpt.get("data_dir", "")))
    set_instruction(enc, cfg.get("task", "arith"))  # the run's prompts
    # the adapter is bound to the base's weights, configuration and tokenizer: any change is refused by name
    check_same_base(ckpt, ckpt_path, base_identity(base_fingerprint(base_path, model), model, enc), base_path)
    check_lora(model, cfg["lora_r"], cfg["lora_targets"])
    apply_lora(model, cfg["lora_r"], cfg["lora_alpha"], 0.0, cfg["lora_targets"])
    load_adapter(model, ckpt["lora"])
    if merge:
        merge_lora(model)
    return model.to(device).eval(), enc, data_dir


def check_lora_targets(targets):
    """Each of lora_targets a layer name or a regex (lora.targeted_linears reads it as both)."""
    for t in targets:
        try:
            re.compile(t)
        except (re.error, TypeError) as e:
            raise UserError(f"LoRA target {t!r} is neither a layer name nor a valid regex ({e})") from None


def check_lora(model, r, targets):
    """What lora.apply_lora(model, r, ..., targets) needs, refused in one line before it runs: targets
    that name nn.Linear layers of this model, and memory for their adapters, A (r, d_in) and B (d_out, r)
    a layer, all held at once as apply_lora holds them (then freed: apply_lora allocates its own)."""
    targets = [targets] if isinstance(targets, str) else list(targets)
    check_lora_targets(targets)
    names = targeted_linears(model, targets)
    if not names:
        linear = sorted({n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise UserError(f"LoRA targets {targets} match no nn.Linear in the model (its linear layers: {linear})")
    held = []
    for name in names:
        base = model.get_submodule(name)
        try:
            held += [torch.empty(r, base.in_features, device=base.weight.device),
                     torch.empty(base.out_features, r, device=base.weight.device)]
        except (RuntimeError, MemoryError) as e:
            first_line = (str(e).splitlines() or [""])[0][:160]
            raise UserError(f"cannot allocate a LoRA adapter of rank r={r} on {name}: {first_line}; "
                            "lower it") from None
    del held  # the memory apply_lora takes next


def nonfinite_weight(model, adapter=None):
    """The name of the first weight holding NaN/Inf, or None; adapter True: the LoRA weights only,
    False: the base's only, None: every one."""
    return next((n for n, p in model.named_parameters()
                 if adapter in (None, ".lora_" in n) and not torch.isfinite(p).all()), None)


def base_to_train(base_ckpt, base_config, default_out, resuming=False):
    """For train_grpo.py: None if base_ckpt exists; else train_base.py's arguments that train it,
    when base_ckpt is where base_config puts it (a fresh clone; default_out: train_base.py's own
    out_dir). Any other missing base is an error, never a silent long training (a typo'd path),
    and so is a missing base on resume."""
    if base_exists(base_ckpt):  # (a dangling symbolic link is refused, never trained over)
        return None
    if not base_ckpt.endswith(".pt"):  # a model directory: downloaded by the user, never at run time
        raise UserError(f"model directory {base_ckpt} not found: download it once with huggingface-cli download "
                        f"ORG/MODEL --local-dir {base_ckpt} (README: Use a pretrained model)")
    where = read_config_file(base_config).get("out_dir", default_out)
    if not isinstance(where, str) or not where:
        raise UserError(f"base_config {base_config}: out_dir = {where!r} is not a directory's path")
    where = os.path.join(where, "ckpt.pt")
    out_dir = os.path.dirname(base_ckpt) or "."
    # train_base.py writes out_dir/ckpt.pt: a base_ckpt of another name is then given as that file
    train = f"python train_base.py {shlex.quote(base_config)} --out_dir={shlex.quote(out_dir)}" + (
        "" if os.path.basename(base_ckpt) == "ckpt.pt" else
        f", then give --base_ckpt={shlex.quote(os.path.join(out_dir, 'ckpt.pt'))}")
    if resuming or os.path.normpath(where) != os.path.normpath(base_ckpt):
        raise UserError(f"base_ckpt {base_ckpt} not found" + (
            " (the base this run was trained on: put it back, or name where it is now with --base_ckpt=PATH)"
            if resuming else f"; train it with: {train} (only {where}, where base_config puts it, is trained "
                             f"automatically)"))
    if distributed.launched():  # every rank would train its own copy into the same file
        raise UserError(f"base_ckpt {base_ckpt} not found; train it first, in one process: {train}")
    return [base_config, f"--out_dir={out_dir}"]


def load_frozen_base(base_ckpt, grad_checkpoint=False, data_dir="", dtype="float32", task="arith"):
    """For train_grpo.py: (model, fingerprint of its weights, data_dir, tokenizer, splits). Dropout is
    off: with it on, GRPO's policy and reference passes would see different random masks. data_dir:
    the task's data for a Hugging Face base (tasks.task_data). dtype 'bfloat16': the frozen weights are
    stored in bf16, so no step casts them again (the fingerprint is of the weights as saved)."""
    model, enc, data_dir = load_base(base_ckpt, data_dir, getattr(torch, dtype), dropout=0.0,
                                     grad_checkpoint=grad_checkpoint)
    fingerprint = base_fingerprint(base_ckpt, model)
    data_dir = task_data(task, data_dir)
    splits = {s: load_task_split(data_dir, s) for s in ("train", "val", "test")}
    set_instruction(enc, task)
    return model.to(getattr(torch, dtype)), fingerprint, data_dir, enc, splits


def frozen_base(cfg, resume=None):
    """train_grpo.py's base (load_frozen_base) with what it reads: (model, base_identity(...), data_dir,
    tokenizer, splits). An adapter being resumed (resume: its checkpoint) must have been trained on
    exactly this base (weights, configuration, tokenizer: runs/base.py)."""
    model, fingerprint, data_dir, enc, splits = load_frozen_base(
        cfg["base_ckpt"], cfg["grad_checkpoint"], cfg["data_dir"], cfg["dtype"], cfg["task"])
    identity = base_identity(fingerprint, model, enc)
    if resume is not None:
        check_same_base(resume, os.path.join(cfg["out_dir"], "ckpt.pt"), identity, cfg["base_ckpt"])
    own = "" if os.path.isdir(cfg["base_ckpt"]) else cfg["base_ckpt"]  # a train_base.py base's data
    check_task_data(data_dir, cfg["task"], base=own)  # the one actually read (its own, or a default)
    return model, identity, data_dir, enc, splits
