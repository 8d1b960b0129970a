"""
TracIn (Pruthi et al. 2020) on the LoRA parameters, from the per-sample
gradients of ghost.py: online, inside a GRPO step, and post-hoc,
over a finished run's checkpoints.

Online (train_grpo.grpo_step with tracin=True calls tracin_backward
where standard GRPO calls grpo.grpo_updates):
the influence of rollout i on a validation batch is <g_i, G>,
G the gradient of the (mean) validation loss:
a first-order estimate of how much one step on i lowers it.
The validation loss (tracin_val_loss; train_grpo.Run.validation_batch
builds the batch): 'pg', validation prompts sampled in the step's own
generate call, scored by the task's own rewards (the run's may be
hackable), their GRPO loss without KL; 'nll', their clean reference
solutions as rows with A = +1 (reference_solutions), whose GRPO loss
is the solutions' mean negative log-likelihood.
Only rollouts with positive influence (or the top fraction) are trained on,
and their update is summed from the same per-sample gradients
(no extra forward or backward).

What it costs next to standard GRPO:
  - compute: a forward and backward over the validation rows ('pg' also
    samples and scores them, in the same generate call); each g_i formed
    from the hooks' buffers, O(T d r) a rollout and layer; <g_i, G>,
    O(d r). Saved: the capture forms no batch weight gradient (two matmuls
    a layer), and the update needs no fourth pass.
  - memory: the buffers x, h, gA, gB of every adapted layer for the whole
    batch, n T (d_in + 2 r + d_out) numbers a layer (with several
    micro-batches twice, briefly, while collected), until the per-sample
    gradients, n r (d_in + d_out) float32, are formed from them and the
    hooks are removed. Standard GRPO frees each micro-batch's activations
    after its backward.
  - knobs: num_iterations 1, no gradient checkpointing, lora_dropout 0
    (the hooks need each block's activations: checks/grpo_knobs.py).

Post-hoc (find_critical_samples;
its command line: python -m analysis.attribute):
the rollouts given (the command line: those that moved a weight) scored by
their influence on a test answer, summed over the checkpoints (TracInCP).
"""
# configurator first: a Ctrl-C during the slow imports below (torch)
# is one line, not a traceback
from configurator import UserError
import math
from contextlib import nullcontext
from dataclasses import replace

import torch
from torch.nn.utils.rnn import pad_sequence

from ghost import (compute_ghost_inner_product_matrix, ghost_mode,
                   install_ghost_hooks, per_sample_grads, subset_gradients,
                   summed_gradient, summed_inner_products)
from data.prompts import encode_prompt, encode_text
from model import pad_prompts
from grpo import (LossKnobs, PhaseTimer, Rollouts, completion_logprobs,
                  policy_backward, rank_part, with_reference)
from lora import LoRALinear, load_lora_state_dict, lora_state_dict
from scale import distributed


def reference_solutions(enc, examples, device):
    """The validation batch for tracin_val_loss='nll': each prompt followed
    by its clean reference solution (nll_row, A = +1), laid out as
    model.generate lays out rollouts: its gradient is that of the
    solutions' negative log-likelihood, so no sampling is needed."""
    rows = [nll_row(enc, e["question"], encode_text(enc, e["solution"]))
            for e in examples]
    idx, pad_left, mask, adv = rollout_batch(enc, rows, device)
    return Rollouts(idx, pad_left, mask, adv)


def nll_row(enc, question, completion, advantage=1.0):
    """A question and a given completion (token ids) as a rollout row,
    end-of-text appended, every token counted.
    With A = +1 its GRPO loss (ratio 1, no KL) has the gradient of the
    completion's mean negative log-likelihood, -grad mean_t log p(y_t);
    with A = -1, minus that. TracIn's 'nll' validation rows and post-hoc
    attribution's test answers are such rows."""
    toks = completion + [enc.eot_token]
    return {"prompt": question,
            "completion_tokens": toks,
            "completion_mask": [1] * len(toks),
            "advantage": advantage}


def rollout_batch(enc, samples, device):
    """samples: dicts with 'prompt' (text), 'completion_tokens',
    'completion_mask', 'advantage' -> (idx (n, P+T), pad_left (n,),
    mask (n, T), advantages (n,)) in model.generate's layout."""
    prompts = [encode_prompt(enc, s["prompt"]) for s in samples]
    idx, pad_left = pad_prompts(prompts, enc.eot_token, device)

    def padded(key, pad):
        rows = [torch.tensor(s[key], dtype=torch.long) for s in samples]
        return pad_sequence(rows, True, pad)
    comp = padded("completion_tokens", enc.eot_token)
    mask = padded("completion_mask", 0)
    missing = comp.size(1) - mask.size(1)
    # a shorter mask: 0s
    mask = torch.cat([mask, mask.new_zeros(len(samples), missing)], 1)
    adv = torch.tensor([float(s["advantage"]) for s in samples])
    idx = torch.cat([idx, comp.to(device)], 1)
    return idx, pad_left, mask.to(device), adv.to(device)


def tracin_backward(model, optimizer, rollouts, val_batch, cfg,
                    timer=None, amp=nullcontext()):
    """TracIn-GRPO's passes 3 and 2 and backward, where standard GRPO runs
    grpo.grpo_updates (grpo_step then calls update itself):
    every rollout's LoRA gradient g_i from the hooks,
    influence_i = <g_i, G>, the selection, and the selected rollouts'
    summed gradient written into .grad from the hooks' buffers
    (no 4th pass).
    G: the gradient of the validation loss (val_batch: Rollouts),
    normalised as grpo_loss does (1/n_val for 'grpo'; g_i carries its
    1/n too). 'summed' influence: G from ordinary backwards (one per
    micro-batch, adding up in .grad), then <g_i, G>, O(T d r) per
    rollout; 'matrix': row sums of the [N, N_val]
    matrix of captured validation rows (equal up to rounding).
    Under torchrun each rank captures its rows; the selection sees every
    rank's influence.
    -> (stats, influence (N,), keep (N,) bool, skip reason or None):
    a non-finite influence skips the step (no weight moves)."""
    matrix = cfg["tracin_influence"] == "matrix"
    timer = timer or PhaseTimer()
    knobs = LossKnobs.from_cfg(cfg)
    # this rank's rows (all in one process)
    batch = rank_part(rollouts)
    # PASS 3, before the capture
    batch = with_reference(model, batch, cfg, knobs, timer, amp)
    # The capture (ghost.GhostHooks): lora_A's forward hook keeps each
    # sample's x and h = A x, tensor hooks the output gradients
    # gA = dL/dh, gB = dL/d(B h); the split 'train' forms no .grad
    # (the summed gradient nobody reads).
    # ghost_mode: optimizer.step() raises, no update.
    with install_ghost_hooks(model) as hooks, ghost_mode(optimizer):
        # pass 2 and the backward: per-sample factors (the seconds of the
        # capture phases include policy_backward's own "policy" seconds)
        with timer("grad_capture_train"):
            stats = policy_backward(model, batch, cfg, knobs, timer, amp)
        # 'summed': no hook keeps, G adds up in .grad
        hooks.split = "val" if matrix else None
        with timer("grad_capture_val"):  # no KL term in the validation loss
            val_rows = val_batch if matrix else informative_rows(val_batch, cfg)
            policy_backward(model, val_rows, cfg, replace(knobs, beta=0.0), timer, amp)
        train_grads = hooks.collect("train")
        # per validation row, or G {layer: (G_A, G_B)}
        if matrix:
            val_grads = hooks.collect("val")
        else:
            val_grads = summed_gradient(model)
    with timer("influence"):
        # row sums of [N, N_val]: validation GRADIENTS are summed,
        # not activations
        if matrix:
            products = compute_ghost_inner_product_matrix(train_grads, val_grads)
            influence = products.sum(1)
        # each rollout's (r, d) per factor
        train_grads = per_sample_grads(train_grads)
        if not matrix:  # <g_i, G>: O(T d r) per rollout
            influence = summed_inner_products(train_grads, val_grads)
        # every rank's, in batch order: (N,)
        influence = distributed.all_gather_cat(influence)
        keep = select_rollouts(influence, cfg["tracin_selection"],
                               cfg["tracin_topk_frac"])
        # this rank's rows of the whole batch's selection
        mine = distributed.shard(len(keep))
        # the kept rollouts' summed gradient
        subset_gradients(model, train_grads, keep[mine])
        # every LoRA layer's per-sample gradients; G or val's buffers
        del train_grads, val_grads
    skip_reason = None
    # one NaN/Inf is enough: no rollout is trusted
    if not torch.isfinite(influence).all():
        skip_reason = "non-finite influence"
        print(f"warning: {skip_reason}; step skipped, weights untouched")
    elif not keep.any():
        print("tracin: no rollout has positive influence; "
              "no update this step")
    return stats, influence, keep, skip_reason


def informative_rows(batch, cfg):
    """Validation rows that can move G: without KL an advantage-0 row has
    zero gradient, skipped; the batch's counts stay the divisors
    ('bnpo' keeps all; one row stays: every .grad exists)."""
    keep = batch.advantages != 0
    if cfg["loss_type"] == "bnpo" or bool(keep.all()):
        return batch
    keep[0] |= not keep.any()
    return batch.part(keep)


def select_rollouts(influence, rule="positive", topk_frac=0.5):
    """Rollouts to train on (bool): 'positive', influence > 0 (to first
    order, training on it lowers the validation loss); 'topk', the top
    fraction by influence."""
    if rule == "positive":
        return influence > 0
    if rule == "topk":
        k = max(1, int(round(topk_frac * influence.numel())))
        mask = torch.zeros_like(influence, dtype=torch.bool)
        mask[torch.topk(influence, k).indices] = True
        return mask
    raise UserError("tracin_selection must be 'positive' or 'topk', "
                    f"got {rule!r}")


# -----------------------------------------------------------------------------
# post-hoc attribution over a finished run's checkpoints
# (TracInCP, Pruthi et al. 2020)
#
#   TracIn(z_test, z_train) =
#       sum_s eta_s < grad L(z_test, theta_s), grad L(z_train, theta_s) >
#
# The sum runs over training steps s; the saved checkpoints t stand in
# for them (see find_critical_samples' checkpoint_steps for how each is
# weighted).
# Sign convention: positive = a gradient step on z_train lowers the test
# loss (it helps).
# Train loss of a rollout: its GRPO policy-gradient loss,
# -A_i * mean_t log pi(y_t) (ratio 1, no KL).
# Test loss: the negative log-likelihood of the test completion,
# -mean_t log pi(y_t).
# log pi uses logits / temperature, the run's sampling temperature
# (0 = greedy: plain log-probs).

def find_critical_samples(model, checkpoints, train_samples, test_samples,
                          enc, mode="memory_efficient", learning_rates=None,
                          layer_filter=None, n_probe=None, top_k=5,
                          temperature=1.0, micro_batch=64, normalize=False,
                          self_influence=False, checkpoint_steps=None,
                          load=None):
    """Score training rollouts by their influence on test samples,
        TracInCP(z_test, z_i) = sum_t w_t <g_test(theta_t), g_i(theta_t)>,
        w_t = eta_t k_t,
    over checkpoints (GRPO checkpoints' paths, or state dicts, holding
    'lora' and 'lr').
    eta_t: learning_rates, default each checkpoint's 'lr'.
    k_t, the training steps checkpoint t stands for: checkpoint_steps,
    default trapezoid_steps of the checkpoints' 'iter_num' (1 each where
    one is missing: Captum's TracInCP, which weighs by the learning rate
    alone).
    mode: 'simple' (the last checkpoint, w = 1), 'full' (all loaded
    first), 'memory_efficient' (one at a time).
    load: reads a path (default: torch.load, weights only).
    temperature: the run's. n_probe: that many rollouts, evenly spaced.
    normalize: also cosine_score, w_t <g_i, G_t> / (||g_i|| ||G_t||),
    G_t = sum_j g_test_j; self_influence: also w_t ||g_i||^2.
    Train/eval flag, LoRA weights, .grad: restored on return."""
    counts = {"n_probe": (n_probe, 0), "micro_batch": (micro_batch, 1),
              "top_k": (top_k, 0)}
    check_attribution_inputs(model, checkpoints, train_samples, test_samples,
                             mode, learning_rates, checkpoint_steps,
                             layer_filter, counts, temperature)
    load = load or read_checkpoint
    if mode == "simple":
        checkpoints = checkpoints[-1:]
        learning_rates, checkpoint_steps = [1.0], [1.0]
    n = len(train_samples)
    if n_probe and n_probe < n:
        train_samples = [train_samples[i * n // n_probe] for i in range(n_probe)]
    # micro-batches laid out once for every checkpoint, each padded to its
    # own longest row only (rollouts are recorded step by step: neighbours
    # share their step's completion length)
    device = next(model.parameters()).device

    def chunked(rows):
        starts = range(0, len(rows), micro_batch)
        return [rollout_batch(enc, rows[s:s + micro_batch], device)
                for s in starts]
    train_chunks = chunked(train_samples)
    test_chunks = chunked(test_samples)
    # 'full': every checkpoint in memory first;
    # 'memory_efficient' loads each in turn, once
    if mode == "full":
        checkpoints = [load(c) if isinstance(c, str) else c for c in checkpoints]
    # per checkpoint: eta_t, its iteration,
    # <g_i, G_t> (n,), ||g_i||^2 (n,), ||G_t||^2
    etas, iters, products = [], [], []
    # put back in `finally`: the train/eval flag, LoRA weights,
    # .grad (hook_products sets None)
    was_training, own_lora = model.training, lora_state_dict(model)
    grads = [(p, p.grad) for p in model.parameters()]
    # dropout off: deterministic scores;
    # no gradient checkpointing (the hooks need that)
    model.eval()
    try:
        for t, ckpt in enumerate(checkpoints):
            from_file = isinstance(ckpt, str)
            name = ckpt if from_file else f"{t} (of {len(checkpoints)})"
            state = load(ckpt) if from_file else ckpt
            lora = state["lora"] if "lora" in state else state
            try:
                load_lora_state_dict(model, lora)
            # named: one checkpoint of many (a base's, another run's)
            except UserError as e:
                raise UserError(f"checkpoint {name}: {e}") from None
            if learning_rates is not None:
                eta = learning_rates[t]
            else:
                eta = state.get("lr", 1.0)
            # k_t given, or checked once all iterations are known (below)
            k = checkpoint_steps[t] if checkpoint_steps is not None else 1.0
            iters.append(state.get("iter_num"))
            # its adapter and optimizer state: one checkpoint in memory
            del state, lora
            finite = (isinstance(x, (int, float)) and math.isfinite(x)
                      for x in (eta, k))
            if not all(finite):
                raise UserError(
                    f"checkpoint {name}: learning rate {eta!r}, steps {k!r}: "
                    "give finite numbers (learning_rates, checkpoint_steps)")
            products.append(hook_products(model, train_chunks, test_chunks,
                                          temperature, layer_filter))
            if not torch.isfinite(products[-1][0]).all():
                raise UserError(
                    f"NaN/Inf gradient inner products at checkpoint {name}: "
                    "its adapter or the rollouts give non-finite gradients; "
                    "leave it out")
            etas.append(float(eta))
    finally:
        load_lora_state_dict(model, own_lora)
        for p, g in grads:
            p.grad = g
        model.train(was_training)
    # w_t = eta_t k_t, once every checkpoint's iteration is known
    steps = checkpoint_steps or step_weights(iters)
    weights = [eta * k for eta, k in zip(etas, steps)]
    # w_t <g_i, G_t>
    contrib = [w * inner for w, (inner, _, _) in zip(weights, products)]
    cosine = []
    if normalize:
        cosine = [c / (tr_sq * te_sq).sqrt().clamp(min=1e-12)
                  for c, (_, tr_sq, te_sq) in zip(contrib, products)]
    selfinf = []
    if self_influence:  # w_t ||g_i||^2
        selfinf = [w * tr_sq for w, (_, tr_sq, _) in zip(weights, products)]
    return attribution_result(train_samples, contrib, cosine, selfinf, mode,
                              weights, top_k)


def step_weights(iters):
    """k_t: trapezoid_steps over the checkpoints' iterations when every one
    holds an increasing 'iter_num' (a GRPO run's do), else 1 each."""
    known = all(type(s) is int for s in iters)
    if known and all(a < b for a, b in zip(iters, iters[1:])):
        return trapezoid_steps(iters)
    return [1.0] * len(iters)


def trapezoid_steps(iters):
    """Training steps each checkpoint stands for,
    from the iterations s_0 < ... < s_{n-1} it was saved at:
    (s_{i+1} - s_{i-1}) / 2 with s_{-1} = s_0 and s_n = s_{n-1}
    (trapezoid rule), so the weights add up to s_{n-1} - s_0 steps.
    A single checkpoint stands for itself: weight 1."""
    s = [iters[0], *iters, iters[-1]]
    if len(iters) == 1:
        return [1.0]
    return [(s[i + 2] - s[i]) / 2 for i in range(len(iters))]


def hook_products(model, train_chunks, test_chunks, temperature, layer_filter):
    """One checkpoint: (<g_i, G> (n,), ||g_i||^2 (n,), ||G||^2),
    G = sum_j g_test_j from ordinary backwards of the test loss, chunk by
    chunk into .grad (no hooks); g_i from the hooks, chunk by chunk."""
    model.zero_grad(set_to_none=True)
    for c in test_chunks:  # before the hooks exist: no per-sample test buffers
        # micro-batches add up in .grad
        sample_losses(model, *c, temperature).backward()
    # {layer: (G_A, G_B)}; .grad cleared for the capture
    G = summed_gradient(model, layer_filter)
    # ||G||^2
    te_sq = sum(GA.pow(2).sum() + GB.pow(2).sum() for GA, GB in G.values())
    inner, tr_sq = [], []
    with install_ghost_hooks(model) as hooks:
        for c in train_chunks:  # chunk by chunk: buffers stay small
            sample_losses(model, *c, temperature).backward()
            # G's layers only
            train_grads = per_sample_grads(hooks.collect("train"), G.keys())
            # the buffers: the per-sample gradients hold what is needed
            hooks.clear("train")
            # <g_i, G>: (chunk,)
            inner.append(summed_inner_products(train_grads, G))
            # ||g_i||^2: (chunk,)
            squares = (dA.pow(2).sum((1, 2)) + dBt.pow(2).sum((1, 2))
                       for dA, dBt in train_grads.values())
            tr_sq.append(sum(squares))
            del train_grads  # this chunk's per-sample gradients
    inner = torch.cat(inner).double().cpu()  # float64 sums
    tr_sq = torch.cat(tr_sq).double().cpu()
    return inner, tr_sq, te_sq.double().cpu()


def sample_losses(model, idx, pad_left, mask, advantages, temperature=1.0):
    """sum_i -A_i * mean_t log pi(y_t) over completion tokens: the GRPO
    loss at ratio 1, no KL ('grpo'), written out; its backward gives every
    sample its own gradient in the hooks."""
    T = mask.size(1)
    logp, _ = completion_logprobs(model, idx, pad_left, T, temperature)  # (n, T)
    mask = mask.to(logp.dtype)
    return -(advantages * (logp * mask).sum(1) / mask.sum(1).clamp(min=1)).sum()


def read_checkpoint(path):
    """A checkpoint file's dict, read with weights_only=True (no code in it
    runs); the command line passes runs/checkpoint.load_checkpoint, whose
    errors say more."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UserError(f"checkpoint {path} cannot be read "
                        f"({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise UserError(f"checkpoint {path} holds a "
                        f"{type(state).__name__}, not a dict")
    return state


# -----------------------------------------------------------------------------
# find_critical_samples' arguments checked before any work,
# and its result dictionary

def is_row(s, vocab_size):
    """Whether rollout_batch can lay s out: a dict of 'prompt' (text),
    'completion_tokens' (1+ ids below vocab_size), 'completion_mask'
    (as long) and a finite 'advantage'."""
    get = s.get if isinstance(s, dict) else lambda key: None
    toks, mask = get("completion_tokens"), get("completion_mask")
    adv = get("advantage")
    return (isinstance(get("prompt"), str)
            and isinstance(toks, list) and len(toks) > 0
            and all(type(t) is int and 0 <= t < vocab_size for t in toks)
            and isinstance(mask, list) and len(mask) == len(toks)
            and type(adv) in (int, float) and math.isfinite(adv))


def check_attribution_inputs(model, checkpoints, train_samples, test_samples,
                             mode, learning_rates, checkpoint_steps,
                             layer_filter, counts, temperature):
    """find_critical_samples' arguments, checked before any work."""
    if mode not in ("simple", "full", "memory_efficient"):
        raise UserError("mode must be 'simple', 'full' or 'memory_efficient', "
                        f"got {mode!r}")
    # one path's letters, one state dict's keys
    if isinstance(checkpoints, (str, dict)):
        raise UserError("checkpoints: give a list (of paths or state dicts), "
                        f"not one {checkpoints!r:.60}")
    if not (checkpoints and train_samples and test_samples):
        what = "no checkpoints" if not checkpoints else "nothing"
        raise UserError(f"{what} to attribute over: give at least one "
                        "checkpoint, one training rollout and one test sample")
    vocab = model.config.vocab_size
    for name, rows in (("train_samples", train_samples),
                       ("test_samples", test_samples)):
        bad = (i for i, s in enumerate(rows) if not is_row(s, vocab))
        i = next(bad, None)
        if i is not None:
            raise UserError(
                f"{name}[{i}] is not a rollout: give a dict of 'prompt' "
                f"(text), 'completion_tokens' (1+ ids below {vocab}), "
                "'completion_mask' (as long) and a finite 'advantage'")
    # n_probe (None: all), micro_batch, top_k
    for name, (n, least) in counts.items():
        if n is not None and (type(n) is not int or n < least):
            raise UserError(f"{name} must be an integer >= {least}, got {n!r}")
    if not temperature >= 0:  # NaN too
        raise UserError("temperature must be >= 0 (the run's; 0: greedy), "
                        f"got {temperature!r}")
    for name, per in (("learning rates", learning_rates),
                      ("checkpoint_steps", checkpoint_steps)):
        if per is not None and len(per) != len(checkpoints):
            raise UserError(f"{len(checkpoints)} checkpoints "
                            f"but {len(per)} {name}")
    layers = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    if layer_filter is not None and not any(layer_filter in n for n in layers):
        raise UserError(f"layer_filter {layer_filter!r} matches no LoRA layer "
                        f"({layers[:4]} ...)")


def attribution_result(train_samples, contrib, cosine, selfinf, mode,
                       weights, top_k):
    """find_critical_samples' result dictionary (the TracIn documentation's,
    plus the weights w_t, oldest first). contrib, cosine, selfinf: (n,)
    float64 per checkpoint, none if not asked for."""
    scores = sum(contrib)
    # 0: not asked for
    extra = {"cosine_score": sum(cosine), "self_influence": sum(selfinf)}
    hidden = ("completion_tokens", "completion_mask")
    per_sample = []
    for i, s in enumerate(train_samples):
        shown = {k: v for k, v in s.items() if k not in hidden}
        asked = {k: v[i].item() for k, v in extra.items() if torch.is_tensor(v)}
        per_sample.append({
            **shown,
            "index": i,
            "tracin_score": scores[i].item(),
            "checkpoint_contributions": [c[i].item() for c in contrib],
            **asked})
    n = len(per_sample)
    order = sorted(range(n), key=lambda i: scores[i].item(), reverse=True)
    by_size = sorted(per_sample, key=lambda e: -abs(e["tracin_score"]))
    critical = by_size[:top_k]
    positive = [per_sample[i] for i in order[:top_k] if scores[i] > 0]
    negative = [per_sample[i] for i in reversed(order[-top_k:])
                if scores[i] < 0]
    return {"mode": mode,
            "num_checkpoints": len(weights),
            "checkpoint_weights": weights,
            "num_train_samples": len(order),
            "critical_samples": critical,
            "scores": per_sample,
            "most_influential_positive": positive,
            "most_influential_negative": negative,
            "mean_influence_score": scores.mean().item(),
            "max_influence_score": scores.max().item()}


# the post-hoc command line reads a run directory: analysis/
if __name__ == "__main__":
    raise SystemExit("post-hoc TracIn's command line: "
                     "python -m analysis.attribute --out_dir=RUN --question=...")
