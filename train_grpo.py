"""
GRPO (Group Relative Policy Optimization, DeepSeekMath arXiv 2402.03300) with LoRA on the base GPT.

    python train_grpo.py config/tiny_grpo.py       # trains the base model first if it is missing
    python train_grpo.py config/tiny_grpo.py --init_from=resume

One step, in the order a reader should see it (grpo_step):
  1. take batch_size prompts, each repeated group_size times
  2. PASS 1 sampling, no grad: KV-cache generation, token ids only (sample.generate)
  3. rewards -> compute_group_advantages (grpo.py): A_i = (r_i - mean_group) / std_group
  4. PASS 2 policy, with grad: per-token log-probs of the completion tokens (grpo.completion_logprobs)
  5. PASS 3 reference, no grad: the same model with LoRA disabled (no second copy of the weights)
  6. loss (grpo.grpo_loss): clipped surrogate + beta * k3 KL, aggregated per loss_type; backward
  7. clip the gradient, AdamW on the LoRA parameters only; skip the step if anything is NaN/Inf
Every large tensor is deleted as soon as it has been used; each `del` says what it frees.
"""
import glob
import json
import math
import os
import random
import resource
import shlex
import time

import torch

from configurator import (Interrupted, UserError, check, check_choice, check_finite, check_positive, cli_main,
                          configure, read_config_file)
from data.gsm_synth.prepare import encode_prompt, encode_text, load_split, load_tokenizer
from grpo import completion_logprobs, compute_group_advantages, grpo_loss, rollout_batch
from lora import apply_lora, disable_lora, lora_parameters, lora_state_dict, load_lora_state_dict
from model import (base_fingerprint, check_device, check_same_base, load_checkpoint, model_from_checkpoint,
                   save_checkpoint)
from rewards import REWARD_FUNCS, compute_rewards
from rundir import run_lock, truncate_jsonl
from sample import NonFiniteLogits, generate, decode_completions
from tracin import (compute_ghost_inner_product_matrix, ghost_mode, install_ghost_hooks, select_rollouts,
                    subset_gradients)
from train_base import evaluate, get_lr

# -----------------------------------------------------------------------------
# default config values (override with a config file and/or --key=value)
out_dir = "out/grpo"
init_from = "base"          # 'base': new LoRA on base_ckpt; 'resume': continue from out_dir/ckpt.pt
base_ckpt = "out/base/ckpt.pt"
base_config = "config/tiny_base.py"   # used to train the base model when base_ckpt is missing
seed = 1337
device = "cpu"
dtype = "bfloat16"          # autocast dtype on CUDA; CPU runs in float32
# GRPO
batch_size = 8              # prompts per step
group_size = 8              # completions per prompt (G); advantages are relative within a group
micro_batch_size = 32       # completions per forward/backward; gradients accumulate over micro-batches
max_new_tokens = 40
temperature = 1.0           # sampling temperature; log-probs use logits / temperature to match
top_k = 0                   # 0 = off
top_p = 1.0
beta = 0.04                 # KL weight; 0 skips the reference pass entirely
epsilon_low = 0.2           # clip ratio to [1 - epsilon_low, 1 + epsilon_high]
epsilon_high = 0.2
loss_type = "grpo"          # 'grpo' (mean per completion), 'bnpo' (mean per token), 'dr_grpo' (sum / (N*max_len))
scale_rewards = "group"     # 'group' / 'batch' std, or 'none' (Dr. GRPO)
mask_truncated_completions = False  # completions that never emitted end-of-text get no loss
reward_funcs = ("correctness", "format")
reward_weights = (1.0, 0.1)
# LoRA
lora_r = 8
lora_alpha = 16
lora_dropout = 0.0          # dropout stays off in RL: it would make logp and ref noisy (trl#3500)
lora_targets = ("c_attn", "c_proj", "c_fc")
grad_checkpoint = False
# optimisation: AdamW over LoRA parameters, warmup then cosine
max_iters = 100
learning_rate = 3e-3
min_lr = 3e-4
lr_decay_iters = 0          # cosine reaches min_lr here; 0 = max_iters (set it to stop early and resume later)
warmup_iters = 5
weight_decay = 0.0
grad_clip = 1.0
# logging / evaluation / checkpoints
log_interval = 1
eval_interval = 50          # greedy accuracy and pass@eval_k on the test split; also at start and end
eval_n = 500
eval_k = 4
ckpt_interval = 25
max_skipped_steps = 5       # this many steps in a row skipped (NaN/Inf) stop the run with an error
# TracIn-GRPO (tracin.py): train only on rollouts whose gradient helps a validation batch
tracin = False
tracin_val_batch_size = 4   # validation prompts per step
tracin_val_loss = "pg"      # 'pg': sample each val prompt group_size times, GRPO policy-gradient loss (seed 000)
                            # 'nll': negative log-likelihood of the val prompts' clean reference solutions
tracin_selection = "positive"  # 'positive': influence > 0; 'topk': the top tracin_topk_frac
tracin_topk_frac = 0.5
# a planted defect, to see whether selection matters: this fraction of training prompts carries a
# wrong reference answer (the result of the FIRST step, i.e. what stopping early gives), and the
# correctness reward trusts it. The program knows which prompts (logged as selection precision);
# the selector does not. Validation and test answers stay clean.
defect_frac = 0.0
# -----------------------------------------------------------------------------
defaults = {k: v for k, v in dict(globals()).items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str, tuple))}


def memory_stats(device):
    """mem_alloc_mb / mem_reserved_mb / mem_max_alloc_mb: CUDA allocator, or on CPU the process RSS
    (current RSS for alloc and reserved, peak RSS for max)."""
    if "cuda" in str(device):
        mb = 1024 ** 2
        return {"mem_alloc_mb": torch.cuda.memory_allocated() / mb, "mem_reserved_mb": torch.cuda.memory_reserved() / mb,
                "mem_max_alloc_mb": torch.cuda.max_memory_allocated() / mb}
    with open("/proc/self/statm") if os.path.exists("/proc/self/statm") else open(os.devnull) as f:
        fields = f.read().split()
    rss = int(fields[1]) * os.sysconf("SC_PAGE_SIZE") / 1024 ** 2 if fields else float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    return {"mem_alloc_mb": rss, "mem_reserved_mb": rss, "mem_max_alloc_mb": peak}


def make_rollouts(model, enc, batches, cfg, generator, amp, times):
    """PASS 1 (sampling, no grad, no logits kept), rewards and group-relative advantages.

    batches: a list of (questions, answers); all are sampled in ONE generate call (TracIn's train and
    validation prompts share the per-token cost) and scored separately: one rollout dict per batch."""
    G, t0 = cfg["group_size"], time.time()
    prompts = [encode_prompt(enc, q) for qs, _ in batches for q in qs]
    with amp:
        idx, pad_left, mask = generate(model, prompts, cfg["max_new_tokens"], enc.eot_token, num_samples=G,
                                       temperature=cfg["temperature"], top_k=cfg["top_k"] or None,
                                       top_p=cfg["top_p"], generator=generator)
    _sync(cfg); times["generation"] = times.get("generation", 0.0) + time.time() - t0; t0 = time.time()
    T = mask.size(1)  # generation stops once every row has ended: T <= max_new_tokens
    out, start = [], 0
    for questions, answers in batches:
        sl = slice(start, start + len(questions) * G)
        start = sl.stop
        texts = decode_completions(enc, idx[sl], mask[sl])
        rewards, per_fn, errors = compute_rewards(texts, [a for a in answers for _ in range(G)],
                                                  list(cfg["reward_funcs"]), list(cfg["reward_weights"]))
        rewards = torch.tensor(rewards)
        advantages, n_zero_std = compute_group_advantages(rewards, G, cfg["scale_rewards"])
        truncated = (idx[sl, -T:] != enc.eot_token).all(dim=1)  # never emitted end-of-text
        m = mask[sl] * (~truncated).long()[:, None] if cfg["mask_truncated_completions"] else mask[sl]
        out.append(dict(idx=idx[sl], pad_left=pad_left[sl], mask=m, rewards=rewards, advantages=advantages,
                        per_fn=per_fn, errors=errors, n_zero_std=n_zero_std, truncated=truncated))
    times["reward"] = times.get("reward", 0.0) + time.time() - t0
    return out


def reference_solutions(enc, examples, device):
    """The validation batch for tracin_val_loss='nll': each prompt followed by its clean reference
    solution, laid out as sample.generate lays out rollouts, with advantage +1. The GRPO loss of a
    row with A = 1 and old = logp.detach() has gradient -grad(mean_t log p(solution_t)): the
    gradient of the solution's negative log-likelihood, so no sampling is needed."""
    rows = [{"prompt": e["question"], "completion_tokens": encode_text(enc, e["solution"]) + [enc.eot_token],
             "advantage": 1.0} for e in examples]
    for r in rows:
        r["completion_mask"] = [1] * len(r["completion_tokens"])
    idx, pad_left, mask, adv = rollout_batch(enc, rows, device)
    return dict(idx=idx, pad_left=pad_left, mask=mask, advantages=adv)


def policy_backward(model, R, cfg, amp, times, beta):
    """PASS 2 (policy, with grad) and PASS 3 (reference, no grad) per micro-batch, then backward
    of the GRPO loss. Gradients accumulate in .grad (or, under ghost hooks, per sample)."""
    idx, pad_left, T = R["idx"], R["pad_left"], R["mask"].size(1)
    N, mb, device = idx.size(0), cfg["micro_batch_size"], cfg["device"]
    norm = dict(num_seqs=N, num_tokens=R["mask"].sum().clamp(min=1).item(), max_len=cfg["max_new_tokens"])
    adv, mask = R["advantages"].to(device), R["mask"].to(device)
    st = {"losses": [], "kl_sum": 0.0, "clipped": 0.0, "ent_sum": 0.0, "num_tokens": norm["num_tokens"]}
    model.train()  # dropout is 0: train() only enables gradient checkpointing if configured
    for s in range(0, N, mb):
        sl = slice(s, s + mb)
        ref_logp = None
        if beta != 0:
            t0 = time.time()
            with torch.no_grad(), disable_lora(model), amp:  # PASS 3: base weights, same module objects
                ref_logp, _ = completion_logprobs(model, idx[sl], pad_left[sl], T, cfg["temperature"])
            _sync(cfg); times["reference"] = times.get("reference", 0.0) + time.time() - t0
        t0 = time.time()
        with amp:                                                  # PASS 2: the policy, with grad
            logp, entropy = completion_logprobs(model, idx[sl], pad_left[sl], T, cfg["temperature"],
                                                with_entropy=True)
            loss, ls = grpo_loss(logp, logp.detach(), ref_logp, adv[sl], mask[sl], beta,
                                 cfg["epsilon_low"], cfg["epsilon_high"], cfg["loss_type"], **norm)
        loss.backward()
        st["losses"].append(loss.item())
        st["kl_sum"] += ls["kl_sum"]; st["clipped"] += ls["clipped_tokens"]
        st["ent_sum"] += (entropy * mask[sl]).sum().item()
        del logp, ref_logp, entropy, loss  # free this micro-batch's graph before the next one
        _sync(cfg); times["policy"] = times.get("policy", 0.0) + time.time() - t0
    return st


def _sync(cfg):
    if "cuda" in cfg["device"]:
        torch.cuda.synchronize()  # so per-phase times measure the GPU work, not the launch


def grpo_step(model, optimizer, enc, questions, answers, cfg, generator, amp, val=None):
    """One GRPO step; returns (log dict, rollout record). With cfg['tracin'], `val` = the validation
    examples (dicts with question, answer, solution) and only rollouts whose gradient helps them
    are trained on. Weights change only if every loss and gradient is finite."""
    times = {"generation": 0.0, "reward": 0.0, "policy": 0.0, "reference": 0.0}
    extra, val_pg = {}, cfg["tracin"] and cfg["tracin_val_loss"] == "pg"
    batches = [(questions, answers)] + ([([e["question"] for e in val], [e["answer"] for e in val])] if val_pg else [])
    try:
        R, *V = make_rollouts(model, enc, batches, cfg, generator, amp, times)  # val_pg: train + val, one call
    except NonFiniteLogits as e:  # the weights have blown up: nothing to learn from this step
        print(f"warning: {e}; step skipped, weights untouched")
        return {"skipped": True, "skip_reason": "non-finite logits", **{f"time/{k}": v for k, v in times.items()}}, None
    N, G = R["idx"].size(0), cfg["group_size"]
    if not cfg["tracin"]:
        st = policy_backward(model, R, cfg, amp, times, cfg["beta"])
    else:
        # the validation loss: the GRPO policy-gradient loss of sampled val rollouts (seed 000), or the
        # NLL of the val prompts' clean reference solutions (no sampling, one row per prompt)
        V = V[0] if val_pg else reference_solutions(enc, val, cfg["device"])
        with install_ghost_hooks(model) as hooks, ghost_mode(optimizer):
            t0 = time.time()
            st = policy_backward(model, R, cfg, amp, times, cfg["beta"])   # per-sample train gradients
            times["grad_capture_train"] = time.time() - t0
            hooks.split, t0 = "val", time.time()
            policy_backward(model, V, cfg, amp, times, 0.0)                   # val: policy-gradient part only
            times["grad_capture_val"] = time.time() - t0
            train_c, val_c = hooks.collect("train"), hooks.collect("val")
        t0 = time.time()
        ip = compute_ghost_inner_product_matrix(train_c, val_c)             # (N, N_val)
        influence = ip.sum(1)          # <g_i, sum_j g_val_j>: validation GRADIENTS are summed
        keep = select_rollouts(influence, cfg["tracin_selection"], cfg["tracin_topk_frac"])
        subset_gradients(model, train_c, keep)  # the update from the hooks' buffers: no 4th pass
        del train_c, val_c, ip  # the per-sample activations/gradients of every LoRA layer
        times["influence"] = time.time() - t0
        extra = {"selection_rate": keep.float().mean().item(), "n_selected": int(keep.sum()),
                 "influence/mean": influence.mean().item(), "influence/std": influence.std().item(),
                 "influence/min": influence.min().item(), "influence/max": influence.max().item(),
                 **({"val/reward": V["rewards"].mean().item()} if val_pg else {})}
        R["influence"], R["selected"] = influence.tolist(), keep.tolist()
    # ---- update: clip, AdamW on LoRA only, unless something is not finite or nothing is kept --
    t0 = time.time()
    params = lora_parameters(model)
    nothing_kept = cfg["tracin"] and extra["n_selected"] == 0
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"]) if not nothing_kept else torch.tensor(0.0)
    skipped = not (math.isfinite(grad_norm.item()) and all(math.isfinite(v) for v in st["losses"]))
    if skipped:
        print("warning: non-finite loss or gradient; step skipped, weights untouched")
        extra["skip_reason"] = "non-finite loss or gradient"
    elif nothing_kept:
        print("tracin: no rollout has positive influence; no update this step")
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync(cfg); times["optimizer"] = time.time() - t0
    ntok, rewards, per_fn, mask = st["num_tokens"], R["rewards"], R["per_fn"], R["mask"]
    log = {"loss": sum(st["losses"]), "reward": rewards.mean().item(), "reward_std": rewards.std().item(),
           **{f"rewards/{k}": sum(v) / len(v) for k, v in per_fn.items()},
           "accuracy": sum(per_fn["correctness"]) / N if "correctness" in per_fn else float("nan"),
           "frac_reward_zero_std": R["n_zero_std"] / (N // G), "kl": st["kl_sum"] / ntok,
           "entropy": st["ent_sum"] / ntok, "completions/mean_length": mask.sum(1).float().mean().item(),
           "completions/clipped_ratio": R["truncated"].float().mean().item(),
           "clip_ratio": st["clipped"] / ntok, "grad_norm": grad_norm.item(), "skipped": skipped,
           "reward_errors": sum(R["errors"].values()), **extra, **{f"time/{k}": v for k, v in times.items()}}
    T = mask.size(1)
    rollouts = {"prompts": questions, "answers": answers, "completion_tokens": R["idx"][:, -T:].tolist(),
                "completion_mask": mask.tolist(), "rewards": rewards.tolist(),
                "advantages": R["advantages"].tolist(),
                **({"influence": R["influence"], "selected": R["selected"]} if cfg["tracin"] else {})}
    return log, rollouts


# -----------------------------------------------------------------------------
def first_step_result(example):
    """The planted wrong answer: the result of the solution's first equation ("8-7=1" -> 1)."""
    return int(example["solution"].split("\n")[0].split("=")[1])


def ensure_base(cfg, resuming):
    """Train the base model with base_config if base_ckpt is missing and is where base_config puts it
    (a fresh clone). Any other missing base is an error, never a silent long training (a typo'd path)."""
    if os.path.exists(cfg["base_ckpt"]):
        return
    import train_base
    where = os.path.join(read_config_file(cfg["base_config"]).get("out_dir", train_base.defaults["out_dir"]), "ckpt.pt")
    if resuming or os.path.normpath(where) != os.path.normpath(cfg["base_ckpt"]):
        raise UserError(f"base_ckpt {cfg['base_ckpt']} not found" + (
            " (the base this run was trained on: put it back)" if resuming else
            f"; train it with: python train_base.py {cfg['base_config']} --out_dir={os.path.dirname(cfg['base_ckpt']) or '.'}"
            f" (only {where}, where base_config puts it, is trained automatically)"))
    print(f"base model not found at {cfg['base_ckpt']}: training it first with {cfg['base_config']}")
    train_base.main([cfg["base_config"], f"--out_dir={os.path.dirname(cfg['base_ckpt']) or '.'}",
                     f"--device={cfg['device']}"])


def validate(cfg):
    """Every knob, before any work or any file is written: one line naming the key, the value and
    what is allowed (a typo'd key or a wrong type is caught earlier, by configure)."""
    check(cfg, "out_dir", cfg["out_dir"] != "", "give a directory, e.g. --out_dir=out/grpo")
    check_finite(cfg, "grad_clip")
    check(cfg, "base_ckpt", cfg["base_ckpt"] != "", "give the base checkpoint, e.g. --base_ckpt=out/base/ckpt.pt")
    check_choice(cfg, "init_from", ("base", "resume"))
    check_positive(cfg, "batch_size", "micro_batch_size", "max_new_tokens", "learning_rate", "grad_clip",
                   "log_interval", "eval_interval", "eval_n", "eval_k", "ckpt_interval", "max_skipped_steps",
                   "lora_r", "lora_alpha", "tracin_val_batch_size")
    for k in ("max_iters", "min_lr", "warmup_iters", "lr_decay_iters", "weight_decay", "beta", "epsilon_high"):
        check(cfg, k, cfg[k] >= 0, "must be >= 0")
    check(cfg, "group_size", cfg["group_size"] >= 2, "must be >= 2: advantages are relative within a group")
    n = cfg["batch_size"] * cfg["group_size"]
    check(cfg, "micro_batch_size", cfg["micro_batch_size"] >= n or n % cfg["micro_batch_size"] == 0,
          f"batch_size*group_size = {n} completions must divide into micro-batches of this size")
    check(cfg, "temperature", cfg["temperature"] > 0, "must be > 0 in GRPO: with greedy sampling (0) every "
          "completion of a group is the same, every advantage is 0 and nothing can be learned")
    check(cfg, "top_k", cfg["top_k"] >= 0, "must be >= 0 (0 = off)")
    check(cfg, "top_p", 0 < cfg["top_p"] <= 1, "must be in (0, 1] (1 = off)")
    check(cfg, "epsilon_low", 0 <= cfg["epsilon_low"] < 1, "must be in [0, 1)")
    check(cfg, "lora_dropout", 0 <= cfg["lora_dropout"] < 1, "must be in [0, 1)")
    check(cfg, "defect_frac", 0 <= cfg["defect_frac"] <= 1, "must be in [0, 1]")
    check(cfg, "tracin_topk_frac", 0 < cfg["tracin_topk_frac"] <= 1, "must be in (0, 1]")
    check_choice(cfg, "loss_type", ("grpo", "bnpo", "dr_grpo"))
    check_choice(cfg, "scale_rewards", ("group", "batch", "none"))
    check_choice(cfg, "tracin_val_loss", ("pg", "nll"))
    check_choice(cfg, "tracin_selection", ("positive", "topk"))
    funcs, weights = cfg["reward_funcs"], cfg["reward_weights"]
    check(cfg, "reward_funcs", len(funcs) > 0 and all(f in REWARD_FUNCS for f in funcs) and len(set(funcs)) == len(funcs),
          f"a non-empty list of distinct names from {sorted(REWARD_FUNCS)}")
    check(cfg, "reward_weights", len(weights) == len(funcs) and all(
          isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in weights),
          f"one finite number per reward function ({len(funcs)}: {', '.join(funcs)})")
    check(cfg, "lora_targets", len(cfg["lora_targets"]) > 0, "name at least one layer, e.g. ('c_attn',)")
    if cfg["tracin"] and (cfg["grad_checkpoint"] or cfg["lora_dropout"] > 0):
        raise UserError("tracin=True needs grad_checkpoint=False and lora_dropout=0: the hooks must see "
                        "each activation once, exactly as the gradient used it")


RUN_FILES = ("ckpt.pt", "ckpt_[0-9]*.pt", "log.jsonl", "rollouts.jsonl")


def load_base(cfg, out, resume):
    """The frozen base model (dropout off), its data and tokenizer; an adapter being resumed must
    have been trained on exactly these base weights."""
    ensure_base(cfg, resuming=resume is not None)
    base = load_checkpoint(cfg["base_ckpt"])
    # dropout off in RL: with it on, the policy and reference passes see different random masks
    model = model_from_checkpoint(base, cfg["base_ckpt"], dropout=0.0, grad_checkpoint=cfg["grad_checkpoint"])
    fingerprint = base_fingerprint(model.state_dict())
    if resume is not None:
        check_same_base(resume, os.path.join(out, "ckpt.pt"), fingerprint, cfg["base_ckpt"])
    data_dir = base["data_dir"]
    enc = load_tokenizer(data_dir)
    splits = {s: load_split(data_dir, s) for s in ("train", "val", "test")}
    longest = max(len(encode_prompt(enc, e["question"])) for rows in splits.values() for e in rows)
    if longest + cfg["max_new_tokens"] > model.config.block_size:
        raise UserError(f"config key 'max_new_tokens' = {cfg['max_new_tokens']} is not allowed: prompts of up to "
                        f"{longest} tokens + max_new_tokens must fit the base's context of {model.config.block_size}")
    return model, fingerprint, data_dir, enc, splits


def main(argv):
    cfg = configure(defaults, argv)
    resume = None
    if cfg["init_from"] == "resume":  # the saved run's config; only what argv gives overrides it
        check(cfg, "out_dir", cfg["out_dir"] != "", "give the directory of the run to resume")
        resume = load_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"))
        if "lora" not in resume or "base_ckpt" not in resume:
            raise UserError(f"{cfg['out_dir']}/ckpt.pt is not a train_grpo.py checkpoint (a base model's?): "
                            f"give the out_dir of the GRPO run to resume")
        cfg = configure(defaults, argv, saved=resume.get("config", {}))
        cfg["base_ckpt"] = resume["base_ckpt"]
    validate(cfg)
    amp = check_device(cfg["device"], cfg["dtype"])  # bf16 autocast on CUDA, a no-op on CPU
    with run_lock(cfg["out_dir"]):  # a second run in this out_dir is refused from here on
        return train(cfg, amp, resume)


def train(cfg, amp, resume):
    device, out = cfg["device"], cfg["out_dir"]
    found = [f for pattern in RUN_FILES for f in glob.glob(os.path.join(out, pattern))]
    if resume is None and found:
        raise UserError(f"{out} already holds a run ({os.path.basename(found[0])}): continue it with "
                        f"--init_from=resume, or start a new one with another --out_dir (or delete {out})")
    model, fingerprint, data_dir, enc, splits = load_base(cfg, out, resume)
    train_split, val_split, test = splits["train"], splits["val"], splits["test"][:cfg["eval_n"]]
    defective = set(random.Random(cfg["seed"] + 7).sample(range(len(train_split)),
                                                          int(cfg["defect_frac"] * len(train_split))))
    torch.manual_seed(cfg["seed"])
    apply_lora(model, cfg["lora_r"], cfg["lora_alpha"], cfg["lora_dropout"], cfg["lora_targets"])
    model.to(device)
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=cfg["learning_rate"],
                                  weight_decay=cfg["weight_decay"])
    rng = random.Random(cfg["seed"])                                  # which prompts
    generator = torch.Generator(device=device).manual_seed(cfg["seed"])  # which completions
    iter_num, elapsed_before, last_ckpt = 0, 0.0, None
    if resume is not None:
        load_lora_state_dict(model, resume["lora"])
        optimizer.load_state_dict(resume["optimizer"])
        iter_num, elapsed_before = resume["iter_num"], resume["train_seconds"]
        last_ckpt = iter_num
        rng.setstate(resume["rng"]["python"])
        saved_on = resume["rng"].get("device", generator.device.type)
        if saved_on == generator.device.type:
            generator.set_state(resume["rng"]["generator"])
        else:  # a CPU generator's state does not fit a CUDA generator (nor back): new sampling stream
            print(f"warning: run saved on {saved_on}, resumed on {device}: completions are sampled from "
                  f"seed {cfg['seed'] + iter_num} from here on, so they differ from an uninterrupted run")
            generator.manual_seed(cfg["seed"] + iter_num)
        for name in ("log.jsonl", "rollouts.jsonl"):
            truncate_jsonl(os.path.join(out, name), iter_num)
        print(f"resuming {out} at iter {iter_num}")
        del resume  # the optimizer state is copied into the optimizer: free the loaded one
    n_lora = sum(p.numel() for p in lora_parameters(model))
    print(f"GRPO: {model.num_params() / 1e6:.2f}M base parameters frozen, {n_lora} LoRA parameters trained")

    def checkpoint():
        # lr: the rate of the step taken FROM these weights (TracIn's eta_t pairs theta_t with step t)
        state = {"lora": lora_state_dict(model), "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                 "lr": lr_at(iter_num), "config": cfg, "base_ckpt": cfg["base_ckpt"], "base_fingerprint": fingerprint,
                 "data_dir": data_dir, "train_seconds": elapsed_before + time.time() - t_start,
                 "rng": {"python": rng.getstate(), "generator": generator.get_state(),
                         "device": generator.device.type}}
        save_checkpoint(state, os.path.join(out, f"ckpt_{iter_num:06d}.pt"))  # history, for TracIn
        save_checkpoint(state, os.path.join(out, "ckpt.pt"))                 # latest, for resume
        return iter_num

    def run_eval():
        try:
            with amp:
                r = evaluate(model, enc, test, cfg["max_new_tokens"], k=cfg["eval_k"], seed=cfg["seed"])
        except NonFiniteLogits as e:
            print(f"warning: evaluation at iter {iter_num} skipped: {e}")
            return {"test/accuracy": float("nan")}
        k = cfg["eval_k"]
        passk = f" | pass@{k} {r[f'pass@{k}']:.3f}" if k > 1 else ""
        print(f"eval  {iter_num:4d} | test accuracy {r['accuracy']:.3f}{passk} ({len(test)} problems)")
        return {f"test/{k}": v for k, v in r.items()}

    t_start = time.time()
    def lr_at(it):
        return get_lr(it, cfg["lr_decay_iters"] or cfg["max_iters"], cfg["learning_rate"], cfg["min_lr"],
                      cfg["warmup_iters"])
    lr, skipped_in_a_row, log_f, roll_f = lr_at(iter_num), 0, None, None
    try:
        first = {"iter": 0, "elapsed": 0.0, **run_eval()} if iter_num == 0 else None
        if iter_num == 0:
            last_ckpt = checkpoint()  # ckpt_000000: the trajectory starts at the base model
        # the logs are opened only now: a run stopped before its first checkpoint leaves no log behind
        log_f = open(os.path.join(out, "log.jsonl"), "a")
        roll_f = open(os.path.join(out, "rollouts.jsonl"), "a")
        if first is not None:
            log_f.write(json.dumps(first) + "\n")
        while iter_num < cfg["max_iters"]:
            lr = lr_at(iter_num)
            for g in optimizer.param_groups:
                g["lr"] = lr
            picks = [rng.randrange(len(train_split)) for _ in range(cfg["batch_size"])]
            batch = [{**train_split[i], "answer": first_step_result(train_split[i])} if i in defective
                     else train_split[i] for i in picks]
            t_step = time.time()
            val = ([val_split[rng.randrange(len(val_split))] for _ in range(cfg["tracin_val_batch_size"])]
                   if cfg["tracin"] else None)
            log, rollouts = grpo_step(model, optimizer, enc, [e["question"] for e in batch],
                                      [e["answer"] for e in batch], cfg, generator, amp, val)
            iter_num += 1
            if cfg["defect_frac"] > 0 and rollouts is not None:  # selection precision: kept rollouts clean?
                clean = torch.tensor([i not in defective for i in picks]).repeat_interleave(cfg["group_size"])
                log["defect/clean_base_rate"] = clean.float().mean().item()
                if cfg["tracin"] and log["n_selected"] > 0:
                    kept = torch.tensor(rollouts["selected"])
                    log["defect/selection_precision"] = clean[kept].float().mean().item()
                rollouts["defective"] = [i in defective for i in picks]
            log.update(iter=iter_num, lr=lr, step_seconds=time.time() - t_step,
                       elapsed=elapsed_before + time.time() - t_start, **memory_stats(device))
            if iter_num % cfg["eval_interval"] == 0 or iter_num == cfg["max_iters"]:
                log.update(run_eval())
            if rollouts is not None:
                roll_f.write(json.dumps({"iter": iter_num, "lr": lr, **rollouts}) + "\n")
            log_f.write(json.dumps(log) + "\n")
            log_f.flush(); roll_f.flush()
            if iter_num % cfg["log_interval"] == 0:
                print_step(log, cfg, lr)
            skipped_in_a_row = skipped_in_a_row + 1 if log["skipped"] else 0
            if skipped_in_a_row >= cfg["max_skipped_steps"]:
                raise UserError(f"{skipped_in_a_row} steps in a row skipped ({log['skip_reason']}) at iter {iter_num}: "
                                f"the weights or the learning rate ({lr:.1e}) have diverged; the last checkpoint "
                                f"is {out}/ckpt.pt (iter {last_ckpt}); lower learning_rate and start a new run")
            # weights that give NaN logits are not worth keeping (a NaN gradient left them untouched: those are)
            if (iter_num % cfg["ckpt_interval"] == 0 or iter_num == cfg["max_iters"]) and rollouts is not None:
                if all(torch.isfinite(p).all() for p in lora_parameters(model)):
                    last_ckpt = checkpoint()
                else:  # a finite gradient times a huge learning rate: the next step's sampling will say so
                    print(f"warning: NaN/Inf LoRA weights at iter {iter_num}: no checkpoint written")
    except KeyboardInterrupt:
        if last_ckpt is None:  # a new run stopped before ckpt.pt: what it began (ckpt_000000.pt?) is removed,
            for f in (f for pattern in RUN_FILES for f in glob.glob(os.path.join(out, pattern))):
                os.remove(f)   # so that the same command can start it again
        where = (f"last checkpoint {os.path.join(out, 'ckpt.pt')} (iter {last_ckpt}); resume with: python "
                 f"train_grpo.py --out_dir={shlex.quote(out)} --init_from=resume") if last_ckpt is not None else \
            "no checkpoint written yet: run the same command again to start over"
        raise Interrupted(f"train_grpo.py stopped at iter {iter_num} of {cfg['max_iters']}; {where}") from None
    finally:
        for f in (log_f, roll_f):
            if f is not None:
                f.close()
    total = elapsed_before + time.time() - t_start
    print(f"done: {iter_num} GRPO steps in {total:.0f}s; run directory {out}")
    return cfg


def print_step(log, cfg, lr):
    """One |-separated line per log_interval steps."""
    if log.get("reward") is None:  # sampling gave NaN/Inf: no rollouts, no statistics
        print(f"iter {log['iter']:4d} | skipped ({log['skip_reason']}) | lr {lr:.1e}")
        return
    print(f"iter {log['iter']:4d} | reward {log['reward']:.3f} | acc {log['accuracy']:.3f} | "
          f"zero_std {log['frac_reward_zero_std']:.2f} | kl {log['kl']:.4f} | ent {log['entropy']:.3f} | "
          f"len {log['completions/mean_length']:.1f} | lr {lr:.1e} | {log['step_seconds'] * 1000:.0f} ms "
          f"(gen {log['time/generation'] * 1000:.0f}, policy {log['time/policy'] * 1000:.0f}, "
          f"ref {log['time/reference'] * 1000:.0f}) | mem {log['mem_max_alloc_mb']:.0f} MB"
          + (f" | selected {log['n_selected']}/{cfg['batch_size'] * cfg['group_size']} "
             f"(infl {log['influence/mean']:+.2e})" if cfg["tracin"] else ""))


if __name__ == "__main__":
    cli_main(main)
