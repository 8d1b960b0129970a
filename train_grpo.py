"""
GRPO (Group Relative Policy Optimization, DeepSeekMath arXiv 2402.03300)
with LoRA on the base GPT.

    python train_grpo.py config/tiny_grpo.py  # trains a missing base first
    python train_grpo.py --out_dir=out/grpo --init_from=resume
    torchrun --standalone --nproc_per_node=2 train_grpo.py config/tiny_grpo.py
    # (2 processes: scale/distributed.py)

One step (grpo_step), in the order it runs; the parts live in grpo.py:
  1. take batch_size prompts (Run.step draws and encodes them),
     each repeated group_size times
  2. PASS 1 sampling, no grad: KV-cache generation, token ids only
     (make_rollouts -> model.generate)
  3. rewards -> compute_group_advantages (make_rollouts):
     A_i = (r_i - mean_group) / std_group
  4. PASS 3 reference, no grad: the same model with LoRA disabled
     (no second copy of the weights), over the whole batch before pass 2,
     so its activations are gone before any graph is built
  5. PASS 2 policy, with grad: per-token log-probs of the completion
     tokens (completion_logprobs)
  6. loss (grpo_loss): clipped surrogate + beta * k3 KL, aggregated
     per loss_type; backward.
     5-6 run per micro-batch (policy_backward); with tracin=True,
     tracin.tracin_backward instead keeps only the gradient
     of the rollouts that help a validation batch
  7. clip the gradient, AdamW on LoRA parameters only;
     skip the step if anything is NaN/Inf (update)
Every large tensor is deleted as soon as it has been used;
each `del` says what it frees.
"""
# configurator first: a Ctrl-C during the slow imports below (torch)
# is one line, not a traceback
from configurator import Interrupted, UserError, check, cli_main, configure, quiet_start
quiet_start(__name__)
import json
import os
import random
import time
from contextlib import nullcontext
from dataclasses import replace
from functools import partial

import torch

from data.curriculum import from_config
from scale import compiled, distributed
from grpo import (PhaseTimer, Prompts, StepResult, grpo_updates,
                  make_rollouts, update)
from runs.metrics import NoSignal, print_step, rollout_record, step_log
from lora import apply_lora, lora_parameters, lora_state_dict
from scale.device import check_device, memory_stats
from runs.checkpoint import (CheckpointWriteError, load_adapter, load_checkpoint,
                             save_checkpoint)
from runs.base import base_identity, check_same_base, resolve_base
from checks.grpo_knobs import (check_rewards_read, check_sampling_cache,
                               step_knobs, validate)
from runs.rundir import refuse_existing_run, rewind, run_lock, stop_note
from data.tasks import TASKS, planted_answer, portable_path, resolve_data_dir
from data.datadir import bound_data, check_task_data
from model import NonFiniteLogits
from rewards import RewardCache
from data.prompts import encode_prompt
from tracin import reference_solutions, tracin_backward
import train_base
from runs.loading import base_to_train, check_lora, load_frozen_base, nonfinite_weight
from train_base import evaluate, get_lr

# -----------------------------------------------------------------------------
# default config values (override with a config file and/or --key=value)
out_dir = "out/grpo"
# 'base': new LoRA on base_ckpt; 'resume': continue from out_dir/ckpt.pt
init_from = "base"
# base_ckpt may also be a Hugging Face directory (pretrained/hf.from_pretrained)
base_ckpt = "out/base/ckpt.pt"
base_config = "config/tiny_base.py"  # trains the base when base_ckpt is missing
# 'arith' (data/gsm_synth), 'gsm8k', 'countdown' (data/tasks.py): the base's
# own if train_base.py made it (arith, countdown); else any
task = "arith"
data_dir = ""  # the task's data, for a Hugging Face base ('' = tasks.task_data's)
seed = 1337
device = "cpu"
# 'bfloat16': frozen base weights in bf16 under bf16 autocast
#   (LoRA, AdamW, log-probs, loss, influence stay float32);
# 'float32'; 'auto': bf16 where it runs fast
#   (CUDA with bf16, CPUs with AMX / AVX512-BF16)
dtype = "auto"
# GRPO
batch_size = 8         # prompts per step
group_size = 8         # completions per prompt (G); advantages relative in a group
micro_batch_size = 32  # completions per forward/backward; gradients accumulate
max_new_tokens = 40
temperature = 1.0      # sampling; log-probs use logits / temperature to match
top_k = 0              # 0 = off
top_p = 1.0
beta = 0.04            # KL weight; 0 skips the reference pass entirely
epsilon_low = 0.2      # clip ratio to [1 - epsilon_low, 1 + epsilon_high]
epsilon_high = 0.2
# TRL's names: 'grpo' (mean per completion), 'dapo' (per batch token),
# 'bnpo' (per micro-batch token), 'dr_grpo' (sum / (N * max_new_tokens))
loss_type = "grpo"
# mu: updates per generation; > 1: old log-probs after it, clipping acts
num_iterations = 1
# 'token' ratios, or 'sequence' (GSPO: one per completion)
importance_sampling_level = "token"
use_bias_correction_kl = False  # k3 KL times the ratio (TRL's default: True)
scale_rewards = "group"  # 'group' / 'batch' std, or 'none' (Dr. GRPO)
advantage_epsilon = 0.0  # A = (r - mean) / (std + advantage_epsilon); TRL: 1e-4
reward_cache = True      # a completion (text, answer) seen before: not rescored
# score on a thread during the reference pass: pays off for slow rewards
background_rewards = False
# easy -> hard levels 'steps:max_operand', e.g. '1:20,2:20,3:20'
# (data/curriculum.py); '' = prompts from the base's train split
curriculum = ""
curriculum_threshold = 0.5  # next level when moving train accuracy reaches it
curriculum_window = 10      # steps in that moving mean
# completions that never emitted end-of-text get no loss
mask_truncated_completions = False
reward_funcs = ()    # () = the task's (tasks.TASKS): arith ('correctness', 'format')
reward_weights = ()  # weighted (1.0, 0.1)
# LoRA
lora_r = 8
lora_alpha = 16
lora_dropout = 0.0  # off in RL: it would make logp and ref noisy (trl#3500)
lora_targets = ("c_attn", "c_proj", "c_fc")
grad_checkpoint = False
compile = False  # torch.compile decode steps (scale/compiled.py): long runs only
# optimisation: AdamW over LoRA parameters, warmup then cosine
max_iters = 100
learning_rate = 3e-3
min_lr = 3e-4
# min_lr reached here; 0 = max_iters (set it to stop early and resume)
lr_decay_iters = 0
warmup_iters = 5
weight_decay = 0.0
grad_clip = 1.0
# logging / evaluation / checkpoints
log_interval = 1
# greedy accuracy, pass@eval_k on the test split; also at start and end
eval_interval = 50
eval_n = 500
eval_k = 4
ckpt_interval = 25
max_skipped_steps = 5  # this many NaN/Inf steps in a row stop the run
# TracIn-GRPO (tracin.py): train only on rollouts whose gradient helps
# a validation batch
tracin = False
tracin_val_batch_size = 4  # validation prompts per step
# 'pg': GRPO policy-gradient loss of group_size samples per val prompt
# (the TracIn-GRPO guide); 'nll': NLL of their clean reference solutions
tracin_val_loss = "pg"
# 'positive': influence > 0; 'topk': the top tracin_topk_frac
tracin_selection = "positive"
tracin_topk_frac = 0.5
# 'summed': <g_i, sum of val gradients> from one backward;
# 'matrix': the row sums of the full [n, n_val] ghost matrix
tracin_influence = "summed"
# a planted defect: this share of training problems carry a wrong answer
# that the reward trusts (Run.__init__ draws it and says what it is)
defect_frac = 0.0
# -----------------------------------------------------------------------------
defaults = {k: v for k, v in dict(globals()).items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str, tuple))}


def grpo_step(model, optimizer, enc, batch, cfg, generator, amp,
              val=None, cache=None, decode=None):
    """One GRPO step (the module docstring's steps) on a grpo.Prompts batch.
    TracIn: `val`, the validation batch, grpo.Prompts to sample with the
    batch ('pg') or the Rollouts of reference solutions ('nll').
    amp: the precision every pass computes in; decode: sampling's compiled
    decode step (compile=True; Run builds it once), None: eager.
    -> (rollouts, None if sampling failed;
        grpo.StepResult, with the phases' seconds)."""
    timer = PhaseTimer("generation", "reward", "policy", "reference")
    sampled_val = isinstance(val, Prompts)  # 'pg': val rollouts sampled too
    batches = [batch, val] if sampled_val else [batch]
    try:  # 2-3: one generate call for every prompt, then rewards and advantages
        rollouts, *val_rollouts = make_rollouts(
            model, enc, batches, cfg, generator,
            cache=cache, decode=decode, timer=timer, amp=amp)
    except NonFiniteLogits as e:  # weights blown up: nothing to learn here
        print(f"warning: {e}; step skipped, weights untouched")
        skipped = StepResult(skip_reason="non-finite logits",
                             times=timer.seconds)
        return None, skipped
    # 4-7 x num_iterations: reference, policy, loss, backward; AdamW
    if not cfg["tracin"]:
        stats, grad_norm, skip_reason = grpo_updates(
            model, optimizer, rollouts, cfg, timer, amp)
        result = StepResult(stats, grad_norm, skip_reason,
                            times=timer.seconds)
        return rollouts, result
    # 4-6 with per-sample gradients, against the validation loss;
    # 7 on the kept rollouts only
    val_batch = val_rollouts[0] if sampled_val else val
    stats, influence, keep, skip_reason = tracin_backward(
        model, optimizer, rollouts, val_batch, cfg, timer, amp)
    rollouts = replace(rollouts, influence=influence, selected=keep)
    apply = skip_reason is None and bool(keep.any())
    grad_norm, nonfinite = update(model, optimizer, cfg, stats, apply, timer)
    extra = {}
    if sampled_val:
        extra = {"val/reward": val_batch.rewards.nanmean().item()}
    result = StepResult(stats, grad_norm, skip_reason or nonfinite, extra,
                        timer.seconds)
    return rollouts, result


# -----------------------------------------------------------------------------
def train_missing_base(base_ckpt, base_config, device, resuming=False):
    """A fresh clone: train_base.py trains the tiny base first, where
    base_config puts it (runs/loading.base_to_train says whether;
    any other missing base is refused there)."""
    base_out = train_base.defaults["out_dir"]
    argv = base_to_train(base_ckpt, base_config, base_out, resuming)
    if argv is None:
        return
    print(f"base model not found at {base_ckpt}: "
          f"training it first with {base_config}")
    try:
        train_base.main([*argv, f"--device={device}"])
    except UserError as e:  # a knob of the base's config file: named as such
        raise UserError(f"training the base with base_config {base_config}: "
                        f"{e}") from None


def prepare_base(cfg, out, resume):
    """The frozen base model (dropout off), its data and tokenizer.
    An adapter being resumed must have been trained on exactly this base
    (weights, configuration, tokenizer: runs/base.py), and every
    prompt + max_new_tokens must fit.
    Returns base_identity(...), not its fingerprint."""
    ckpt_path = os.path.join(out, "ckpt.pt")
    # found as every script finds a run's base; --base_ckpt=PATH if it moved
    if resume is not None:
        moved = cfg["base_ckpt"] != resume["base_ckpt"]
        given = cfg["base_ckpt"] if moved else ""
        cfg["base_ckpt"] = resolve_base(resume, ckpt_path, given)
    # a fresh clone: the tiny base is trained first, by train_base.py
    train_missing_base(cfg["base_ckpt"], cfg["base_config"], cfg["device"],
                       resume is not None)
    model, fingerprint, data_dir, enc, splits = load_frozen_base(
        cfg["base_ckpt"], cfg["grad_checkpoint"], cfg["data_dir"],
        cfg["dtype"], cfg["task"])
    identity = base_identity(fingerprint, model, enc)
    if resume is not None:
        check_same_base(resume, ckpt_path, identity, cfg["base_ckpt"])
    # a train_base.py base's data
    own = "" if os.path.isdir(cfg["base_ckpt"]) else cfg["base_ckpt"]
    # the one actually read (its own, or a default)
    check_task_data(data_dir, cfg["task"], base=own)
    # every reward reads the task's answers
    check_rewards_read(cfg, splits["train"][0]["answer"])
    lengths = ((len(encode_prompt(enc, e["question"])), s, n + 1)
               for s, rows in splits.items() for n, e in enumerate(rows))
    longest, split, line = max(lengths)
    block = model.config.block_size
    question = splits[split][line - 1]["question"]
    path = os.path.join(data_dir, split + ".jsonl")
    where = f"line {line} of {path} ({question[:50]!r}...)"
    # no max_new_tokens could help: the question itself is at fault
    if longest >= block:
        raise UserError(f"the question at {where} is {longest} tokens, "
                        f"the base's whole context {block}: remove it")
    if longest + cfg["max_new_tokens"] > block:
        raise UserError(
            f"config key 'max_new_tokens' = {cfg['max_new_tokens']} "
            f"is not allowed: the longest question, {longest} tokens "
            f"at {where}, + max_new_tokens must fit the base's context "
            f"of {block}: give at most {block - longest}, "
            "or remove that question")
    # before iteration 0
    check_sampling_cache(cfg, model, longest, train_base.EVAL_BATCH)
    return model, identity, data_dir, enc, splits


def main(argv):
    cfg = configure(defaults, argv)
    resume = None
    # the saved run's config; only what argv gives overrides it
    if cfg["init_from"] == "resume":
        check(cfg, "out_dir", cfg["out_dir"] != "",
              "give the directory of the run to resume")
        resume = load_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"))
        kinds = dict(lora=dict, base_ckpt=str, config=dict, optimizer=dict,
                     rng=dict, iter_num=int, train_seconds=(int, float))
        if any(not isinstance(resume.get(k), t) for k, t in kinds.items()):
            raise UserError(
                f"{cfg['out_dir']}/ckpt.pt is not a train_grpo.py checkpoint "
                "(a base model's, or changed since): "
                "give the out_dir of the GRPO run to resume")
        saved = {"base_ckpt": resume["base_ckpt"], **resume.get("config", {})}
        # recorded project-relative
        saved["data_dir"] = resolve_data_dir(saved.get("data_dir", ""))
        # a new --base_ckpt must hold the same weights
        cfg = configure(defaults, argv, saved=saved)
    validate(cfg)
    # torchrun: cuda:LOCAL_RANK
    with distributed.process_group(cfg["device"]) as cfg["device"]:
        # dtype: 'auto' resolved; amp: bf16 autocast, or none
        cfg["dtype"], amp = check_device(cfg["device"], cfg["dtype"])
        # one-line error now if torch.compile cannot build the decode step
        if cfg["compile"]:
            compiled.check_compile(cfg["device"])
        # a second run in this out_dir is refused from here on
        # (rank 0 holds the lock for the job)
        lock = run_lock(cfg["out_dir"]) if distributed.is_main() else nullcontext()
        with lock:
            run = Run(cfg, amp, resume)
            # the saved optimizer state now lives in the optimizer:
            # free the loaded copy
            del resume
            run.train()
    return cfg


class Run:
    """One GRPO run in out_dir: the policy (base + LoRA), its optimizer,
    its two random streams (which prompts, which completions) and the step
    counter; checkpoints hold all of them."""

    def __init__(self, cfg, amp, resume):
        self.cfg, self.out, device = cfg, cfg["out_dir"], cfg["device"]
        # (the other ranks would see rank 0's first files)
        if resume is None and distributed.is_main():
            # any run file: resume it, or use another out_dir
            refuse_existing_run(self.out)
        prepared = prepare_base(cfg, self.out, resume)
        self.model, self.base, self.data_dir, self.enc, splits = prepared
        self.train_split, self.val_split = splits["train"], splits["val"]
        self.test = splits["test"][:cfg["eval_n"]]
        # The planted defect, to see whether TracIn's selection matters:
        # defect_frac of the training problems, drawn here once per seed,
        # carry a wrong reference answer that the correctness reward trusts
        # (data/tasks.planted_answer: arith, the result of the solution's
        # FIRST equation, what stopping early gives; countdown, the
        # target + 1; Run.step hands it out).
        # Whole problems: a problem written several times
        # (countdown_variants) is defective in every row. The run knows
        # which prompts are (Run.step logs the selection's precision),
        # the selector does not; the validation and test answers stay clean.
        questions = (e["question"] for e in self.train_split)
        problems = list(dict.fromkeys(questions))
        n_bad = int(cfg["defect_frac"] * len(problems))
        bad = set(random.Random(cfg["seed"] + 7).sample(problems, n_bad))
        # a problem whose planted answer is its right one (arith: a one-step
        # solution, whose first equation is the answer) carries no defect:
        # it is not counted as one
        task = cfg["task"]
        self.defective = {i for i, e in enumerate(self.train_split)
                          if e["question"] in bad
                          and planted_answer(e, task) != e["answer"]}
        check_lora(self.model, cfg["lora_r"], cfg["lora_targets"])  # before any allocation
        torch.manual_seed(cfg["seed"])  # the LoRA initialisation
        apply_lora(self.model, cfg["lora_r"], cfg["lora_alpha"],
                   cfg["lora_dropout"], cfg["lora_targets"])
        self.model.to(device)
        # every pass computes in this precision (bf16 autocast, or as stored)
        self.amp = amp
        # compile=True: sampling's decode step compiled once,
        # handed to every grpo_step (decode=)
        self.decode = None
        if cfg["compile"]:
            self.decode = compiled.CompiledDecode(self.model, device)
        self.optimizer = torch.optim.AdamW(
            lora_parameters(self.model),
            lr=cfg["learning_rate"],
            weight_decay=cfg["weight_decay"])
        self.rng = random.Random(cfg["seed"])  # the prompts
        generator = torch.Generator(device=device)
        self.generator = generator.manual_seed(cfg["seed"])  # the completions
        self.iter_num, self.elapsed_before = 0, 0.0
        self.last_ckpt, self.t_start = None, time.time()
        # (reward, text, answer) -> score
        self.reward_cache = RewardCache() if cfg["reward_cache"] else None
        # resumed: its data, unchanged
        self.data_fingerprint = bound_data(self.data_dir, resume)
        encode = partial(encode_prompt, self.enc)
        block = self.model.config.block_size
        self.curriculum, test = from_config(cfg, self.data_dir, encode, block,
                                            self.train_split)
        self.test = test or self.test  # with a curriculum, its last level's
        if resume is not None:
            self.restore(resume)
        n_lora = sum(p.numel() for p in lora_parameters(self.model))
        n_base = self.model.num_params() / 1e6
        distributed.print0(f"GRPO: {n_base:.2f}M base parameters frozen, "
                           f"{n_lora} LoRA parameters trained")

    def restore(self, resume):
        load_adapter(self.model, resume["lora"])
        try:
            self.optimizer.load_state_dict(resume["optimizer"])
            self.rng.setstate(resume["rng"]["python"])
        # another model's groups, a damaged state
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(
                f"{self.out}/ckpt.pt: its optimizer or random state does not "
                f"fit ({type(e).__name__}: {e}); resume another run") from None
        self.iter_num = self.last_ckpt = resume["iter_num"]
        self.elapsed_before = resume["train_seconds"]
        # one given only now, or with fewer levels, starts at its first level
        if self.curriculum:
            self.curriculum.load_state_dict(resume.get("curriculum"),
                                            verbose=distributed.is_main())
        here = self.generator.device.type
        saved_on = resume["rng"].get("device", here)
        if saved_on == here:
            self.generator.set_state(resume["rng"]["generator"])
        else:  # a CPU generator's state does not fit a CUDA one (nor back)
            seed = self.cfg["seed"] + self.iter_num
            print(f"warning: run saved on {saved_on}, resumed on {here}: "
                  f"completions are sampled from seed {seed} from here on, "
                  "so they differ from an uninterrupted run")
            self.generator.manual_seed(seed)
        # log lines and checkpoints after ckpt.pt: that work is redone
        if distributed.is_main():
            rewind(self.out, self.iter_num)
            print(f"resuming {self.out} at iter {self.iter_num}")

    def lr_at(self, it):
        c = self.cfg
        decay_iters = c["lr_decay_iters"] or c["max_iters"]
        return get_lr(it, decay_iters, c["learning_rate"], c["min_lr"],
                      c["warmup_iters"])

    def checkpoint(self):
        cfg = self.cfg
        curriculum = {}
        if self.curriculum:
            curriculum = {"curriculum": self.curriculum.state_dict()}
        rng = {"python": self.rng.getstate(),
               "generator": self.generator.get_state(),
               "device": self.generator.device.type}
        state = {
            "lora": lora_state_dict(self.model),
            "optimizer": self.optimizer.state_dict(),
            "iter_num": self.iter_num,
            # the rate of the step FROM these weights
            # (TracIn's eta_t pairs theta_t with step t)
            "lr": self.lr_at(self.iter_num),
            "base_ckpt": cfg["base_ckpt"],
            # for runs/base.resolve_base
            "base_abspath": os.path.abspath(cfg["base_ckpt"]),
            # another copy of the project reads its own data
            "config": {**cfg, "data_dir": portable_path(cfg["data_dir"])},
            "data_dir": portable_path(self.data_dir),
            # splits, tokenizer: bound_data
            "data_fingerprint": self.data_fingerprint,
            # what the adapter is bound to
            "base_fingerprint": self.base["tensors"],
            "base_identity": self.base,
            "train_seconds": self.elapsed_before + time.time() - self.t_start,
            **curriculum,
            "rng": rng}
        # the same on every rank (scale/distributed.py): rank 0 writes it
        if distributed.is_main():
            history = f"ckpt_{self.iter_num:06d}.pt"
            # history, for TracIn; latest, for resume
            save_checkpoint(state, os.path.join(self.out, history))
            save_checkpoint(state, os.path.join(self.out, "ckpt.pt"))
        self.last_ckpt = self.iter_num

    def evaluate(self):
        cfg, k = self.cfg, self.cfg["eval_k"]
        # each rank scores its share of the test problems
        # (train_base.evaluate sums them)
        try:
            with self.amp:
                r = evaluate(self.model, self.enc, self.test,
                             cfg["max_new_tokens"], k=k,
                             seed=cfg["seed"], task=cfg["task"])
        except NonFiniteLogits as e:
            print(f"warning: evaluation at iter {self.iter_num} skipped: {e}")
            return {}  # no accuracy rather than a NaN one
        passk = f" | pass@{k} {r[f'pass@{k}']:.3f}" if k > 1 else ""
        accuracy = f"test accuracy {r['accuracy']:.3f}{passk}"
        distributed.print0(f"eval  {self.iter_num:4d} | {accuracy} "
                           f"({len(self.test)} problems)")
        return {f"test/{k}": v for k, v in r.items()}

    def step(self, lr):
        """Draw the prompts (a defective one carries the planted wrong
        answer; with a curriculum, new problems of the current level),
        run grpo_step."""
        cfg, t_step = self.cfg, time.time()
        n = cfg["batch_size"]
        if self.curriculum:
            batch = [self.curriculum.draw(self.rng) for _ in range(n)]
        else:
            train = self.train_split
            picks = [self.rng.randrange(len(train)) for _ in range(n)]
            batch = [train[i] for i in picks]
            for j, i in enumerate(picks):
                if i in self.defective:
                    planted = planted_answer(train[i], cfg["task"])
                    batch[j] = {**train[i], "answer": planted}
        val = self.validation_batch() if cfg["tracin"] else None
        questions = [e["question"] for e in batch]
        answers = [e["answer"] for e in batch]
        encoded = [encode_prompt(self.enc, q) for q in questions]
        prompts = Prompts(encoded, answers, cfg["reward_funcs"],
                          cfg["reward_weights"])
        scored, result = grpo_step(
            self.model, self.optimizer, self.enc, prompts, cfg,
            self.generator, self.amp,
            val=val, cache=self.reward_cache, decode=self.decode)
        log = step_log(scored, result, cfg, self.reward_cache)
        rollouts = None
        if scored is not None:
            rollouts = rollout_record(questions, answers, scored, cfg)
        self.iter_num += 1
        if self.curriculum:
            self.curriculum.after_step(log, self.iter_num,
                                       verbose=distributed.is_main())
        # precision: are the kept rollouts clean?
        if cfg["defect_frac"] > 0 and rollouts is not None:
            clean = torch.tensor([i not in self.defective for i in picks])
            clean = clean.repeat_interleave(cfg["group_size"])
            log["defect/clean_base_rate"] = clean.float().mean().item()
            if cfg["tracin"] and log["n_selected"] > 0:
                kept = clean[torch.tensor(rollouts["selected"])]
                precision = kept.float().mean().item()
                log["defect/selection_precision"] = precision
            rollouts["defective"] = [i in self.defective for i in picks]
        step_seconds = time.time() - t_step
        elapsed = self.elapsed_before + time.time() - self.t_start
        log.update(iter=self.iter_num, lr=lr, step_seconds=step_seconds,
                   elapsed=elapsed, **memory_stats(cfg["device"]))
        return log, rollouts

    def validation_batch(self):
        """TracIn's validation batch, as tracin_val_loss says (the one place
        it is read): 'pg', prompts sampled with the step's and scored by the
        task's own rewards (reward_funcs may be hackable); 'nll', their
        clean reference solutions as rollouts (no sampling)."""
        cfg, split = self.cfg, self.val_split
        n = cfg["tracin_val_batch_size"]
        rows = [split[self.rng.randrange(len(split))] for _ in range(n)]
        if cfg["tracin_val_loss"] == "nll":
            return reference_solutions(self.enc, rows, cfg["device"])
        task = TASKS[cfg["task"]]
        prompts = [encode_prompt(self.enc, e["question"]) for e in rows]
        answers = [e["answer"] for e in rows]
        return Prompts(prompts, answers, task["rewards"], task["weights"])

    def train(self):
        cfg, out, log_f, roll_f = self.cfg, self.out, None, None
        skipped_in_a_row = 0
        no_signal = NoSignal()
        # a new run evaluates the base model first
        # (a resumed one logged that already)
        try:
            first = None
            if self.last_ckpt is None:
                first = {"iter": 0, "elapsed": 0.0, **self.evaluate()}
            # rank 0 writes, the others write nowhere
            names = ("log.jsonl", "rollouts.jsonl")
            if distributed.is_main():
                log_f, roll_f = (open(os.path.join(out, n), "a") for n in names)
            else:
                log_f, roll_f = (open(os.devnull, "w") for n in names)
            # logged before its checkpoint: a resume never logs it twice
            if first is not None:
                log_f.write(json.dumps(first) + "\n")
                log_f.flush()
                self.checkpoint()  # ckpt_000000: the trajectory starts at the base
            while self.iter_num < cfg["max_iters"]:
                lr = self.lr_at(self.iter_num)
                for g in self.optimizer.param_groups:
                    g["lr"] = lr
                log, rollouts = self.step(lr)
                it = self.iter_num
                last = it == cfg["max_iters"]
                if it % cfg["eval_interval"] == 0 or last:
                    log.update(self.evaluate())
                # a skipped step's rollouts moved no weight: said so
                if rollouts is not None:
                    skipped = {"skipped": True} if log["skipped"] else {}
                    line = {"iter": it, "lr": lr, **rollouts, **skipped}
                    roll_f.write(json.dumps(line) + "\n")
                log_f.write(json.dumps(log) + "\n")
                log_f.flush(); roll_f.flush()
                if it % cfg["log_interval"] == 0 and distributed.is_main():
                    print_step(log, cfg, lr)
                no_signal.after_step(log, verbose=distributed.is_main())
                if log["skipped"]:
                    skipped_in_a_row += 1
                else:
                    skipped_in_a_row = 0
                if skipped_in_a_row >= cfg["max_skipped_steps"]:
                    self.stop_diverged(skipped_in_a_row, log, lr, it)
                # weights that give NaN logits are not kept;
                # those a NaN gradient left untouched are
                ckpt_due = it % cfg["ckpt_interval"] == 0 or last
                if ckpt_due and rollouts is not None:
                    lora = lora_parameters(self.model)
                    if all(torch.isfinite(p).all() for p in lora):
                        self.checkpoint()
                    # a finite gradient times a huge learning rate:
                    # the next sampling says so
                    else:
                        print(f"warning: NaN/Inf LoRA weights at iter {it}: "
                              "no checkpoint written")
        except KeyboardInterrupt:
            raise Interrupted(self.stopped()) from None
        # a full disk: the reason, then how to go on
        except (OSError, CheckpointWriteError) as e:
            filename = getattr(e, "filename", None)
            where = f"{filename}: " if filename else ""
            reason = getattr(e, "strerror", None) or e
            raise UserError(f"{where}{reason}; {self.stopped()}") from None
        # torchrun: another rank ended (kill -9): named, then how to go on
        except RuntimeError as e:
            lost = distributed.lost_peer(e)
            if lost is None:
                raise
            raise UserError(f"{lost}; {self.stopped()}") from None
        finally:
            for f in (log_f, roll_f):
                try:
                    if f is not None:
                        f.close()
                # last flush failed (disk full, said above);
                # earlier lines were flushed
                except OSError:
                    pass
        seconds = self.elapsed_before + time.time() - self.t_start
        distributed.print0(f"done: {self.iter_num} GRPO steps in {seconds:.0f}s; "
                           f"run directory {out}{no_signal.summary()}")

    def stop_diverged(self, skipped_in_a_row, log, lr, it):
        """max_skipped_steps steps in a row skipped: the run stops,
        naming a NaN/Inf base or the knobs that make the adapter diverge."""
        cfg = self.cfg
        base_bad = nonfinite_weight(self.model, adapter=False)
        skipped = (f"{skipped_in_a_row} steps in a row skipped "
                   f"({log['skip_reason']})")
        # no lr helps a base that is NaN/Inf before training
        if base_bad is not None:
            raise UserError(
                f"{skipped}: the base model's weight {base_bad} "
                f"holds NaN/Inf ({cfg['base_ckpt']}); train on a base "
                "whose weights are finite (re-create or re-download it)")
        raise UserError(
            f"{skipped} at iter {it}: the adapter's updates have diverged; "
            f"the last checkpoint is {self.out}/ckpt.pt "
            f"(iter {self.last_ckpt}); "
            f"lower {step_knobs(cfg, lr)} and start a new run")

    def stopped(self):
        """Ctrl-C or a full disk: where the run stopped and the command
        that goes on from there."""
        where = stop_note("train_grpo.py", self.out, self.last_ckpt,
                          remove_files=distributed.is_main())
        return (f"train_grpo.py stopped at iter {self.iter_num} "
                f"of {self.cfg['max_iters']}; {where}")


if __name__ == "__main__":
    cli_main(main)
