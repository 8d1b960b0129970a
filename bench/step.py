"""
One GRPO step (grpo_step: train_grpo.grpo_step's calls) timed, for the bench's rows (bench/run.py), with the weights left as they are
(AdamW at lr 0) and the sampling seed reset, so that every variant sees the same rollouts:

  step cost  one TracIn-GRPO step / one standard GRPO step on the same prompts, per phase, for
             TracIn's two validation losses ('pg': sampled rollouts; 'nll': reference solutions), with
             tracin_influence='summed'; and whether the step keeps the same rollouts as
             tracin_influence='matrix' (the full [n, n_val] matrix's row sums) on the same rollouts.
  rewards    one standard GRPO step (beta 0.04: there is a reference pass to overlap) with
             background_rewards off / on, for the task's reward functions and for a deliberately slow
             one (the first of them wrapped to sleep slow_reward_ms per completion, registered only
             while this row runs); no reward cache, so every completion is scored in every step.
Also what run.py and posthoc.py share: timed, bench_model, task_setup.
"""
import contextlib
import io
import os
import random
import statistics
import time
from dataclasses import replace

import torch

import rewards
from bench.scripts import GRPO_DEFAULTS, knob_records, train_missing_base
from configurator import UserError
from data.tasks import task_rewards
from data.datadir import load_split, load_tokenizer
from data.gsm_synth.prepare import ROOT, prepare
from data.prompts import encode_prompt
from lora import apply_lora, lora_parameters
from model import GPT, GPTConfig
from runs.checkpoint import load_checkpoint, model_from_checkpoint
from runs.metrics import PhaseTimer, step_log
from grpo import Prompts, StepResult, grpo_updates, make_rollouts, policy_backward
from tracin import reference_solutions, tracin_updates


def timed(fn, device, repeats):
    """Median seconds of `repeats` calls after one warm-up call; returns (seconds, last result)."""
    sync = torch.cuda.synchronize if "cuda" in device else (lambda: None)
    out = fn()
    times = []
    for _ in range(repeats):
        sync(); t0 = time.perf_counter()
        out = fn()
        sync(); times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_model(device, block_size, vocab_size=395):
    """The tiny-config GPT (4 layers, 64 wide, vocab 395) with random weights, larger context."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=4, n_head=4, n_embd=64)
    return GPT(cfg).to(device).eval()


def task_setup(cfg, n_train, n_val):
    """The base model at base_ckpt (else random weights on the tiny task) with a fresh LoRA adapter, its
    tokenizer, what it is, and n_train training and n_val validation examples drawn with the seed."""
    dev = cfg["device"]
    if not cfg["quick"]:  # the trained base, trained first where train_grpo would train it (one line says so)
        train_missing_base(cfg["base_ckpt"], dev)
    if os.path.exists(cfg["base_ckpt"]):
        ck = load_checkpoint(cfg["base_ckpt"])
        model, data_dir, what = model_from_checkpoint(ck), ck["data_dir"], cfg["base_ckpt"]
    else:  # random weights on the tiny task: same shapes, garbage completions
        data_dir = prepare(2, 10, "+-", 0.7, verbose=False, root=cfg["data_root"] or ROOT)
        model, what = bench_model(dev, 96, load_tokenizer(data_dir).n_vocab), "random weights"
    enc = load_tokenizer(data_dir)
    apply_lora(model, 8, 16, 0.0, ("c_attn", "c_proj", "c_fc"))
    model.to(dev)
    rng = random.Random(cfg["seed"])
    train, val = load_split(data_dir, "train"), load_split(data_dir, "val")
    return (model, enc, what, [train[rng.randrange(len(train))] for _ in range(n_train)],
            [val[rng.randrange(len(val))] for _ in range(n_val)])


def check_step_tokens(cfg):
    """step_new_tokens fits the context of the step rows' model after the longest prompt they draw: one line naming
    the bench's knob (train_grpo's own check would name its max_new_tokens, a key the bench does not have)."""
    model, enc, what, tb, vb = task_setup(cfg, cfg["step_batch_size"], cfg["step_val_batch_size"])
    longest = max(len(encode_prompt(enc, e["question"])) for e in tb + vb)
    room = model.config.block_size - longest
    if cfg["step_new_tokens"] > room:
        raise UserError(f"config key 'step_new_tokens' = {cfg['step_new_tokens']} is not allowed: the step rows' "
                        f"model ({what}) has a context of {model.config.block_size} tokens and its longest drawn "
                        f"prompt takes {longest}: give --step_new_tokens={room} or less")


def grpo_step(model, optimizer, enc, batch, step, tracin_knobs, generator, amp, val=None):
    """train_grpo.grpo_step's calls, in its order (a script is not imported; tests/test_bench.py shows
    both give the same rollouts, results and weights): one generate call for the batch (and TracIn's
    sampled validation prompts), then grpo_updates, or TracIn's tracin_updates. -> (rollouts, grpo.StepResult)."""
    timer = PhaseTimer("generation", "reward", "policy", "reference")
    sampled_val = isinstance(val, Prompts)  # 'pg': val rollouts sampled too
    batches = [batch, val] if sampled_val else [batch]
    rollouts, *val_rollouts = make_rollouts(model, enc, batches, step, generator, timer=timer, amp=amp)
    if tracin_knobs is None:
        stats, grad_norm, skip_reason = grpo_updates(model, optimizer, rollouts, step, timer=timer, amp=amp)
        return rollouts, StepResult(stats, grad_norm, skip_reason, times=timer.seconds)
    val_batch = val_rollouts[0] if sampled_val else val
    updates = tracin_updates(model, optimizer, rollouts, val_batch, step, tracin_knobs, timer=timer, amp=amp)
    stats, grad_norm, skip_reason, influence, keep = updates
    rollouts = replace(rollouts, influence=influence, selected=keep)
    extra = {"val/reward": val_batch.rewards.nanmean().item()} if sampled_val else {}
    return rollouts, StepResult(stats, grad_norm, skip_reason, extra, timer.seconds)


def timed_grpo_step(model, enc, tb, vb, mode, cfg, amp, **overrides):
    """One grpo_step, 'standard' or TracIn with validation loss `mode` ('pg' / 'nll'), lr 0,
    the sampling seed reset, no reward cache; `overrides` go into its config. Returns its log with the
    wall time as 'total' and, for TracIn, the kept rollouts as 'selected'."""
    dev = cfg["device"]
    c = {**GRPO_DEFAULTS, "device": dev, "beta": 0.0, "tracin": mode != "standard", "micro_batch_size": 64,
         "max_new_tokens": cfg["step_new_tokens"], "tracin_val_loss": mode if mode != "standard" else "pg",
         **overrides}
    opt = torch.optim.AdamW(lora_parameters(model), lr=0.0)  # lr 0: the weights stay as they are
    gen = torch.Generator(device=dev).manual_seed(cfg["seed"])
    t0 = time.perf_counter()
    c["reward_funcs"], c["reward_weights"] = task_rewards(c)  # the task's, as checks/grpo_knobs.validate resolves them
    funcs = (c["reward_funcs"], c["reward_weights"])  # the task's own, for training and validation
    val = None if not c["tracin"] else reference_solutions(enc, vb, dev) if mode == "nll" else \
        Prompts([encode_prompt(enc, e["question"]) for e in vb], [e["answer"] for e in vb], *funcs)
    batch = Prompts([encode_prompt(enc, e["question"]) for e in tb], [e["answer"] for e in tb], *funcs)
    with contextlib.redirect_stdout(io.StringIO()):  # its notices ("no rollout kept") are not bench output
        rollouts, result = grpo_step(model, opt, enc, batch, *knob_records(c), gen, amp, val)  # no cache: all scored
    log = step_log(rollouts, result, c)
    log["total"] = time.perf_counter() - t0
    log["selected"] = None if rollouts is None or rollouts.selected is None else rollouts.selected.tolist()
    return log


def timed_val_backward(model, enc, vb, cfg, amp):
    """What any use of the 'nll' validation batch costs at least: its forward and backward alone, no
    hooks (tracin.reference_solutions through grpo.policy_backward). Returns {'total': seconds}."""
    dev = cfg["device"]
    c = {**GRPO_DEFAULTS, "device": dev, "beta": 0.0, "micro_batch_size": 64}
    sync = torch.cuda.synchronize if "cuda" in dev else (lambda: None)
    sync(); t0 = time.perf_counter()
    step, _ = knob_records(c)
    policy_backward(model, reference_solutions(enc, vb, dev), step, timer=PhaseTimer(), amp=amp)
    sync(); total = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return {"total": total}


def interleaved(variants, rounds, step):
    """{variant: [log, ...]}: `rounds` rounds after a warm-up round, every variant once per round, so that
    a slow spell of a shared machine hits every variant alike."""
    runs = {v: [] for v in variants}
    for r in range(rounds + 1):
        for v in variants:
            log = step(v)
            if r > 0:
                runs[v].append(log)
    return runs


def medians(logs, keys):
    return {k: statistics.median(log.get(k, 0.0) for log in logs) for k in keys}


# ---------------------------------------------------------------------------------------------
# step cost: standard vs TracIn, per phase

STEP_PHASES = ("time/generation", "time/reward", "time/grad_capture_train", "time/grad_capture_val",
               "time/influence", "time/policy", "time/optimizer", "total")
STEP_TARGETS = {"pg": 2.0, "nll": 1.10}  # TracIn step / standard step
OVER_FLOOR = 0.05  # 'nll': TracIn step - (standard step + validation forward/backward), / standard step


def degenerate(log, n_kept):
    """Why a step cannot show what TracIn costs, or None: with every advantage 0 (each group scored
    alike, e.g. random weights) there is nothing to select and nothing to update; keeping nothing
    skips the subset update. Such a row gets no verdict."""
    if log.get("frac_reward_zero_std", 1.0) >= 1.0:
        return "no informative group (every advantage 0)"
    return "kept nothing" if n_kept == 0 else None


def step_cost_row(mode, name, s, t, m, what, same, n_kept, n, why=None, val=None):
    """The row of TracIn `mode` (phase medians t) against the standard step (phase medians s); m: one
    step of the matrix path on the same rollouts; why: the batch is degenerate (no verdict); val: the
    validation batch's forward + backward alone ('nll'), whose sum with s is TracIn's floor: the
    target is the overhead beyond it, at most 5 % of a standard step."""
    ratio, target = t["total"] / s["total"], STEP_TARGETS[mode]
    detail = (f"{what}; {name}; standard: generation {s['time/generation']:.2f} s, reward "
              f"{s['time/reward']:.3f} s, training (pass 2 + backward + AdamW) "
              f"{s['time/policy'] + s['time/optimizer']:.2f} s, total {s['total']:.2f} s; TracIn (summed): "
              f"generation {t['time/generation']:.2f} s, reward {t['time/reward']:.3f} s, grad capture train "
              f"{t['time/grad_capture_train']:.2f} s, val gradient {t['time/grad_capture_val']:.3f} s, "
              f"influence + subset update {t['time/influence']:.3f} s, clip + AdamW {t['time/optimizer']:.3f} s, "
              f"total {t['total']:.2f} s; matrix path (one step): val capture {m['time/grad_capture_val']:.3f} s, "
              f"influence + subset update {m['time/influence']:.3f} s; kept {n_kept} of {n}, same kept set as the "
              f"matrix path: {same}")
    if val is not None:  # beyond the floor: what the hooks, the products with G and the subset update cost
        beyond = (t["total"] - s["total"] - val) / s["total"]
        detail += (f"; floor = standard + validation forward and backward alone ({val:.3f} s) = "
                   f"{s['total'] + val:.2f} s, beyond it {beyond * 100:+.1f} % of a standard step")
        ok, shown, goal = beyond <= OVER_FLOOR, f"{ratio:.2f}x ({beyond * 100:+.1f} % beyond the floor)", \
            f"<= {OVER_FLOOR * 100:.0f} % of a standard step beyond the floor, same kept set"
    else:  # 'pg': its validation rollouts are sampled in the same generate call and backpropagated: its floor
        floor = s["total"] + max(t["time/generation"] - s["time/generation"], 0.0) + t["time/grad_capture_val"]
        detail += (f"; floor = standard + the validation rollouts' share of generation and their backward = "
                   f"{floor:.2f} s ({floor / s['total']:.2f}x), beyond it "
                   f"{(t['total'] - floor) / s['total'] * 100:+.1f} % of a standard step")
        ok, shown, goal = ratio <= target, f"{ratio:.2f}x", f"<= {target:.2f}x, same kept set"
    verdict = f"invalid: {why}" if why else "met" if ok and same else "MISSED"
    return (f"step cost, TracIn {mode}", detail, shown, goal, verdict)


def bench_step_cost(cfg):
    """Standard vs TracIn grpo_step on the same prompts with the same sampling seed, per phase; then one
    TracIn step per validation loss with tracin_influence='matrix', whose kept set must be the same."""
    model, enc, what, tb, vb = task_setup(cfg, cfg["step_batch_size"], cfg["step_val_batch_size"])
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled="cuda" in cfg["device"])
    modes = ("standard", "pg", "nll")  # TracIn's validation loss: sampled rollouts, or reference solutions
    runs = interleaved(modes + ("val",), cfg["step_repeats"], lambda mode: timed_val_backward(model, enc, vb, cfg, amp)
                       if mode == "val" else timed_grpo_step(model, enc, tb, vb, mode, cfg, amp))
    phases = {mode: medians(runs[mode], STEP_PHASES) for mode in modes}
    val = statistics.median(r["total"] for r in runs["val"])
    rows = []
    for mode, name in (("pg", "val = sampled rollouts (the TracIn-GRPO comparison guide's setup)"),
                       ("nll", "val = reference solutions")):
        kept = runs[mode][-1]["selected"]
        matrix = timed_grpo_step(model, enc, tb, vb, mode, cfg, amp, tracin_influence="matrix")
        rows.append(step_cost_row(mode, name, phases["standard"], phases[mode], matrix, what,
                                  kept == matrix["selected"], sum(kept), len(kept),
                                  degenerate(runs[mode][-1], sum(kept)), val if mode == "nll" else None))
    return rows


# ---------------------------------------------------------------------------------------------
# rewards: scoring on the critical path, or on a worker thread during the reference pass

def slow(fn, ms):
    """`fn` that first sleeps `ms` milliseconds: a reward that calls a verifier, a sandbox or a model."""
    def slow_reward(completion, answer):
        time.sleep(ms / 1000)  # releases the GIL, as waiting on a subprocess or a socket does
        return fn(completion, answer)
    return slow_reward


def bench_rewards(cfg):
    """A standard step with background_rewards off and on, for the task's rewards and a slow one."""
    model, enc, what, tb, _ = task_setup(cfg, cfg["step_batch_size"], 0)
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled="cuda" in cfg["device"])
    (funcs, weights), ms = task_rewards(GRPO_DEFAULTS), cfg["slow_reward_ms"]
    slow_name = f"{funcs[0]}_slow"
    kinds = {"task": funcs, "slow": (slow_name, *funcs[1:])}
    rewards.REWARD_FUNCS[slow_name] = slow(rewards.REWARD_FUNCS[funcs[0]], ms)  # looked up by name per call
    try:
        variants = [(kind, bg) for kind in kinds for bg in (False, True)]
        runs = interleaved(variants, cfg["step_repeats"], lambda v: timed_grpo_step(
            model, enc, tb, None, "standard", cfg, amp, beta=0.04, reward_funcs=kinds[v[0]], reward_weights=weights,
            background_rewards=v[1]))
    finally:
        del rewards.REWARD_FUNCS[slow_name]
    rows, keys = [], ("time/reward", "time/reference", "total")
    for kind, label in (("task", f"task rewards {', '.join(funcs)}"),
                        ("slow", f"{funcs[0]} + {ms:g} ms sleep per completion, {', '.join(funcs[1:])}")):
        off, on = medians(runs[kind, False], keys), medians(runs[kind, True], keys)
        n = len(tb) * GRPO_DEFAULTS["group_size"]
        rows.append((f"rewards, {kind}", f"{what}; standard step, beta 0.04, reward cache off (all {n} completions "
                     f"scored every step); {label}; background_rewards off: total {off['total']:.2f} s (reward "
                     f"{off['time/reward']:.3f} s, reference {off['time/reference']:.3f} s); on: total "
                     f"{on['total']:.2f} s (reward on the worker thread {on['time/reward']:.3f} s, reference "
                     f"{on['time/reference']:.3f} s); at most min(reward, reference) can be hidden",
                     f"{off['total'] / on['total']:.2f}x", "none (off / on)", "n/a"))
    return rows
