"""
The parts of one GRPO step, in the order train_grpo.grpo_step runs them
(TracIn, tracin.py, reuses them):
  make_rollouts  PASS 1 sampling (no grad, no logits kept), rewards,
                 group-relative advantages
  grpo_updates   PASS 3 reference (once), then num_iterations times:
                 PASS 2 policy per micro-batch, the GRPO loss, backward
                 (policy_backward) and update; with num_iterations > 1
                 the sampling policy's log-probs are taken once first
  update         the ranks' sums, clip, AdamW on the LoRA parameters;
                 skipped on any NaN/Inf
and the math under them: compute_group_advantages, completion_logprobs,
selective_log_softmax (no (N, T, V) log-prob tensor), grpo_loss.
A step's rollouts are one record, Rollouts (every field and its shape),
made whole and copied (dataclasses.replace) when a pass adds to it.
What the functions read is in their signatures: StepKnobs (the step's
sizes, sampling, advantages, the clip and LossKnobs, the loss's), each
record stating the rules its math relies on (RULES, asserted when one is
made); `amp`, the precision every pass computes in (an autocast context,
bf16 or disabled, or nullcontext(): nanoGPT's ctx); `timer`, the step's
phase clock (`with timer("policy"):` adds the block's seconds); `decode`,
the compiled decode step or None.
Under torchrun each rank samples and back-propagates its share, in sight:
`distributed.split` and `gather_sampled` in sample_rollouts, `rank_part`
in grpo_updates, `sum_grads` / `sum_stats` in update
(scale/distributed.py; each a no-op in one process).

Where the large tensors die, in step order (each place says what it frees):
  - model.generate: each step's (N, V) logits, deleted before the next
    forward; lora.folded_for_sampling: the folded W' copies, after pass 1;
  - completion_logprobs: the (N, T, V) logits, freed at once without grad
    (passes 3 and "old"), kept by SelectiveLogSoftmax for pass 2's backward;
  - policy_backward: each micro-batch's graph, by its loss.backward();
  - update: the LoRA .grad, by zero_grad(set_to_none=True);
  - TracIn (tracin.tracin_backward): the hooks' own buffers when the hooks
    are removed; the collected copies when per_sample_grads' result takes
    their name; the per-sample gradients and G after the selection.
"""
import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
from torch.autograd.function import once_differentiable

from data.prompts import decode_completions, stop_tokens
from lora import disable_lora, folded_for_sampling, lora_parameters
from model import NonFiniteLogits, Sampling, generate, pad_id
from rewards import compute_rewards, parse_counts
from scale import distributed


@dataclass
class Prompts:
    """Prompts to sample group_size completions each for, and how those are
    scored: the training batch with the run's rewards, TracIn's 'pg'
    validation batch with the task's own."""
    ids: list             # token-id lists, one per prompt
    answers: list         # one per prompt, as the reward functions read it
    reward_funcs: tuple   # names in rewards.REWARD_FUNCS
    reward_weights: tuple
    cache: dict = None    # the run's memo of scores (rewards.compute_rewards); None: none
    # the stream its sampling uniforms come from; None: the step's generator. TracIn's 'pg'
    # validation batch has its own, so the training rows' uniforms (and tokens) are those a
    # standard GRPO run with the same seed draws
    generator: torch.Generator = None


def broken_rules(record):
    """[(field, what it must be)] for each rule of record.RULES its value
    breaks. A record states its rules once: asserted when one is made
    (__post_init__), and said to the user by checks/grpo_knobs.py, by the
    config key that sets the field."""
    return [(name, why) for name, (holds, why) in record.RULES.items()
            if not holds(getattr(record, name))]


def one_of(*choices):
    """A rule's (holds, what it must be) for a field with a few allowed values."""
    return (lambda v: v in choices), "must be one of " + ", ".join(map(repr, choices))


@dataclass(frozen=True)
class StepKnobs:
    """What one GRPO step reads, built once by the training script."""
    group_size: int          # G completions per prompt
    micro_batch_size: int    # rows per forward and backward; gradients add up
    max_new_tokens: int      # pass 1's longest completion
    sampling: Sampling       # pass 1's temperature, top_k, top_p; log-probs
                             # use the same temperature
    loss: "LossKnobs"        # grpo_loss's: beta, the clip, the divisor
    num_iterations: int = 1  # mu: updates per generation
    scale_rewards: str = "group"     # compute_group_advantages' divisor
    advantage_epsilon: float = 0.0   # A = (r - mean) / (std + epsilon)
    mask_truncated_completions: bool = False  # a row with no stop: no token
    grad_clip: float = 1.0           # update: the gradient norm's bound
    # make_rollouts: score on a thread while pass 3 runs (beta != 0, mu = 1)
    rewards_during_reference: bool = False

    RULES = {  # field: (holds for its value, what it must be)
        "group_size": (lambda v: v >= 2,
                       "must be >= 2: advantages are relative within a group"),
        "micro_batch_size": (lambda v: v > 0, "must be > 0"),
        "max_new_tokens": (lambda v: v > 0, "must be > 0"),
        "num_iterations": (lambda v: v >= 1, "must be >= 1"),
        "scale_rewards": one_of("group", "batch", "none"),
        "advantage_epsilon": (lambda v: v >= 0, "must be >= 0"),
        "grad_clip": (lambda v: v > 0, "must be > 0"),
    }

    def __post_init__(self):
        assert not broken_rules(self), broken_rules(self)
        # pass 3's log-probs, taken beside the scoring, serve one update
        once = self.loss.beta != 0 and self.num_iterations == 1
        assert once or not self.rewards_during_reference

    def without_kl(self):
        """The same step with beta = 0: TracIn's validation loss."""
        return replace(self, loss=replace(self.loss, beta=0.0))


@dataclass
class Rollouts:
    """A step's rollouts (GRPO-Zero's Episode, batched):
    n = prompts x group_size rows, a prompt's rows adjacent.
    score_rollouts makes one with its first ten fields; a pass that adds
    a field makes a copy (dataclasses.replace)."""
    idx: torch.Tensor               # (n, P+T) long: prompt left-padded to P, then T ids
    pad_left: torch.Tensor          # (n,) long: padding columns before each prompt
    mask: torch.Tensor              # (n, T) long: 1 on the tokens the loss counts
    advantages: torch.Tensor        # (n,) float32: A_i, 0 in a group of equal rewards
    rewards: torch.Tensor = None    # (n,) float32: NaN where no function scored
    per_fn: dict = None             # reward function -> n scores (NaN: not scored)
    errors: dict = None             # reward function -> completions it raised on
    parse_counts: dict = None       # e.g. 'countdown/parsed': n (rewards.parse_counts)
    n_zero_std: int = 0             # groups of equal rewards (no learning signal)
    truncated: torch.Tensor = None  # (n,) bool: no stop token (hit max_new_tokens)
    ref_logp: torch.Tensor = None   # (n, T) PASS 3's log-probs (with_reference)
    old_logp: torch.Tensor = None   # (n, T) the sampling policy's (mu > 1)
    influence: torch.Tensor = None  # (n,) TracIn: <g_i, G> (tracin_backward)
    selected: torch.Tensor = None   # (n,) bool TracIn: the rows trained on
    whole_mask: torch.Tensor = None  # a part's: the whole batch's (n_whole, T) mask (divisors)
    ranks: int = 1                   # rank_part's: the ranks sharing the whole batch's rows

    def __len__(self):
        return self.idx.size(0)

    def part(self, rows):
        """Rows `rows` (a slice or a bool mask) of every per-row field; the
        loss still divides by the WHOLE batch's numbers (divisors), so that
        the parts' gradients add up to the batch's. errors and n_zero_std
        stay the whole batch's."""
        cpu_rows = rows.cpu() if torch.is_tensor(rows) else rows

        def take(v):
            # a bool mask goes to each tensor's device (advantages: the CPU)
            if torch.is_tensor(v):
                return v[rows.to(v.device) if torch.is_tensor(rows) else rows]
            if isinstance(v, dict):  # per_fn: a list per reward function
                return {k: take(x) for k, x in v.items()}
            if isinstance(v, list):  # the same rows, by their positions
                picked = torch.arange(len(v))[cpu_rows].tolist()
                return [v[i] for i in picked]
            return v
        whole = self.mask if self.whole_mask is None else self.whole_mask
        per_row = ("idx", "pad_left", "mask", "advantages", "rewards",
                   "per_fn", "truncated", "ref_logp", "old_logp",
                   "influence", "selected")
        fields = {k: take(getattr(self, k)) for k in per_row
                  if getattr(self, k) is not None}
        return replace(self, **fields, whole_mask=whole)

    def divisors(self, micro_batch_size):
        """What grpo_loss divides by, decided here alone: the numbers of the
        WHOLE batch (this one, or the one it is a part of: rank_part's rows,
        TracIn's informative validation rows), so that its parts' gradients
        add up to the batch's: its sequences, its completion tokens, and
        (bnpo) every rank's micro-batches of micro_batch_size rows."""
        mask = self.mask if self.whole_mask is None else self.whole_mask
        n = mask.size(0)
        rank_micro_batches = -(-(n // self.ranks) // micro_batch_size)  # rounded up
        return Divisors(num_seqs=n, num_tokens=mask.sum().clamp(min=1).item(),
                        num_micro_batches=self.ranks * rank_micro_batches)


@dataclass(frozen=True)
class Divisors:
    """grpo_loss's divisors (Rollouts.divisors decides them)."""
    num_seqs: int               # grpo: / sequences; dr_grpo: / (sequences x max_len)
    num_tokens: float           # dapo: / completion tokens (>= 1)
    num_micro_batches: int = 1  # bnpo: the mean over micro-batches


def rank_part(rollouts):
    """This rank's rows for passes 3 and 2 (all in one process), in equal
    shares (distributed.splits_evenly), the loss divided by the whole
    batch's numbers (Rollouts.divisors): the ranks' gradients add up to the
    one-process gradient."""
    rows = distributed.shard(len(rollouts))
    return replace(rollouts.part(rows), ranks=distributed.world_size())


@dataclass
class StepResult:
    """What one step returns beside its rollouts (its log line's numbers)."""
    stats: dict = None        # policy_backward's sums (every rank's, every update)
    grad_norm: float = 0.0    # before the clip; 0 when TracIn kept no rollout
    skip_reason: str = None   # why the (last) update was not applied; None: it was
    extra: dict = field(default_factory=dict)  # more log keys (TracIn's val reward)
    times: dict = field(default_factory=dict)  # the timer's seconds per phase


# -----------------------------------------------------------------------------
# 1-3: prompts, PASS 1 sampling, rewards, advantages

def make_rollouts(model, enc, batches, step, generator, *, timer, amp, decode=None):
    """PASS 1 (sampling, no grad, no logits kept), rewards and
    group-relative advantages: one Rollouts per Prompts of `batches`,
    all sampled in ONE generate call.
    step.rewards_during_reference: a worker thread scores while this one
    runs pass 3 over the first batch (torch releases the GIL in its
    kernels), whose (N, T) log-probs the loss reuses (beta != 0, mu = 1)."""
    sampled = sample_rollouts(model, enc, batches, step, generator, timer=timer, amp=amp,
                              decode=decode)
    if not step.rewards_during_reference:
        return score_rollouts(enc, sampled, batches, step, timer=timer)
    with ThreadPoolExecutor(max_workers=1) as pool:
        scoring = pool.submit(score_rollouts, enc, sampled, batches, step, timer=timer)
        idx, pad_left, mask = sampled
        first_rows = slice(0, len(batches[0].ids) * step.group_size)
        unscored = Rollouts(idx=idx[first_rows], pad_left=pad_left[first_rows],
                            mask=mask[first_rows], advantages=None)
        ref = reference_logprobs(model, unscored, step, timer=timer, amp=amp)
        first, *others = scoring.result()
    return [replace(first, ref_logp=ref), *others]


def lora_for_sampling(model, decode):
    """LoRA folded in for sampling: each adapted layer holds W + s B A
    (lora.folded_for_sampling), except under CUDA graphs (decode.graphs):
    a folded copy, new every step, would be copied into the graph's own
    buffers at every token; the graph reads W, A and B where they lie."""
    return nullcontext() if decode and decode.graphs else folded_for_sampling(model)


def sample_rollouts(model, enc, batches, step, generator, *, timer, amp, decode=None):
    """PASS 1: (idx, pad_left, mask) of group_size completions for every
    prompt of every batch. Under torchrun this rank samples its share of
    the prompts and every rank gets all the rows.
    decode: the compiled decode step (scale/compiled.py), None: eager."""
    prompts = [p for batch in batches for p in batch.ids]
    S, G = step.max_new_tokens, step.group_size
    device = next(model.parameters()).device
    mine = distributed.split(len(prompts))  # this rank's prompts, whole groups
    u = None
    # one uniform per row and token, for ALL rows as in one process, so no row's tokens depend
    # on the process count: (S, n * G), each batch's columns from its own stream, then this
    # rank's columns
    if step.sampling.temperature > 0:
        def columns(b):  # (S, len(b.ids) * G) from the batch's stream
            return torch.rand(S, len(b.ids) * G, generator=b.generator or generator, device=device)
        u = torch.cat([columns(b) for b in batches], 1)[:, mine.start * G:mine.stop * G]
    stops = stop_tokens(enc)
    sampling = replace(step.sampling, vocab_size=enc.n_vocab)  # no id past the tokenizer's
    failed = None
    with timer("generation"), amp, lora_for_sampling(model, decode):
        try:
            sampled = generate(model, prompts[mine], S, stops, num_samples=G,
                               sampling=sampling, u=u, decode=decode)
        except NonFiniteLogits as e:  # NaN/Inf logits in this rank's rows
            failed = e
    # under torchrun every rank learns that one failed (else they would wait for it in the gather)
    if distributed.sum_floats([failed is not None])[0]:
        raise failed or NonFiniteLogits("NaN/Inf logits in another process's share of the rows")
    # every rank's rows, padded as generate pads
    pad = pad_id(stops)
    return distributed.gather_sampled(*sampled, pad, len(prompts), G)


def score_rollouts(enc, sampled, batches, step, *, timer):
    """Rewards (each batch's own functions and cache, see
    rewards.compute_rewards) and advantages: one Rollouts per batch."""
    (idx, pad_left, mask), group = sampled, step.group_size
    # generation stops once every row has ended: T <= max_new_tokens
    T = mask.size(1)
    stops = torch.tensor(stop_tokens(enc), device=idx.device)
    out, start = [], 0
    with timer("reward"):
        for batch in batches:
            rows = slice(start, start + len(batch.ids) * group)
            start = rows.stop
            texts = decode_completions(enc, idx[rows], mask[rows])
            row_answers = [a for a in batch.answers for _ in range(group)]
            rewards, per_fn, errors = compute_rewards(
                texts, row_answers, batch.reward_funcs, batch.reward_weights,
                batch.cache)
            # NaN where no reward function could score
            rewards = torch.tensor(rewards)
            advantages, n_zero_std = compute_group_advantages(
                rewards, group, step.scale_rewards, step.advantage_epsilon)
            # no stop id: the completion hit max_new_tokens
            truncated = ~torch.isin(idx[rows, -T:], stops).any(1)
            m = mask[rows]
            # a truncated row counts no token
            if step.mask_truncated_completions:
                m = m * (~truncated).long()[:, None]
            counts = parse_counts(texts, batch.reward_funcs)
            out.append(Rollouts(idx=idx[rows], pad_left=pad_left[rows], mask=m,
                                advantages=advantages, rewards=rewards, per_fn=per_fn,
                                errors=errors, parse_counts=counts, n_zero_std=n_zero_std,
                                truncated=truncated))
    return out


def compute_group_advantages(rewards, group_size, scale_rewards="group",
                             epsilon=0.0):
    """rewards (N,), a group's rows adjacent
    -> (advantages (N,), number of zero-std groups).
    A_i = r_i - mean(group),
          / (the group's std + epsilon) ('group'),
          / (the batch's std + epsilon) ('batch'), or as is ('none').
    A group of equal rewards has no signal: A exactly 0, never 0/0 = NaN.
    A NaN reward (no function could score it) is left out of the group's
    mean and std; A 0. group_size >= 2 and scale_rewards: StepKnobs.RULES."""
    r = rewards.float().view(-1, group_size)  # (B, group_size)
    scored = ~torch.isnan(r)
    if scored.all():
        centered = r - r.mean(dim=1, keepdim=True)
        group_std = r.std(dim=1, keepdim=True)  # (B, 1)
        batch_std = r.std()                     # ()
        too_few = torch.zeros_like(group_std, dtype=torch.bool)
    else:  # nan-mean and nan-std over the scored completions of each group
        n = scored.sum(1, keepdim=True)
        mean = torch.nansum(r, 1, keepdim=True) / n.clamp(min=1)
        centered = torch.where(scored, r - mean, 0.0)
        square_sum = (centered ** 2).sum(1, keepdim=True)
        group_std = (square_sum / (n - 1).clamp(min=1)).sqrt()
        if scored.sum() > 1:
            batch_std = r[scored].std()
        else:
            batch_std = torch.tensor(0.0)
        too_few = n < 2
    zero_std = (group_std < 1e-6) | too_few  # all (scored) rewards equal
    if scale_rewards == "group":
        std = torch.where(zero_std, torch.ones_like(group_std), group_std)
        adv = centered / (std + epsilon)
    elif scale_rewards == "batch":
        adv = centered / (max(batch_std.item(), 1e-6) + epsilon)
    else:  # 'none'
        adv = centered
    adv = adv.masked_fill(zero_std, 0.0)
    return adv.view(-1), int(zero_std.sum())


# -----------------------------------------------------------------------------
# 4-7: PASS 3 reference, PASS 2 policy, the loss and its backward, the update

def grpo_updates(model, optimizer, rollouts, step, *, timer, amp):
    """Steps 4-7 num_iterations (mu) times on one generation (DeepSeekMath,
    TRL): with mu > 1 the old (sampling) and reference log-probs are taken
    once, before the first update, so later updates see ratios != 1 and the
    clip acts. A skipped update (NaN/Inf) ends the generation.
    Returns (stats summed over the updates run, the last gradient norm,
    the skip reason or None); stats["updates"]: how many ran."""
    # this rank's rows (all in one process), with PASS 3's log-probs
    batch = with_reference(model, rank_part(rollouts), step, timer=timer, amp=amp)
    if step.num_iterations > 1:  # the sampling policy's log-probs, once
        batch = replace(batch, old_logp=old_logprobs(model, batch, step, timer=timer, amp=amp))
    total, n = None, 0
    for n in range(1, step.num_iterations + 1):
        stats = policy_backward(model, batch, step, timer=timer, amp=amp)
        grad_norm, skip_reason = update(model, optimizer, stats, grad_clip=step.grad_clip,
                                        timer=timer)
        if total is None:
            total = stats
        else:  # lists: cat
            total = {k: total[k] + stats[k] for k in total}
        if skip_reason:
            break
    return {**total, "updates": n}, grad_norm, skip_reason


def with_reference(model, batch, step, *, timer, amp):
    """PASS 3, asked for here alone (grpo_updates, tracin.tracin_backward):
    the reference's log-probs into batch.ref_logp (a copy of the batch),
    over the whole batch before any policy micro-batch builds its graph, so
    its activations are gone by then. Nothing to do when beta == 0, or when
    make_rollouts took them while the rewards were scored."""
    if step.loss.beta == 0 or batch.ref_logp is not None:
        return batch
    ref = reference_logprobs(model, batch, step, timer=timer, amp=amp)  # (N, T)
    return replace(batch, ref_logp=ref)


# what policy_backward sums over its micro-batches, by name (grpo_loss's statistics, the entropy)
SUMMED = ("kl_sum", "clipped_tokens", "clipped_low", "clipped_high", "ent_sum")


def policy_backward(model, batch, step, *, timer, amp):
    """PASS 2 and the backward of the GRPO loss (step.loss) per micro-batch
    of a Rollouts (ref_logp: PASS 3's, taken by with_reference when
    beta != 0; old_logp if taken), divided by the whole batch's numbers
    (Rollouts.divisors). Gradients add up in .grad; under TracIn's capture
    (ghost.GhostHooks) the hooks keep each sample's factors instead."""
    knobs = step.loss
    assert knobs.beta == 0 or batch.ref_logp is not None, "with_reference first"
    idx, pad_left, T = batch.idx, batch.pad_left, batch.mask.size(1)
    N, mb, device = idx.size(0), step.micro_batch_size, idx.device
    divisors = batch.divisors(mb)
    adv, mask = batch.advantages.to(device), batch.mask.to(device)
    num_tokens = mask.sum().item()
    # sums over this batch's tokens, on the device: read once after the
    # loop (a read waits for the device: between micro-batches it would
    # stall the kernel queue); update sums them over the ranks,
    # the log line divides them
    losses, sums = [], torch.zeros(len(SUMMED), dtype=torch.float64, device=device)
    # train(): gradient checkpointing and LoRA dropout where configured
    # (the base's own dropout is 0)
    model.train()
    for s in range(0, N, mb):
        sl = slice(s, s + mb)
        ref_logp = None if knobs.beta == 0 else batch.ref_logp[sl]
        with timer("policy"), amp:  # PASS 2, policy, with grad
            logp, entropy = completion_logprobs(
                model, idx[sl], pad_left[sl], T, step.sampling.temperature,
                with_entropy=True)
            # mu = 1: old = logp.detach(), the ratio is exactly 1, inside
            # [1 - eps_low, 1 + eps_high] (eps >= 0: LossKnobs.RULES), so the
            # clip never acts (TRL and nanochat note it);
            # mu > 1: old taken before the first update: it acts
            if batch.old_logp is None:
                old_logp = logp.detach()
            else:
                old_logp = batch.old_logp[sl]
            loss, loss_stats = grpo_loss(logp, old_logp, ref_logp, adv[sl], mask[sl],
                                         knobs=knobs, divisors=divisors)
            loss.backward()
            losses.append(loss.detach())
            loss_stats["ent_sum"] = (entropy * mask[sl]).sum()
            sums += torch.stack([loss_stats[k] for k in SUMMED]).double()
            # the backward has already freed this micro-batch's graph (the
            # logits SelectiveLogSoftmax saved, the activations); these are
            # (n, T) tensors and their graph's last nodes
            del logp, ref_logp, entropy, loss
    stats = {"losses": [float(x) for x in losses]}  # read here, after the loop
    stats.update(zip(SUMMED, sums.tolist()))
    stats["num_tokens"] = num_tokens
    return stats


def reference_logprobs(model, batch, step, *, timer, amp):
    """PASS 3: the reference's (N, T) completion log-probs, the same modules
    with LoRA off (lora.disable_lora: no second copy of the weights)."""
    with timer("reference"), disable_lora(model):
        return logprobs_no_grad(model, batch, step, amp=amp)


def old_logprobs(model, batch, step, *, timer, amp):
    """The sampling ('old') policy's (N, T) completion log-probs, taken once
    before the first of num_iterations > 1 updates."""
    with timer("old_logp"):
        return logprobs_no_grad(model, batch, step, amp=amp)


def logprobs_no_grad(model, batch, step, *, amp):
    """(N, T) completion log-probs of the model as it is, without graph,
    per micro-batch."""
    T, mb = batch.mask.size(1), step.micro_batch_size
    rows = [slice(s, s + mb) for s in range(0, len(batch), mb)]
    temperature = step.sampling.temperature
    # no graph: no activations kept
    with torch.no_grad(), amp:
        logps = []
        for r in rows:
            idx, pad_left = batch.idx[r], batch.pad_left[r]
            logp, _ = completion_logprobs(model, idx, pad_left, T, temperature)
            logps.append(logp)
        return torch.cat(logps)


def completion_logprobs(model, idx, pad_left, T, temperature,
                        with_entropy=False):
    """Per-token log-probs (N, T) of the last T tokens of idx (the
    completion) under logits / the sampling temperature (the policy that
    sampled), entropy if asked; the LM head runs on T rows."""
    logits, _ = model(idx[:, :-1], pad_left=pad_left, keep_last=T)  # (N, T, V)
    # greedy sampling: plain log-probs
    temperature = temperature if temperature > 0 else 1.0
    # (N, T); no (N, T, V) copy
    logp = selective_log_softmax(logits, idx[:, -T:], temperature)
    entropy = None
    if with_entropy:
        # a diagnostic: no graph kept for it; one (T, V) row at a time
        with torch.no_grad():
            def row_entropy(row):  # (T,)
                r = row.float() / temperature
                return -(r.softmax(-1) * r.log_softmax(-1)).sum(-1)
            entropy = torch.stack([row_entropy(row) for row in logits])
    # (N, T, V), the pass's largest activation: freed here without grad
    # (pass 3, the "old" log-probs); on pass 2 SelectiveLogSoftmax saved it,
    # so autograd holds it until loss.backward() has run
    del logits
    return logp, entropy


def selective_log_softmax(logits, tokens, temperature=1.0):
    """(N, T) log-probs of `tokens` under softmax(logits / temperature);
    see SelectiveLogSoftmax."""
    return SelectiveLogSoftmax.apply(logits, tokens, temperature)[0]


class SelectiveLogSoftmax(torch.autograd.Function):
    """log p(token) = logit[token] / temp - logsumexp(logits / temp),
    in float32, from logits (N, T, V).

    Saves for backward only the logits themselves (in their own dtype,
    bf16 under autocast), the (N, T) token ids and the (N, T) logsumexp:
    never a (N, T, V)
    log-prob tensor nor a float32 copy of the logits (autograd's own
    logsumexp would keep one per row, N*T*V*4 bytes).
    Backward recomputes one row at a time:
        d logp_t / d logits_t
            = (onehot(token_t) - softmax(logits_t / temp)) / temp"""

    # torch.func (vmap / jacrev: the tests' references) may batch it
    generate_vmap_rule = True

    @staticmethod
    def forward(logits, tokens, temperature):
        inv = 1.0 / temperature
        # bf16 -> float32
        acc = torch.promote_types(logits.dtype, torch.float32)
        lse = torch.stack([torch.logsumexp(row.to(acc) * inv, dim=-1)
                           for row in logits])  # (N, T)
        picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        picked = picked.to(acc) * inv  # (N, T)
        return picked - lse, lse

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, tokens, temperature = inputs
        ctx.save_for_backward(logits, tokens, output[1])
        ctx.inv = 1.0 / temperature
        ctx.mark_non_differentiable(output[1])

    # the backward below is not itself differentiable:
    # double backward raises
    @staticmethod
    @once_differentiable
    def backward(ctx, g, _):  # g (N, T)
        logits, tokens, lse = ctx.saved_tensors
        rows = []
        # one (T, V) float32 softmax exists at a time
        for i in range(logits.size(0)):
            # softmax (T, V)
            p = torch.exp(logits[i].to(lse.dtype) * ctx.inv - lse[i, :, None])
            # (onehot - p) g
            gt = g[i, :, None]
            gi = (-p * gt).scatter_add(-1, tokens[i, :, None], gt)
            rows.append((gi * ctx.inv).to(logits.dtype))
        # out-of-place (vmap-safe); stacking briefly doubles the (N, T, V)
        # gradient, in the logits' dtype
        return torch.stack(rows), None, None


LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo")  # TRL's names


@dataclass(frozen=True)
class LossKnobs:
    """grpo_loss's knobs (StepKnobs.loss); TracIn's validation loss is the
    same with beta = 0 (StepKnobs.without_kl)."""
    beta: float = 0.04                       # KL weight; 0: no pass 3
    epsilon_low: float = 0.2                 # the clip: rho >= 1 - epsilon_low
    epsilon_high: float = 0.2                # and rho <= 1 + epsilon_high
    loss_type: str = "grpo"                  # LOSS_TYPES: how the sum is divided
    importance_sampling_level: str = "token"  # 'sequence': GSPO's one ratio
    use_bias_correction_kl: bool = False     # KL_t x rho_t
    max_len: int = None                      # dr_grpo: max_new_tokens (None: T)

    RULES = {  # field: (holds for its value, what it must be)
        "beta": (lambda v: v >= 0, "must be >= 0"),
        # eps >= 0: ratio 1 lies inside the clip, so at mu = 1 it never acts
        "epsilon_low": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
        "epsilon_high": (lambda v: v >= 0, "must be >= 0"),
        "loss_type": one_of(*LOSS_TYPES),
        "importance_sampling_level": one_of("token", "sequence"),
    }

    def __post_init__(self):
        assert not broken_rules(self), broken_rules(self)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, knobs, divisors):
    """GRPO objective on one micro-batch, normalised so that the
    micro-batches' gradients add up to the whole batch's (bnpo: to their
    mean, as TRL's gradient accumulation). Per token:
        L_t = -min(rho_t A, clip(rho_t, 1-eps_low, 1+eps_high) A)
              + beta * KL_t
        rho_t = exp(logp_t - old_logp_t)         (level 'token')
        rho_t = exp(mean_s (logp_s - old_logp_s)), all t
                                                 ('sequence', GSPO)
        KL_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1
               (k3; x rho_t if use_bias_correction_kl)
    summed over the completion tokens (mask) and divided as loss_type says
    (the branches below) by the whole batch's `divisors`
    (Rollouts.divisors). Shapes: logp, old_logp, ref_logp, mask (n, T);
    advantages (n,). ref_logp None when beta == 0."""
    beta, loss_type = knobs.beta, knobs.loss_type
    epsilon_low, epsilon_high = knobs.epsilon_low, knobs.epsilon_high
    mask = mask.to(logp.dtype)
    log_ratio = logp - old_logp  # (n, T)
    if knobs.importance_sampling_level == "sequence":  # one ratio per completion
        seq_mean = (log_ratio * mask).sum(1) / mask.sum(1).clamp(min=1)
        log_ratio = seq_mean[:, None]  # (n, 1)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    A = advantages[:, None]
    per_token = -torch.min(ratio * A, clipped * A)
    kl = None
    if beta != 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1  # k3 estimator, >= 0
        # estimated under the old policy: reweight it to the new one
        if knobs.use_bias_correction_kl:
            kl = kl * ratio
        per_token = per_token + beta * kl
    # grpo: mean over each completion's tokens, then / num_seqs
    # (DeepSeekMath)
    if loss_type == "grpo":
        per_seq = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)
        loss = per_seq.sum() / divisors.num_seqs
    # bnpo: / this micro-batch's tokens / num_micro_batches
    elif loss_type == "bnpo":
        tokens = mask.sum().clamp(min=1)
        loss = (per_token * mask).sum() / tokens / divisors.num_micro_batches
    # dapo: / the whole batch's tokens (token-level, TRL's default)
    elif loss_type == "dapo":
        loss = (per_token * mask).sum() / divisors.num_tokens
    # dr_grpo: / (num_seqs * max_len) (Dr. GRPO, arXiv 2503.20783)
    elif loss_type == "dr_grpo":
        max_len = knobs.max_len or logp.size(1)
        loss = (per_token * mask).sum() / (divisors.num_seqs * max_len)
    else:  # LossKnobs.RULES allow no other
        raise ValueError(f"loss_type {loss_type!r}")
    # statistics for the log line only
    # (TRL's clip_ratio/low, /high, /region)
    with torch.no_grad():
        low = (ratio < 1 - epsilon_low) & (A < 0)
        high = (ratio > 1 + epsilon_high) & (A > 0)
        low = low.expand_as(mask).float() * mask
        high = high.expand_as(mask).float() * mask
        # 0-d tensors: policy_backward reads them once, after its loop
        stats = {"clipped_low": low.sum(), "clipped_high": high.sum(),
                 "clipped_tokens": (low + high).sum(),
                 "kl_sum": (kl * mask).sum() if kl is not None else mask.new_zeros(())}
    return loss, stats


def update(model, optimizer, stats, *, grad_clip, timer, apply=True):
    """7: the ranks' gradients and `stats` summed (in place; nothing to do
    in one process), clip, AdamW on the LoRA parameters.
    apply=False (TracIn kept no rollout, or its influence was not finite):
    no clip, no AdamW step, whose moments would still move the adapter on
    a zero gradient.
    A non-finite loss or gradient norm: no optimizer.step(), the weights
    and AdamW's state untouched -> (grad norm, skip reason or None).
    The other ways a step is skipped: NaN/Inf logits while sampling
    (model.NonFiniteLogits: no backward at all) and a non-finite
    influence (tracin.tracin_backward). What the run does after a skipped
    step is told in train_grpo.py's loop."""
    skip_reason = None
    params = lora_parameters(model)
    with timer("optimizer"):
        # all ranks' LoRA gradients, before the clip
        distributed.sum_grads(params)
        distributed.sum_stats(stats)  # and every statistic the step returned
        grad_norm = torch.tensor(0.0)
        if apply:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        losses_finite = all(math.isfinite(v) for v in stats["losses"])
        finite = math.isfinite(grad_norm.item()) and losses_finite
        if not finite:
            skip_reason = "non-finite loss or gradient"
            print(f"warning: {skip_reason}; step skipped, weights untouched")
        elif apply:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grad_norm.item(), skip_reason
