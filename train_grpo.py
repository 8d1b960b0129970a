"""
GRPO (Group Relative Policy Optimization, DeepSeekMath arXiv 2402.03300)
with LoRA on the base GPT.

    python train_grpo.py config/tiny_grpo.py  # trains a missing base first
    python train_grpo.py --out_dir=out/grpo --init_from=resume
    torchrun --standalone --nproc_per_node=2 train_grpo.py config/tiny_grpo.py
    # (2 processes: scale/distributed.py)

One step (grpo_step), in the order it runs; the parts live in grpo.py:
  1. take batch_size prompts (the loop draws and encodes them),
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
The config is this script's: `records` builds what the step reads from it
(grpo.StepKnobs, tracin.TracInKnobs) once, by keyword; no function of the
lecture sees the config.
"""
# configurator first: a Ctrl-C during the slow imports below (torch)
# is one line, not a traceback
from configurator import Interrupted, UserError, check, cli_main, configure, quiet_start
quiet_start(__name__)
import json
import random
import time
from contextlib import nullcontext
from dataclasses import replace
from functools import partial

import torch

import train_base
from checks.grpo_knobs import (check_question_lengths, check_rewards_read, check_sampling_cache,
                               step_knobs, validate)
from data.curriculum import from_config
from data.datadir import bound_data
from data.defect import defect_record, draw_defective, plant
from data.prompts import encode_prompt
from data.tasks import TASKS, task_rewards
from grpo import LossKnobs, Prompts, StepKnobs, StepResult, grpo_updates, make_rollouts
from lora import apply_lora, lora_parameters
from model import NonFiniteLogits, Sampling
from rewards import RewardCache
from runs.checkpoint import CheckpointWriteError
import runs.evaluate  # (its EVAL_BATCH, named in place: a global number here would be a knob)
from runs.evaluate import eval_line, get_lr
from runs.loading import base_to_train, check_lora, frozen_base, nonfinite_weight
from runs.metrics import NoSignal, PhaseTimer, Skips, print_step, rollout_record, step_log
from runs.rundir import close_logs, open_logs, refuse_existing_run, run_lock, stop_note
from runs.state import Run, load_resume, restore, resumed_base, save_run, saved_config
from scale import compiled, distributed
from scale.device import check_device, memory_stats
from tracin import TracInKnobs, reference_solutions, tracin_updates

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
lora_dropout = 0.0  # off in RL: it makes the policy's logp noisy (ref skips LoRA; trl#3500)
lora_targets = ("c_attn", "c_proj", "c_fc")
grad_checkpoint = False
# sampling's decode step compiled (scale/compiled.py): True, False, or None ('auto'): on a GPU
# when the run's predicted saving exceeds the capture time (said at start-up); eager on a CPU
compile = None
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
# this many NaN/Inf steps in a row stop the run (steps with nothing to learn between them do not
# count); a run that skipped more than 9 in 10 of its steps that could learn ends as an error
max_skipped_steps = 5
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
# what 'topk' ranks by: 'cosine', <g_i, G> / ||g_i|| (GradAlign's: the cleaner selection at every
# planted share, docs/experiments.md); 'dot', the influence <g_i, G>
tracin_ranking = "cosine"
# 'summed': <g_i, sum of val gradients> from one backward;
# 'matrix': the row sums of the full [n, n_val] ghost matrix
tracin_influence = "summed"
# a planted defect: this share of training problems carry a wrong answer
# that the reward trusts (data/defect.py: what it is, how it is drawn and logged)
defect_frac = 0.0
# -----------------------------------------------------------------------------
# (None: a knob of no fixed type, compile's True / False / 'auto')
defaults = {k: v for k, v in dict(globals()).items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str, tuple, type(None)))}


def records(cfg):
    """What one step reads, built once from the config, by keyword: (grpo.StepKnobs, and
    tracin.TracInKnobs with tracin=True, else None). Each asserts its RULES when made."""
    loss = LossKnobs(beta=cfg["beta"], epsilon_low=cfg["epsilon_low"],
                     epsilon_high=cfg["epsilon_high"], loss_type=cfg["loss_type"],
                     importance_sampling_level=cfg["importance_sampling_level"],
                     use_bias_correction_kl=cfg["use_bias_correction_kl"],
                     max_len=cfg["max_new_tokens"])
    sampling = Sampling(temperature=cfg["temperature"], top_k=cfg["top_k"] or None,
                        top_p=cfg["top_p"])
    # rewards scored on a thread during pass 3, whose log-probs the one update reuses: only
    # where pass 3 runs (beta != 0) once per generation, and not beside TracIn's capture
    overlap = cfg["background_rewards"] and not cfg["tracin"]
    overlap = overlap and cfg["beta"] != 0 and cfg["num_iterations"] == 1
    step = StepKnobs(group_size=cfg["group_size"], micro_batch_size=cfg["micro_batch_size"],
                     max_new_tokens=cfg["max_new_tokens"], sampling=sampling, loss=loss,
                     num_iterations=cfg["num_iterations"], scale_rewards=cfg["scale_rewards"],
                     advantage_epsilon=cfg["advantage_epsilon"],
                     mask_truncated_completions=cfg["mask_truncated_completions"],
                     grad_clip=cfg["grad_clip"], rewards_during_reference=overlap)
    if not cfg["tracin"]:
        return step, None
    knobs = TracInKnobs(influence=cfg["tracin_influence"], selection=cfg["tracin_selection"],
                        topk_frac=cfg["tracin_topk_frac"], ranking=cfg["tracin_ranking"])
    return step, knobs


def grpo_step(model, optimizer, enc, prompts, step, tracin_knobs, *, generator, amp,
              decode=None, val_prompts=None, val_rollouts=None):
    """One GRPO step (the module docstring's steps) on a grpo.Prompts batch.
    TracIn (tracin_knobs, else None): the validation batch, either
    val_prompts (grpo.Prompts, sampled with the batch: 'pg') or
    val_rollouts (the Rollouts of reference solutions: 'nll').
    amp: the precision every pass computes in; decode: sampling's compiled
    decode step (scale/compiled.py), None: eager.
    -> (rollouts, None if sampling failed;
        grpo.StepResult, with the phases' seconds)."""
    timer = PhaseTimer("generation", "reward", "policy", "reference")
    batches = [prompts] if val_prompts is None else [prompts, val_prompts]
    try:  # 2-3: one generate call for every prompt, then rewards and advantages
        rollouts, *sampled_val = make_rollouts(model, enc, batches, step, generator,
                                               timer=timer, amp=amp, decode=decode)
    except NonFiniteLogits as e:  # weights blown up: nothing to learn here
        print(f"warning: {e}; step skipped, weights untouched")
        skipped = StepResult(skip_reason="non-finite logits", times=timer.seconds)
        return None, skipped
    # 4-7 x num_iterations: reference, policy, loss, backward; AdamW
    if tracin_knobs is None:
        stats, grad_norm, skip_reason = grpo_updates(model, optimizer, rollouts, step,
                                                     timer=timer, amp=amp)
        return rollouts, StepResult(stats, grad_norm, skip_reason, times=timer.seconds)
    # 4-7 on the rollouts whose gradient helps the validation loss (tracin.py)
    sampled = val_prompts is not None  # 'pg': the validation rows were sampled with the batch
    val_batch = sampled_val[0] if sampled else val_rollouts
    updates = tracin_updates(model, optimizer, rollouts, val_batch, step, tracin_knobs,
                             timer=timer, amp=amp)
    stats, grad_norm, skip_reason, influence, keep = updates
    rollouts = replace(rollouts, influence=influence, selected=keep)
    extra = {"val/reward": val_batch.rewards.nanmean().item()} if sampled else {}
    return rollouts, StepResult(stats, grad_norm, skip_reason, extra, timer.seconds)


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


def main(argv):
    cfg = configure(defaults, argv)
    resume = None
    if cfg["init_from"] == "resume":
        check(cfg, "out_dir", cfg["out_dir"] != "", "give the directory of the run to resume")
        resume = load_resume(cfg["out_dir"])
        # the saved run's config; only what argv gives overrides it (a new --base_ckpt must hold the
        # same weights)
        cfg = configure(defaults, argv, saved=saved_config(resume))
    validate(cfg)  # every knob (compile=True: its compiler too), before any work; changes none
    # the reward functions the step calls: the config's, or where it names none, the task's own
    cfg["reward_funcs"], cfg["reward_weights"] = task_rewards(cfg)
    # torchrun: cuda:LOCAL_RANK
    with distributed.process_group(cfg["device"]) as cfg["device"]:
        # dtype: 'auto' resolved; amp: bf16 autocast, or none
        cfg["dtype"], amp = check_device(cfg["device"], cfg["dtype"])
        # a second run in this out_dir is refused from here on (rank 0 holds the lock for the job)
        lock = run_lock(cfg["out_dir"]) if distributed.is_main() else nullcontext()
        with lock:
            run = setup(cfg, amp, resume)
            del resume  # the saved optimizer state lives in the optimizer now: its copy freed
            train(cfg, run)
    return cfg


def setup(cfg, amp, resume):
    """The policy (the frozen base + a new LoRA adapter) and its optimizer, the data and its planted
    defect, the two random streams; a resumed run's state put back (runs/state.restore)."""
    device = cfg["device"]
    if resume is None and distributed.is_main():  # (the other ranks would see rank 0's first files)
        refuse_existing_run(cfg["out_dir"])  # any run file: resume it, or use another out_dir
    if resume is not None:
        cfg["base_ckpt"] = resumed_base(cfg, resume)
    # a fresh clone: the tiny base is trained first, by train_base.py
    train_missing_base(cfg["base_ckpt"], cfg["base_config"], device, resume is not None)
    model, base, data_dir, enc, splits = frozen_base(cfg, resume)
    check_rewards_read(cfg, splits["train"][0]["answer"])  # every reward reads the task's answers
    longest = check_question_lengths(cfg, model, enc, splits, data_dir)
    check_sampling_cache(cfg, model, longest, runs.evaluate.EVAL_BATCH)  # before iter 0
    defective = draw_defective(splits["train"], cfg["defect_frac"], cfg["seed"], cfg["task"])
    check_lora(model, cfg["lora_r"], cfg["lora_targets"])  # before any allocation
    torch.manual_seed(cfg["seed"])  # the LoRA initialisation
    apply_lora(model, cfg["lora_r"], cfg["lora_alpha"], cfg["lora_dropout"], cfg["lora_targets"])
    model.to(device)
    # sampling's decode step compiled once (compile=True, or auto where it pays), handed to every
    # grpo_step (decode=)
    steps_left = cfg["max_iters"] - (resume["iter_num"] if resume else 0)
    sampled = (steps_left, cfg["max_new_tokens"], model.config.n_layer)  # what a compile saves on
    mode = None if cfg["compile"] == "auto" else cfg["compile"]  # None: compiled where it pays
    on, why = compiled.choose(mode, device, *sampled)
    if why:
        distributed.print0(why)
    decode = compiled.CompiledDecode(model, device) if on else None
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=cfg["learning_rate"],
                                  weight_decay=cfg["weight_decay"])
    rng = random.Random(cfg["seed"])  # the prompts
    generator = torch.Generator(device=device).manual_seed(cfg["seed"])  # the completions
    # TracIn's validation prompts and their completions ('pg') draw from streams of their own, so a
    # TracIn run and a standard one with the same seed train on the same prompts (paired seeds)
    val_seed = cfg["seed"] + 1_000_003  # (any offset: another stream than the training one)
    val_rng, val_generator = random.Random(val_seed), torch.Generator(device=device)
    val_generator.manual_seed(val_seed)
    reward_cache = RewardCache() if cfg["reward_cache"] else None
    fingerprint = bound_data(data_dir, resume)  # resumed: its data, unchanged
    encode = partial(encode_prompt, enc)
    curriculum, test = from_config(cfg, data_dir, encode, model.config.block_size, splits["train"])
    test = test or splits["test"][:cfg["eval_n"]]  # with a curriculum, its last level's
    run = Run(model=model, optimizer=optimizer, enc=enc, amp=amp, decode=decode, rng=rng,
              generator=generator, val_rng=val_rng, val_generator=val_generator,
              reward_cache=reward_cache, curriculum=curriculum, train=splits["train"],
              val=splits["val"], test=test, defective=defective, data_dir=data_dir,
              data_fingerprint=fingerprint, base=base)
    if resume is not None:
        restore(run, resume, cfg)
    n_lora = sum(p.numel() for p in lora_parameters(model))
    distributed.print0(f"GRPO: {model.num_params() / 1e6:.2f}M base parameters frozen, "
                       f"{n_lora} LoRA parameters trained")
    return run


def get_batch(run, cfg):
    """The step's prompts: batch_size problems drawn with the run's rng (with a curriculum, new
    problems of its level; a defective one with its planted answer) and their row indices."""
    n = cfg["batch_size"]
    if run.curriculum:
        return [run.curriculum.draw(run.rng) for _ in range(n)], None
    picks = [run.rng.randrange(len(run.train)) for _ in range(n)]
    return plant(run.train, picks, run.defective, cfg["task"]), picks


def validation_batch(run, cfg):
    """TracIn's validation batch, as tracin_val_loss says (the one place a step reads it), as
    (val_prompts, val_rollouts): 'pg', prompts sampled with the step's and scored by the task's own
    rewards (reward_funcs may be hackable); 'nll', their clean reference solutions as rollouts (no
    sampling). Drawn, and sampled, from the run's validation streams: the training batch's draws
    are a standard run's."""
    n = cfg["tracin_val_batch_size"]
    rows = [run.val[run.val_rng.randrange(len(run.val))] for _ in range(n)]
    if cfg["tracin_val_loss"] == "nll":
        return None, reference_solutions(run.enc, rows, cfg["device"])
    task = TASKS[cfg["task"]]
    prompts = [encode_prompt(run.enc, e["question"]) for e in rows]
    answers = [e["answer"] for e in rows]
    funcs = (task["rewards"], task["weights"])
    streams = dict(cache=run.reward_cache, generator=run.val_generator)
    return Prompts(prompts, answers, *funcs, **streams), None


def train(cfg, run):
    model, optimizer, enc = run.model, run.optimizer, run.enc
    out, log_f, roll_f = cfg["out_dir"], None, None
    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    lr_at = partial(get_lr, max_iters=decay_iters, learning_rate=cfg["learning_rate"],
                    min_lr=cfg["min_lr"], warmup_iters=cfg["warmup_iters"])
    no_signal, skips = NoSignal(), Skips(cfg["max_skipped_steps"])
    step, tracin_knobs = records(cfg)  # what every step reads, made once
    try:
        # a new run evaluates the base model first (a resumed one logged that already)
        first = None
        if run.last_ckpt is None:
            first = {"iter": 0, "elapsed": 0.0, **eval_line(run, cfg, 0)}
        log_f, roll_f = open_logs(out, distributed.is_main())  # rank 0 writes, the others nowhere
        if first is not None:  # logged before its checkpoint: a resume never logs it twice
            log_f.write(json.dumps(first) + "\n")
            log_f.flush()
            save_run(run, cfg, lr_at(0))  # ckpt_000000: the trajectory starts at the base
        while run.iter_num < cfg["max_iters"]:
            lr = lr_at(run.iter_num)
            for g in optimizer.param_groups:
                g["lr"] = lr
            t_step = time.time()
            batch, picks = get_batch(run, cfg)
            val_prompts, val_rollouts = validation_batch(run, cfg) if tracin_knobs else (None, None)
            questions, answers = [e["question"] for e in batch], [e["answer"] for e in batch]
            encoded = [encode_prompt(enc, q) for q in questions]
            funcs = (cfg["reward_funcs"], cfg["reward_weights"])
            prompts = Prompts(encoded, answers, *funcs, cache=run.reward_cache)
            scored, result = grpo_step(model, optimizer, enc, prompts, step, tracin_knobs,
                                       generator=run.generator, amp=run.amp, decode=run.decode,
                                       val_prompts=val_prompts, val_rollouts=val_rollouts)
            log = step_log(scored, result, cfg, run.reward_cache)
            rollouts = None if scored is None else rollout_record(questions, answers, scored, cfg)
            run.iter_num += 1
            it = run.iter_num
            if run.curriculum:
                run.curriculum.after_step(log, it, verbose=distributed.is_main())
            if cfg["defect_frac"] > 0 and rollouts is not None:  # are the kept rollouts clean?
                defect_record(log, rollouts, picks, run.defective, cfg)
            log.update(iter=it, lr=lr, step_seconds=time.time() - t_step, elapsed=run.elapsed(),
                       **memory_stats(cfg["device"]))
            last = it == cfg["max_iters"]
            if it % cfg["eval_interval"] == 0 or last:  # NaN/Inf logits there: no accuracy logged
                log.update(eval_line(run, cfg, it))
            # The NaN/Inf path of a run. A step is skipped on NaN/Inf logits while sampling
            # (grpo_step: no backward, no rollouts recorded), a non-finite influence (TracIn) or a
            # non-finite loss or gradient norm (grpo.update; the generation's later updates are not
            # run, its earlier ones, num_iterations > 1, stay): that update leaves the weights and
            # AdamW's state as they were, the step is logged with its skip_reason and it counts as
            # an iteration (the schedule advances). Under torchrun one rank's NaN ends the sampling
            # on every rank, so all skip together. The run stops, naming a NaN/Inf base weight or
            # the knobs to lower (stop_diverged), after max_skipped_steps skipped in a row (a step
            # whose groups all had equal rewards, nothing to learn, between them does not break the
            # row), or at its end when more than 9 in 10 of the others were skipped.
            stop = skips.after_step(log)  # None, or how many were skipped in a row, and why
            # a skipped step's rollouts: said so (its last update was not applied)
            if rollouts is not None:
                skipped = {"skipped": True} if log["skipped"] else {}
                roll_f.write(json.dumps({"iter": it, "lr": lr, **rollouts, **skipped}) + "\n")
            log_f.write(json.dumps(log) + "\n")
            log_f.flush(); roll_f.flush()
            if it % cfg["log_interval"] == 0 and distributed.is_main():
                print_step(log, cfg, lr)
            no_signal.after_step(log, verbose=distributed.is_main())
            if stop:
                stop_diverged(run, cfg, stop, lr)
            # weights that give NaN logits are not kept; those a NaN gradient left untouched are
            # (a finite gradient times a huge learning rate can make them NaN/Inf: not written)
            if (it % cfg["ckpt_interval"] == 0 or last) and rollouts is not None:
                if nonfinite_weight(model, adapter=True) is None:
                    save_run(run, cfg, lr_at(it))
                else:  # a finite gradient times a huge learning rate: the next sampling says so
                    print(f"warning: NaN/Inf LoRA weights at iter {it}: no checkpoint written")
    except KeyboardInterrupt:
        raise Interrupted(stopped(run, cfg)) from None
    except (OSError, CheckpointWriteError) as e:  # a full disk: the reason, then how to go on
        filename = getattr(e, "filename", None)
        where = f"{filename}: " if filename else ""
        reason = getattr(e, "strerror", None) or e
        raise UserError(f"{where}{reason}; {stopped(run, cfg)}") from None
    except RuntimeError as e:  # torchrun: another rank ended (kill -9): named, then how to go on
        lost = distributed.lost_peer(e)
        if lost is None:
            raise
        raise UserError(f"{lost}; {stopped(run, cfg)}") from None
    finally:
        close_logs(log_f, roll_f)
    diverged = skips.diverged()
    if diverged:  # (nearly) every step that could learn was skipped: not a success
        stop_diverged(run, cfg, diverged, lr_at(run.iter_num))
    distributed.print0(f"done: {run.iter_num} GRPO steps in {run.elapsed():.0f}s; "
                       f"run directory {out}{no_signal.summary()}{skips.summary()}")


def stop_diverged(run, cfg, skipped, lr):
    """Steps skipped for NaN/Inf, in a row or (nearly) all: the run stops, naming a NaN/Inf base or
    the knobs that make the adapter diverge."""
    base_bad = nonfinite_weight(run.model, adapter=False)
    if base_bad is not None:  # no lr helps a base that is NaN/Inf before training
        raise UserError(f"{skipped}: the base model's weight {base_bad} holds NaN/Inf "
                        f"({cfg['base_ckpt']}); train on a base whose weights are finite "
                        "(re-create or re-download it)")
    raise UserError(f"{skipped} at iter {run.iter_num}: the adapter's updates have diverged; the "
                    f"last checkpoint is {cfg['out_dir']}/ckpt.pt (iter {run.last_ckpt}); "
                    f"lower {step_knobs(cfg, lr)} and start a new run")


def stopped(run, cfg):
    """Ctrl-C or a full disk: where the run stopped and the command that goes on from there."""
    rank0 = distributed.is_main()  # the process that wrote the run's first files removes them
    where = stop_note("train_grpo.py", cfg["out_dir"], run.last_ckpt, remove_files=rank0)
    return f"train_grpo.py stopped at iter {run.iter_num} of {cfg['max_iters']}; {where}"


if __name__ == "__main__":
    cli_main(main)
