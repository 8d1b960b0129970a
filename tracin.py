"""
TracIn (Pruthi et al. 2020) on the LoRA parameters, from the per-sample
gradients of ghost.py: online, inside a GRPO step (tracin_updates), and
post-hoc, over a finished run's checkpoints (tracin_cp, TracInCP).

Online: tracin_updates runs where standard GRPO runs grpo.grpo_updates;
both end in grpo.update. The influence of rollout i on a validation batch
    influence_i = <g_i, G>,
g_i the rollout's gradient of the GRPO loss, G the gradient of the (mean)
validation loss: a first-order estimate of how much one step on i lowers
it. The validation loss: 'pg', validation prompts sampled in the step's
own generate call and scored by the task's own rewards (the run's may be
hackable), their GRPO loss without KL; 'nll', their clean reference
solutions as rows with A = +1 (reference_solutions). Only rollouts with
positive influence (or the top fraction) are trained on, and their update
is summed from the same per-sample gradients (no extra forward or backward).
What a step reads: grpo.StepKnobs and TracInKnobs (the influence's form,
the selection rule), whose RULES, and capture_problem, state what the
selection relies on.

Which rollouts TracIn can never keep (select_rollouts):
  - advantage 0 with beta = 0 (every rollout of a group of equal rewards,
    a row no reward function could score, the one scored row of a group, a
    reward equal to its group's mean): its GRPO loss is the constant 0, so
    g_i is exactly 0 (the hooks see a zero output gradient) and
    influence_i = 0, which is not > 0. With beta > 0 its KL term gives it a
    gradient once the policy has left the reference: it can be kept.
  - a row whose mask counts no token (a completion that hit max_new_tokens
    under mask_truncated_completions): its loss, KL included, counts none
    of its tokens: g_i = 0.
  - any rollout of a step whose validation batch has no signal ('pg', every
    validation advantage 0): G = 0, every influence is 0, and neither rule
    keeps any (no update that step).
  - any rollout of a step with a NaN/Inf influence: the step is skipped and
    no weight moves (tracin_backward's skip reason).
  'topk' keeps the k = max(1, round(topk_frac * N)) highest by its ranking
  (the influence, or its cosine) whatever their sign, so a zero-gradient
  row can be kept only when fewer than k rows score above 0 and the
  influences are not all equal.
  A kept rollout counts with the whole batch's divisors: training on a
  subset scales nothing up.
These hold only if the hooks' g_i is the gradient of the policy that
sampled: one update per generation, each activation seen once (no
gradient checkpointing recomputing it), and no LoRA dropout (sampling
runs without it; with it g_i is of one random mask): capture_problem.

What it costs next to standard GRPO:
  - compute: a forward and backward over the validation rows ('pg' also
    samples and scores them, in the same generate call); each g_i formed
    from the hooks' buffers, O(T d r) a rollout and layer; <g_i, G>,
    O(d r). Saved: the capture forms no batch weight gradient (two matmuls
    a layer), and the update needs no fourth pass.
  - memory: the buffers x, h, gA, gB of every adapted layer for the whole
    batch, n T (d_in + 2 r + d_out) numbers a layer (with several
    micro-batches twice, briefly, while collected), until the per-sample
    gradients, n r (d_in + d_out) float32, are formed from them. Standard
    GRPO frees each micro-batch's activations after its backward.

Post-hoc (TracInCP): a finished run's rollouts scored by their influence
on a test answer,
    TracIn(z_test, z_i) = sum_s eta_s < grad L(z_test, theta_s), grad L(z_i, theta_s) >
summed over the training steps s. Only the saved checkpoints t are at
hand, so each stands in for the steps around it:
    TracInCP(z_test, z_i) = sum_t w_t < g_test(theta_t), g_i(theta_t) >,   w_t = eta_t k_t
  - eta_t: the learning rate of the step taken FROM theta_t, which the
    training loop stores as the checkpoint's 'lr' when it saves theta_t
    (runs/state.save_run; the last checkpoint's is that of a step never
    taken, and its k_t is half a gap).
  - k_t: how many training steps checkpoint t stands for (step_weights).
    Saved at iterations s_0 < s_1 < ... < s_{n-1}, by the trapezoid rule
    (trapezoid_steps)
        k_t = (s_{t+1} - s_{t-1}) / 2,   the ends half a gap
        (s_{-1} = s_0, s_n = s_{n-1}),
    so sum_t k_t = s_{n-1} - s_0 (one checkpoint: k = 1). Where an
    iteration is missing or they are not strictly increasing (an iter_num
    repeated), k_t = 1 each: Captum's TracInCP, weighted by the learning
    rate alone (the trapezoid would weigh a repeated one 0).
Sign: positive = a gradient step on z_i lowers the test loss (it helps).
Cosine (tracin_cp's second score): each term over ||g_i|| ||G_t||. A dot product grows
with ||g_i||, and a long or high-advantage rollout has a long gradient, so it leads a
dot-product ranking whatever its direction; the cosine ranks by direction alone, which is
what tells the rollouts that taught a wrong answer from the others rewarded beside them.
Train loss of a rollout: its GRPO loss at ratio 1 without KL,
-A_i mean_t log pi(y_t); test loss: the answer's negative log-likelihood,
-mean_t log pi(y_t) (a row with A = +1, nll_row). log pi uses
logits / temperature, the run's sampling temperature (0, greedy: plain
log-probs).
"""
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from ghost import (compute_ghost_inner_product_matrix, ghost_mode, install_ghost_hooks,
                   per_sample_grads, squared_norms, subset_gradients, summed_gradient,
                   summed_inner_products)
from data.prompts import encode_prompt, encode_text
from model import pad_prompts
from grpo import (Rollouts, broken_rules, completion_logprobs, one_of, policy_backward,
                  rank_part, update, with_reference)
from lora import load_lora_state_dict, lora_modules
from scale import distributed


@dataclass(frozen=True)
class TracInKnobs:
    """What TracIn adds to a step, built once by the training script."""
    influence: str = "summed"  # 'summed': <g_i, G>, G from one backward; 'matrix': [N, N_val]
    selection: str = "positive"  # select_rollouts: 'positive' or 'topk'
    topk_frac: float = 0.5     # 'topk': the share of the batch kept
    ranking: str = "cosine"    # 'topk' ranks by <g_i, G> / ||g_i||, or 'dot': by <g_i, G>

    RULES = {  # field: (holds for its value, what it must be)
        "influence": one_of("summed", "matrix"),
        "selection": one_of("positive", "topk"),
        "topk_frac": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
        "ranking": one_of("dot", "cosine"),
    }

    def __post_init__(self):
        assert not broken_rules(self), broken_rules(self)


def capture_problem(num_iterations, grad_checkpoint, lora_dropout):
    """Why the hooks' g_i would not be the gradient the update uses, as (the
    config key at fault or None, why); None when the capture is exact."""
    if num_iterations != 1:
        why = "the selection is made from the sampling policy's per-sample gradients"
        return "num_iterations", f"must be 1 with tracin=True: {why}, one update per generation"
    if grad_checkpoint or lora_dropout > 0:
        why = "the hooks must see each activation once, exactly as the gradient used it"
        return None, f"tracin=True needs grad_checkpoint=False and lora_dropout=0: {why}"
    return None


def reference_solutions(enc, examples, device):
    """The validation batch for 'nll': each prompt followed by its clean
    reference solution (nll_row, A = +1), laid out as model.generate lays
    out rollouts: its gradient is that of the solutions' negative
    log-likelihood, so no sampling is needed."""
    rows = [nll_row(enc, e["question"], encode_text(enc, e["solution"])) for e in examples]
    idx, pad_left, mask, adv = rollout_batch(enc, rows, device)
    return Rollouts(idx=idx, pad_left=pad_left, mask=mask, advantages=adv)


def nll_row(enc, question, completion, advantage=1.0):
    """A question and a given completion (token ids) as a rollout row,
    end-of-text appended, every token counted. With A = +1 its GRPO loss
    (ratio 1, no KL) is the completion's negative log-likelihood, divided
    as grpo_loss divides: 'grpo', its mean over the row's tokens / the
    batch's rows; 'dapo', its sum / the batch's tokens; 'bnpo', its sum /
    its micro-batch's tokens / the micro-batches; 'dr_grpo', its sum /
    (rows x max_new_tokens). With A = -1, minus that. TracIn's 'nll'
    validation rows and post-hoc attribution's test answers are such rows."""
    toks = completion + [enc.eot_token]
    return {"prompt": question, "completion_tokens": toks, "completion_mask": [1] * len(toks),
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
    mask = torch.cat([mask, mask.new_zeros(len(samples), missing)], 1)  # a shorter mask: 0s
    adv = torch.tensor([float(s["advantage"]) for s in samples])
    idx = torch.cat([idx, comp.to(device)], 1)
    return idx, pad_left, mask.to(device), adv.to(device)


# -----------------------------------------------------------------------------
# online: steps 4-7 of a TracIn-GRPO step

def tracin_updates(model, optimizer, rollouts, val_batch, step, knobs, *, timer, amp):
    """Steps 4-7 where standard GRPO runs grpo.grpo_updates:
    tracin_backward (every rollout's influence, the selection, the kept
    rollouts' summed gradient in .grad), then grpo.update, which takes no
    AdamW step when nothing was kept (its moments would still move the
    adapter on a zero gradient) or the influence is not finite.
    -> (stats, grad norm, skip reason or None, influence (N,), keep (N,) bool)."""
    backward = tracin_backward(model, optimizer, rollouts, val_batch, step, knobs,
                               timer=timer, amp=amp)
    stats, influence, keep, skip_reason = backward
    apply = skip_reason is None and bool(keep.any())
    grad_norm, nonfinite = update(model, optimizer, stats, grad_clip=step.grad_clip,
                                  timer=timer, apply=apply)
    return stats, grad_norm, skip_reason or nonfinite, influence, keep


def tracin_backward(model, optimizer, rollouts, val_batch, step, knobs, *, timer, amp):
    """TracIn-GRPO's passes 3 and 2 and backward: every rollout's LoRA
    gradient g_i from the hooks, influence_i = <g_i, G>, the selection, and
    the selected rollouts' summed gradient written into .grad from the
    hooks' buffers (no 4th pass).
    G: the gradient of the validation loss (val_batch: Rollouts), normalised
    as grpo_loss does (1/n_val for 'grpo'; g_i carries its 1/n too).
    'summed' influence: G from ordinary backwards (one per micro-batch,
    adding up in .grad), then <g_i, G>, O(T d r) per rollout; 'matrix': row
    sums of the [N, N_val] matrix of captured validation rows (equal up to
    rounding). Under torchrun each rank captures its rows; the selection
    sees every rank's influence.
    -> (stats, influence (N,), keep (N,) bool, skip reason or None): a
    non-finite influence skips the step (no weight moves)."""
    dropout = max(m.lora_dropout.p for m in lora_modules(model).values())
    assert capture_problem(step.num_iterations, model.config.grad_checkpoint, dropout) is None
    matrix = knobs.influence == "matrix"
    batch = rank_part(rollouts)  # this rank's rows (all in one process)
    batch = with_reference(model, batch, step, timer=timer, amp=amp)  # PASS 3, before capture
    # The capture (ghost.GhostHooks): lora_A's forward hook keeps each
    # sample's x and h = A x, tensor hooks the output gradients gA = dL/dh,
    # gB = dL/d(B h); the split 'train' forms no .grad (the summed gradient
    # nobody reads). ghost_mode: optimizer.step() raises, no update.
    with install_ghost_hooks(model) as hooks, ghost_mode(optimizer):
        # pass 2 and the backward: per-sample factors (the capture phases'
        # seconds include policy_backward's own "policy" seconds)
        with timer("grad_capture_train"):
            stats = policy_backward(model, batch, step, timer=timer, amp=amp)
        hooks.split = "val" if matrix else None  # 'summed': no hook keeps, G adds up in .grad
        with timer("grad_capture_val"):  # no KL term in the validation loss
            loss_type = step.loss.loss_type
            val_rows = val_batch if matrix else informative_rows(val_batch, loss_type)
            policy_backward(model, val_rows, step.without_kl(), timer=timer, amp=amp)
        train_grads = hooks.collect("train")
        # per validation row, or G {layer: (G_A, G_B)}
        val_grads = hooks.collect("val") if matrix else summed_gradient(model)
    with timer("influence"):
        # row sums of [N, N_val]: validation GRADIENTS are summed, not activations
        if matrix:
            influence = compute_ghost_inner_product_matrix(train_grads, val_grads).sum(1)
        train_grads = per_sample_grads(train_grads)  # each rollout's (r, d) per factor
        if not matrix:  # <g_i, G>: O(T d r) per rollout
            influence = summed_inner_products(train_grads, val_grads)
        influence = distributed.all_gather_cat(influence)  # every rank's, in batch order: (N,)
        norms = None  # ||g_i||: (N,), every rank's; read only by 'topk' ranked by cosine
        if knobs.selection == "topk" and knobs.ranking == "cosine":
            norms = distributed.all_gather_cat(squared_norms(train_grads).sqrt())
        keep = select_rollouts(influence, knobs, norms)
        mine = distributed.shard(len(keep))  # this rank's rows of the whole batch's selection
        subset_gradients(model, train_grads, keep[mine])  # the kept rollouts' summed gradient
        del train_grads, val_grads  # every layer's per-sample gradients; G or val's buffers
    skip_reason = None
    if not torch.isfinite(influence).all():  # one NaN/Inf is enough: no rollout is trusted
        skip_reason = "non-finite influence"
        print(f"warning: {skip_reason}; step skipped, weights untouched")
    elif not keep.any():
        print(f"tracin: {NOTHING_KEPT[knobs.selection]}; no update this step")
    return stats, influence, keep, skip_reason


# why select_rollouts kept nothing, by rule
NOTHING_KEPT = {"positive": "no rollout has positive influence",
                "topk": "every influence is the same, none ranks above another"}


def informative_rows(batch, loss_type):
    """Validation rows that can move G: without KL an advantage-0 row has
    zero gradient, skipped; the batch's counts stay the divisors ('bnpo'
    keeps all; one row stays: every .grad exists)."""
    keep = batch.advantages != 0
    if loss_type == "bnpo" or bool(keep.all()):
        return batch
    keep[0] |= not keep.any()
    return batch.part(keep)


def select_rollouts(influence, knobs, grad_norms=None):
    """Rollouts to train on (bool): 'positive', influence > 0 (to first
    order, training on it lowers the validation loss); 'topk', the top
    topk_frac, at least one, and none when every influence is the same
    (G = 0: nothing says one rollout helps more than another).
    'topk' ranks by the influence <g_i, G> ('dot') or by the cosine
    <g_i, G> / (||g_i|| ||G||) ('cosine', GradAlign's; ||G|| is the same for
    every row): a dot product grows with ||g_i||, so long or high-advantage
    rollouts lead it whatever their direction. Its sign, all that
    'positive' reads, is the cosine's. grad_norms: (N,) ||g_i||."""
    if knobs.selection == "positive":
        return influence > 0
    keep = torch.zeros_like(influence, dtype=torch.bool)
    if bool((influence == influence[0]).all()):  # no evidence: nothing kept
        return keep
    score = influence if knobs.ranking == "dot" else influence / grad_norms.clamp(min=1e-30)
    k = max(1, int(round(knobs.topk_frac * influence.numel())))
    keep[torch.topk(score, k).indices] = True
    return keep


# -----------------------------------------------------------------------------
# post-hoc: TracInCP over a finished run's checkpoints (the module docstring's sum)

def tracin_cp(model, states, train, test, temperature, layer_filter=None, steps=None):
    """TracInCP(z_test, z_i) = sum_t w_t <G_t, g_i(theta_t)>, w_t = eta_t k_t,
    G_t = sum_j g_test_j(theta_t), over the checkpoints `states`, oldest
    first (any iterable: read one at a time), each a dict of 'lora'
    (theta_t's adapter), 'lr' (eta_t) and 'iter_num' (its iteration, or
    None). train, test: micro-batches laid out by rollout_batch. steps: k_t
    given; default step_weights of the iterations. layer_filter: only LoRA
    layers whose name holds it.
    -> (w_t per checkpoint, then per checkpoint (n,) float64 terms:
    w_t <g_i, G_t>; the same over ||g_i|| ||G_t|| (cosine); w_t ||g_i||^2
    (self-influence)). A score is its terms' sum."""
    etas, iters, products = [], [], []
    for state in states:
        load_lora_state_dict(model, state["lora"])  # theta_t
        etas.append(float(state["lr"]))
        iters.append(state["iter_num"])
        # <g_i, G_t> (n,), ||g_i||^2 (n,), ||G_t||^2
        products.append(hook_products(model, train, test, temperature, layer_filter))
    # w_t = eta_t k_t, once every checkpoint's iteration is known
    weights = [eta * k for eta, k in zip(etas, steps or step_weights(iters))]
    contrib = [w * inner for w, (inner, _, _) in zip(weights, products)]  # w_t <g_i, G_t>
    norms = [(tr_sq * te_sq).sqrt().clamp(min=1e-12) for _, tr_sq, te_sq in products]
    cosine = [c / norm for c, norm in zip(contrib, norms)]
    selfinf = [w * tr_sq for w, (_, tr_sq, _) in zip(weights, products)]  # w_t ||g_i||^2
    return weights, contrib, cosine, selfinf


def step_weights(iters):
    """k_t: trapezoid_steps over the checkpoints' iterations when every one
    holds a strictly increasing 'iter_num' (a GRPO run's do), else 1 each
    (a repeated one would give 0)."""
    known = all(type(s) is int for s in iters)
    if known and all(a < b for a, b in zip(iters, iters[1:])):
        return trapezoid_steps(iters)
    return [1.0] * len(iters)


def trapezoid_steps(iters):
    """Training steps each checkpoint stands for, from the iterations
    s_0 < ... < s_{n-1} it was saved at: (s_{i+1} - s_{i-1}) / 2 with
    s_{-1} = s_0 and s_n = s_{n-1} (trapezoid rule), so the weights add up
    to s_{n-1} - s_0 steps. A single checkpoint stands for itself: 1."""
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
        sample_losses(model, *c, temperature).backward()  # micro-batches add up in .grad
    G = summed_gradient(model, layer_filter)  # {layer: (G_A, G_B)}; .grad cleared for capture
    te_sq = sum(GA.pow(2).sum() + GB.pow(2).sum() for GA, GB in G.values())  # ||G||^2
    inner, tr_sq = [], []
    with install_ghost_hooks(model) as hooks:
        for c in train_chunks:  # chunk by chunk: buffers stay small
            sample_losses(model, *c, temperature).backward()
            train_grads = per_sample_grads(hooks.collect("train"), G.keys())  # G's layers only
            hooks.clear("train")  # the buffers: the per-sample gradients hold what is needed
            inner.append(summed_inner_products(train_grads, G))  # <g_i, G>: (chunk,)
            tr_sq.append(squared_norms(train_grads))  # ||g_i||^2: (chunk,)
            del train_grads  # this chunk's per-sample gradients
    inner = torch.cat(inner).double().cpu()  # float64 sums
    tr_sq = torch.cat(tr_sq).double().cpu()
    return inner, tr_sq, te_sq.double().cpu()


def sample_losses(model, idx, pad_left, mask, advantages, temperature=1.0):
    """sum_i -A_i * mean_t log pi(y_t) over completion tokens: the GRPO loss
    at ratio 1, no KL ('grpo'), written out; its backward gives every
    sample its own gradient in the hooks."""
    T = mask.size(1)
    logp, _ = completion_logprobs(model, idx, pad_left, T, temperature)  # (n, T)
    mask = mask.to(logp.dtype)
    return -(advantages * (logp * mask).sum(1) / mask.sum(1).clamp(min=1)).sum()


# run as a script: the post-hoc command line is analysis/attribute.py's
if __name__ == "__main__":
    raise SystemExit("post-hoc TracIn's command line: python -m analysis.attribute --out_dir=RUN "
                     "--question=...")
