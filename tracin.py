"""
TracIn (Pruthi et al. 2020) on the LoRA parameters, from the per-sample gradients of ghost.py: online,
inside a GRPO step, and post-hoc, over a finished run's checkpoints.

Online (train_grpo.py with tracin=True; tracin_backward replaces grpo.policy_backward): the influence of
rollout i on a validation batch is <g_i, sum_j g_val_j>, a first-order estimate of how much one step on i
lowers the validation loss; only rollouts with positive influence (or the top fraction) are trained on,
and their update is summed from the same per-sample gradients (no extra forward or backward).

Post-hoc (find_critical_samples; its command line: python -m analysis.attribute, or python tracin.py):
every recorded rollout scored by its influence on a test answer, summed over the checkpoints (TracInCP).
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, cli_main
import torch

from ghost import (compute_ghost_inner_product_matrix, ghost_mode, install_ghost_hooks, per_sample_grads,
                   subset_gradients, summed_gradient, summed_inner_products)
from sample import encode_text
from grpo import (batch_counts, completion_logprobs, phase, policy_backward, rank_share, rollout_batch,
                  sum_over_ranks)
from lora import LoRALinear, load_lora_state_dict, lora_state_dict
from model import load_checkpoint
from scale import distributed


def select_rollouts(influence, rule="positive", topk_frac=0.5):
    """Boolean mask of rollouts to train on. 'positive': influence > 0 (training on it lowers
    the validation loss, to first order). 'topk': the top fraction by influence."""
    if rule == "positive":
        return influence > 0
    if rule == "topk":
        k = max(1, int(round(topk_frac * influence.numel())))
        mask = torch.zeros_like(influence, dtype=torch.bool)
        mask[torch.topk(influence, k).indices] = True
        return mask
    raise UserError(f"tracin_selection must be 'positive' or 'topk', got {rule!r}")


def nll_row(enc, question, completion, advantage=1.0):
    """A question and a given completion (token ids) as a rollout row, end-of-text appended, every token
    counted. With A = +1 its GRPO loss (ratio 1, no KL) has the gradient of the completion's mean negative
    log-likelihood, -grad mean_t log p(y_t); with A = -1, minus that. TracIn's 'nll' validation rows
    and post-hoc attribution's test answers are such rows."""
    toks = completion + [enc.eot_token]
    return {"prompt": question, "completion_tokens": toks, "completion_mask": [1] * len(toks), "advantage": advantage}


def reference_solutions(enc, examples, device):
    """The validation batch for tracin_val_loss='nll': each prompt followed by its clean reference
    solution (nll_row, A = +1), laid out as sample.generate lays out rollouts: its gradient is that of
    the solutions' negative log-likelihood, so no sampling is needed."""
    rows = [nll_row(enc, e["question"], encode_text(enc, e["solution"])) for e in examples]
    idx, pad_left, mask, adv = rollout_batch(enc, rows, device)
    return dict(idx=idx, pad_left=pad_left, mask=mask, advantages=adv)


def tracin_backward(model, optimizer, rollouts, val_batch, cfg):
    """TracIn-GRPO's backward, in place of grpo.policy_backward: every rollout's LoRA gradient from the
    hooks, influence_i = <g_i, sum_j g_val_j>, the selection, and the selected rollouts' summed gradient
    written into .grad from the hooks' buffers (no 4th pass). cfg['tracin_influence']:
      'summed'  G = sum_j g_val_j from ONE ordinary backward of the validation loss (nothing kept per row),
                then <g_i, G> per layer from the train buffers: O(T d r) per rollout
      'matrix'  every validation row's gradient captured too; the row sums of the [N, N_val] matrix
    Both give the same influence up to float rounding. Under torchrun each rank captures its share of the
    rollouts and, for 'summed', of the validation rows, both divided by the whole batch's counts
    (grpo.rank_share): G is all-reduced (LoRA-sized), so no rank pays the whole validation pass and G is
    the single-process G. 'matrix' needs every validation row's buffers: each rank runs them all. The
    influences are gathered ('topk' needs the global threshold), the kept gradients summed over ranks.
    Returns (loss stats, influence (N,), keep (N,) bool, log entries), all of the whole batch."""
    matrix, mb = cfg["tracin_influence"] == "matrix", cfg["micro_batch_size"]
    # The capture: a forward hook on every lora_A / lora_B keeps each sample's input x and h = A x, a tensor
    # hook its output gradient gA = dL/dh, gB = dL/d(B h) (ghost.GhostHooks). While the split is 'train' the
    # LoRA weights do not require grad: the backward forms no .grad (the batch's summed gradient, which
    # nobody reads), only what flows through the hooks. ghost_mode makes optimizer.step() raise meanwhile.
    with install_ghost_hooks(model) as hooks, ghost_mode(optimizer):  # no weight can change in here
        with phase("grad_capture_train"):  # passes 3 and 2 and the backward: per-sample factors, no .grad
            stats = policy_backward(model, rank_share(rollouts, mb), cfg, cfg["beta"])
        hooks.split = "val" if matrix else None  # 'summed': the hooks keep nothing, the weights need grad again
        with phase("grad_capture_val"):  # the validation loss has no KL term; 'summed': G adds up in .grad
            policy_backward(model, val_batch if matrix else informative_rows(rank_share(val_batch, mb), cfg),
                            cfg, beta=0.0)
        train_grads = hooks.collect("train")
        val_grads = hooks.collect("val") if matrix else summed_gradient(model)  # per row, or G {layer: (G_A, G_B)}
    with phase("influence"):
        if matrix:  # row sums of the [N, N_val] matrix: validation GRADIENTS are summed, not activations
            influence = compute_ghost_inner_product_matrix(train_grads, val_grads).sum(1)
        train_grads = per_sample_grads(train_grads)  # each rollout's (r, d) per factor; the buffers are freed
        if not matrix:
            distributed.all_reduce_sum([g for pair in val_grads.values() for g in pair])  # the whole batch's G
            influence = summed_inner_products(train_grads, val_grads)  # <g_i, G>: (N,), O(T d r) per rollout
        influence = distributed.all_gather_cat(influence)  # every rollout's, in global order
        keep = select_rollouts(influence, cfg["tracin_selection"], cfg["tracin_topk_frac"])
        subset_gradients(model, train_grads, keep[distributed.shard(keep.numel())])  # this rank's kept rollouts
        del train_grads, val_grads  # every LoRA layer's per-sample gradients (and G, or the validation buffers)
        stats = sum_over_ranks(model, stats)  # the kept rollouts' gradients and the loss stats of every rank
    log = {"selection_rate": keep.float().mean().item(), "n_selected": int(keep.sum()),
           "influence/mean": influence.mean().item(), "influence/std": influence.std().item(),
           "influence/min": influence.min().item(), "influence/max": influence.max().item()}
    return stats, influence, keep, log


def informative_rows(batch, cfg):
    """The validation rows that can move G. The validation loss has no KL term, so a row whose advantage
    is 0 (with 'pg': every sample of a group that scored alike) has exactly zero gradient: its forward
    and backward are skipped. The batch's own counts stay the normalisers, so G is unchanged ('bnpo',
    which divides per micro-batch, keeps every row; one row is kept so that every LoRA .grad exists)."""
    keep = batch["advantages"] != 0
    if cfg["loss_type"] == "bnpo" or bool(keep.all()):
        return batch
    keep[0] |= not keep.any()
    counts = batch.get("global_counts") or batch_counts(batch["mask"])
    return {**{k: batch[k][keep.to(batch[k].device)] for k in ("idx", "pad_left", "mask", "advantages")},
            "global_counts": counts}


# ---------------------------------------------------------------------------------------------
# post-hoc attribution over a finished run's checkpoints (TracInCP, Pruthi et al. 2020)
#
#   TracIn(z_test, z_train) = sum_s eta_s < grad L(z_test, theta_s), grad L(z_train, theta_s) >
#
# The sum runs over training steps s; the saved checkpoints t stand in for them (see
# find_critical_samples' checkpoint_steps for how each is weighted).
# Sign convention: positive = a gradient step on z_train lowers the test loss (it helps).
# Train loss of a rollout: its GRPO policy-gradient loss, -A_i * mean_t log pi(y_t) (ratio 1, no KL).
# Test loss: the negative log-likelihood of the test completion, -mean_t log pi(y_t).
# log pi uses logits / temperature, the run's sampling temperature (0 = greedy: plain log-probs).

def sample_losses(model, idx, pad_left, mask, advantages, temperature=1.0):
    """Sum over samples of each sample's own loss, -A_i * mean_t log pi(y_t) over its completion tokens: the
    GRPO loss (grpo.grpo_loss, 'grpo' aggregation) at ratio 1 without KL, whose gradient it has, written
    out. The backward of this sum gives every sample its own gradient in the hooks."""
    logp, _ = completion_logprobs(model, idx, pad_left, mask.size(1), temperature)     # (n, T)
    mask = mask.to(logp.dtype)
    return -(advantages * (logp * mask).sum(1) / mask.sum(1).clamp(min=1)).sum()


def chunks(batch, size, order=None):
    """The batch's rows (in `order`) in chunks of `size`, each without the columns that all its rows pad:
    the left padding they share and the completion columns after the longest completion. Positions count
    from each row's first real token and attention is causal, so every row's loss and gradient are as in
    the full batch; only less padding is computed."""
    idx, pad_left, mask, adv = batch
    order = torch.arange(idx.size(0), device=idx.device) if order is None else order
    P = idx.size(1) - mask.size(1)
    for s in range(0, idx.size(0), size):
        rows = order[s:s + size]
        m, left = mask[rows], int(pad_left[rows].min())
        T = int(m.any(0).nonzero().max()) + 1 if m.any() else 1
        yield idx[rows, left:P + T], pad_left[rows] - left, m[:, :T], adv[rows]


def sq_norms(grads):
    """||grad L(z_i)||^2 per sample, from per-sample LoRA gradients (ghost.per_sample_grads)."""
    return sum(dA.pow(2).sum((1, 2)) + dBt.pow(2).sum((1, 2)) for dA, dBt in grads.values())


def hook_products(model, train_batch, test_batch, temperature, layer_filter, micro_batch, norms):
    """One checkpoint: (<g_i, G> (n,), ||g_i||^2 (n,), ||G||^2) with G = sum_j g_test_j from ONE ordinary
    backward of the summed test loss (no hooks, LoRA-sized), and the train gradients from the hooks,
    chunk by chunk (each chunk's per-sample gradients formed from the buffers, r x d per factor);
    the two norms only if `norms`."""
    model.zero_grad(set_to_none=True)
    for c in chunks(test_batch, micro_batch):  # before the hooks exist: no per-sample test buffers
        sample_losses(model, *c, temperature).backward()  # micro-batches add up in .grad
    G = summed_gradient(model, layer_filter)  # {layer: (G_A, G_B)}; .grad cleared, the train capture starts clean
    te_sq = sum(GA.pow(2).sum() + GB.pow(2).sum() for GA, GB in G.values()) if norms else None
    inner, tr_sq = [], []
    idx, pad_left, mask, _ = train_batch
    order = (idx.size(1) - mask.size(1) - pad_left + mask.sum(1)).argsort()  # by length: chunks pad little
    with install_ghost_hooks(model) as hooks:
        for c in chunks(train_batch, micro_batch, order):  # chunk by chunk: buffers stay small
            sample_losses(model, *c, temperature).backward()
            train_grads = per_sample_grads(hooks.collect("train"), G.keys())  # the layers of G (layer_filter)
            hooks.clear("train")  # the buffers: the per-sample gradients hold what is needed
            inner.append(summed_inner_products(train_grads, G))       # <g_i, G>: (chunk,)
            if norms:
                tr_sq.append(sq_norms(train_grads))
            del train_grads  # this chunk's per-sample gradients
    model.zero_grad(set_to_none=True)  # capture's .grad is not an update
    back = order.argsort()  # the rows' own order again
    return torch.cat(inner)[back], torch.cat(tr_sq)[back] if norms else None, te_sq


def loop_gradients(model, batch, temperature, layer_filter=None):
    """Reference path: one autograd.grad per sample, flattened: (n, number of LoRA parameters)."""
    params = [p for n, p in model.named_parameters()
              if ".lora_" in n and (layer_filter is None or layer_filter in n)]
    idx, pad_left, mask, adv = batch
    out = []
    for i in range(idx.size(0)):
        loss = sample_losses(model, idx[i:i + 1], pad_left[i:i + 1], mask[i:i + 1], adv[i:i + 1], temperature)
        out.append(torch.cat([g.float().flatten() for g in torch.autograd.grad(loss, params)]))
    return torch.stack(out)


def trapezoid_steps(iters):
    """Training steps each checkpoint stands for, from the iterations s_0 < ... < s_{n-1} it was saved
    at: (s_{i+1} - s_{i-1}) / 2 with s_{-1} = s_0 and s_n = s_{n-1} (trapezoid rule), so the weights
    add up to s_{n-1} - s_0 steps. A single checkpoint stands for itself: weight 1."""
    s = [iters[0], *iters, iters[-1]]
    return [(s[i + 2] - s[i]) / 2 for i in range(len(iters))] if len(iters) > 1 else [1.0]


def check_attribution_inputs(model, checkpoints, train_samples, test_samples, mode, gradient_method,
                             learning_rates, checkpoint_steps, layer_filter):
    """find_critical_samples' arguments, checked before any work."""
    if mode not in ("simple", "full", "memory_efficient"):
        raise UserError(f"mode must be 'simple', 'full' or 'memory_efficient', got {mode!r}")
    if gradient_method not in ("hooks", "loop"):
        raise UserError(f"gradient_method must be 'hooks' or 'loop', got {gradient_method!r}")
    if not checkpoints:
        raise UserError("no checkpoints to attribute over")
    for name, per_ckpt in (("learning rates", learning_rates), ("checkpoint_steps", checkpoint_steps)):
        if per_ckpt is not None and len(per_ckpt) != len(checkpoints):
            raise UserError(f"{len(checkpoints)} checkpoints but {len(per_ckpt)} {name}")
    if not train_samples or not test_samples:
        raise UserError("need at least one training rollout and one test sample")
    layers = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    if layer_filter is not None and not any(layer_filter in n for n in layers):
        raise UserError(f"layer_filter {layer_filter!r} matches no LoRA layer (layers: {layers[:4]} ...)")


def checkpoint_products(model, train_batch, test_batch, temperature, layer_filter, gradient_method, micro_batch,
                        norms, t):
    """At the loaded checkpoint t: (<g_i, G> (n,), ||g_i||^2 (n,), ||G||^2) with G = sum_j g_test_j,
    float64 on the CPU whatever the model's device; the norms are None from the hooks unless asked for."""
    if gradient_method == "loop":
        tr, te = (loop_gradients(model, b, temperature, layer_filter) for b in (train_batch, test_batch))
        inner, tr_sq, te_sq = tr @ te.sum(0), tr.pow(2).sum(1), te.sum(0).pow(2).sum()
    else:
        inner, tr_sq, te_sq = hook_products(model, train_batch, test_batch, temperature, layer_filter, micro_batch, norms)
    if not torch.isfinite(inner).all():
        raise FloatingPointError(f"NaN/Inf in gradient inner products at checkpoint {t}")
    return tuple(None if v is None else v.double().cpu() for v in (inner, tr_sq, te_sq))


def attribution_result(train_samples, scores, contributions, cosine, selfinf, mode, weights, top_k):
    """The result dictionary of the TracIn documentation's find_critical_samples (plus the weights
    w_t = eta_t k_t, oldest checkpoint first, so that a report can show them)."""
    n, per_sample = len(train_samples), []
    for i, s in enumerate(train_samples):
        entry = {**{k: s[k] for k in s if k not in ("completion_tokens", "completion_mask")},
                 "index": i, "tracin_score": scores[i].item(),
                 "checkpoint_contributions": [c[i].item() for c in contributions]}
        if cosine is not None:
            entry["cosine_score"] = cosine[i].item()
        if selfinf is not None:
            entry["self_influence"] = selfinf[i].item()
        per_sample.append(entry)
    order = sorted(range(n), key=lambda i: scores[i].item(), reverse=True)
    positive = [per_sample[i] for i in order[:top_k] if scores[i] > 0]
    negative = [per_sample[i] for i in reversed(order[-top_k:]) if scores[i] < 0]
    return {"mode": mode, "num_checkpoints": len(weights), "checkpoint_weights": weights, "num_train_samples": n,
            "critical_samples": sorted(per_sample, key=lambda e: -abs(e["tracin_score"]))[:top_k],
            "most_influential_positive": positive, "most_influential_negative": negative,
            "mean_influence_score": scores.mean().item(), "max_influence_score": scores.max().item(),
            "scores": per_sample}


def find_critical_samples(model, checkpoints, train_samples, test_samples, enc, mode="memory_efficient",
                          learning_rates=None, layer_filter=None, n_probe=None, top_k=5, temperature=1.0,
                          gradient_method="hooks", micro_batch=64, normalize=False, self_influence=False,
                          checkpoint_steps=None):
    """Score training rollouts by their influence on test samples across checkpoints.

    checkpoints: paths of GRPO checkpoints (each holds 'lora' and 'lr'), or, for mode='full',
        already loaded LoRA state dicts are accepted too.
    mode: 'simple'           one checkpoint (the last), no learning-rate weight: plain gradient alignment
          'full'             every checkpoint loaded into memory first, then sum_t w_t <g_test, g_train>
          'memory_efficient' one checkpoint at a time from disk, each loaded exactly once
    learning_rates: eta_t per checkpoint; default: the 'lr' stored in each checkpoint.
    checkpoint_steps: how many training steps checkpoint t stands for, k_t; its weight is w_t = eta_t k_t.
        None: w_t = eta_t (plain TracInCP, as Captum computes it). trapezoid_steps(iters) gives the
        trapezoid rule over the steps: the sum over every step s of eta_s <g_test, g_train>(theta_s) is
        approximated as if that term varied linearly between checkpoints (no step in between is visited).
    temperature: the run's sampling temperature (log pi = log softmax(logits / temperature)).
    n_probe: score only n_probe training rollouts, evenly spaced over the list (None: all).
    normalize: also cosine_score = sum_t w_t <g_i, G_t> / (||g_i|| ||G_t||), G_t = sum_j g_test_j.
    self_influence: also sum_t w_t ||g_i||^2.
    Scores are taken with dropout off (model.eval()); the model's train/eval flag, LoRA weights and
    every parameter's .grad are as they were on return. Returns the result dictionary (see README)."""
    check_attribution_inputs(model, checkpoints, train_samples, test_samples, mode, gradient_method,
                             learning_rates, checkpoint_steps, layer_filter)
    if mode == "simple":
        checkpoints, learning_rates, checkpoint_steps = checkpoints[-1:], [1.0], None
    if n_probe and n_probe < len(train_samples):  # evenly spaced over the run, not only its first steps
        train_samples = [train_samples[i * len(train_samples) // n_probe] for i in range(n_probe)]
    device = next(model.parameters()).device
    train_batch = rollout_batch(enc, train_samples, device)
    test_batch = rollout_batch(enc, test_samples, device)
    states = [load_checkpoint(c) if isinstance(c, str) else c for c in checkpoints] if mode == "full" else None
    n = len(train_samples)
    scores = torch.zeros(n, dtype=torch.float64)          # float64 accumulation across checkpoints
    cosine = torch.zeros(n, dtype=torch.float64)
    selfinf = torch.zeros(n, dtype=torch.float64)
    contributions, weights = [], []
    # put back in `finally`: the caller's train/eval flag, LoRA weights and .grad tensors
    was_training, own_lora = model.training, lora_state_dict(model)
    own_grads = [(p, p.grad) for p in model.parameters()]
    model.zero_grad(set_to_none=True)  # a backward must not add into the caller's .grad tensors
    model.eval()  # dropout off: deterministic scores; eval also turns gradient checkpointing off (hooks need that)
    try:
        for t, ckpt in enumerate(checkpoints):
            state = states[t] if states is not None else (load_checkpoint(ckpt) if isinstance(ckpt, str) else ckpt)
            load_lora_state_dict(model, state["lora"] if "lora" in state else state)
            w = learning_rates[t] if learning_rates is not None else float(state.get("lr", 1.0))
            w *= checkpoint_steps[t] if checkpoint_steps is not None else 1.0   # w_t = eta_t k_t
            inner, tr_sq, te_sq = checkpoint_products(model, train_batch, test_batch, temperature, layer_filter,
                                                   gradient_method, micro_batch, normalize or self_influence, t)
            contrib = w * inner                          # w_t <g_i, G_t>, G_t = sum_j g_test_j: (n,)
            weights.append(float(w))
            scores += contrib
            contributions.append(contrib)
            if normalize:
                cosine += contrib / (tr_sq * te_sq).sqrt().clamp(min=1e-12)
            if self_influence:
                selfinf += w * tr_sq
            del state  # this checkpoint's adapter (and optimizer state): one checkpoint in memory at a time
    finally:
        load_lora_state_dict(model, own_lora)
        for p, g in own_grads:
            p.grad = g
        model.train(was_training)
    return attribution_result(train_samples, scores, contributions, cosine if normalize else None,
                              selfinf if self_influence else None, mode, weights, top_k)


if __name__ == "__main__":  # the post-hoc command line, which lives with the other tools that read runs
    from analysis.attribute import main
    cli_main(main)
