# The parts of a GRPO step that split a batch: the rows every rank gathers (padding columns are no
# completion tokens), a part's rows of every field (its reference log-probs too), bnpo's count of
# micro-batches (never rounded down to 0), a TracIn step that kept nothing (AdamW left alone), and the
# statistics policy_backward sums over micro-batches, each under its own name.
# References: the one-process layout written out row by row; the whole batch's fields indexed; the
# loss computed by grpo_loss on the same log-probs; the optimizer state before the step; the clip
# counts, k3 KL and entropy written out over the whole batch.
# Run: python -m pytest -q tests/test_step_parts.py
import copy
import threading
from dataclasses import replace

import pytest
import torch

import grpo
from conftest import build_gpt
from cfg_calls import loss_of, policy_backward
from grpo import Divisors, LossKnobs, Rollouts, completion_logprobs, grpo_loss, rank_part
from runs.metrics import PhaseTimer
from lora import apply_lora, lora_parameters
from scale import distributed


# --- under torchrun: every rank's rows gathered as one process lays them out ---------------------
def as_two_ranks(monkeypatch, work):
    """work(rank) run by two threads as ranks 0 and 1 of a job (all_gather_cat exchanges their
    tensors); returns their results."""
    local, barrier, box, results = threading.local(), threading.Barrier(2), {}, [None, None]

    def all_gather_cat(t):
        box[local.rank] = t.clone()
        barrier.wait()
        out = torch.cat([box[0], box[1]])
        barrier.wait()  # both have read: the next call may overwrite
        return out
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: local.rank)
    monkeypatch.setattr(distributed, "all_gather_cat", all_gather_cat)

    def body(r):
        local.rank = r
        results[r] = work(r)
    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def sampled(rows, p, t, seed):
    """One rank's (idx, pad_left, mask): prompts left-padded to p, completions of t columns, each
    row stopping somewhere (mask 1 up to its length), pad id 0."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, 50, (rows, p + t), generator=g)
    pad_left = torch.randint(0, p, (rows,), generator=g)
    lengths = torch.randint(1, t + 1, (rows,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()
    for i in range(rows):
        idx[i, :pad_left[i]] = 0
        idx[i, p + lengths[i]:] = 0
    return idx, pad_left, mask


@pytest.mark.parametrize("n_prompts, shapes", [(3, [(3, 6), (2, 2)]), (4, [(1, 1), (4, 7)]),
                                               (5, [(2, 5), (2, 5)])])
def test_gathered_rows_count_only_completion_tokens(monkeypatch, n_prompts, shapes):
    G = 2  # rank 0 takes the odd prompt out (distributed.split)
    per_rank = [sampled(G * ((n_prompts + 1 - r) // 2), p, t, seed=r)
                for r, (p, t) in enumerate(shapes)]
    got = as_two_ranks(monkeypatch, lambda r: distributed.gather_sampled(*per_rank[r], 0, n_prompts,
                                                                         G))
    P, T = max(p for p, _ in shapes), max(t for _, t in shapes)
    want_idx, want_pad, want_mask = [], [], []
    for (idx, pad_left, mask), (p, t) in zip(per_rank, shapes):  # one process: rows as they are,
        for i in range(idx.size(0)):                             # padded to the widest of all
            want_idx.append(torch.cat([torch.zeros(P - p, dtype=torch.long), idx[i],
                                       torch.zeros(T - t, dtype=torch.long)]))
            want_pad.append(pad_left[i] + P - p)
            want_mask.append(torch.cat([mask[i], torch.zeros(T - t, dtype=torch.long)]))
    for idx, pad_left, mask in got:
        assert torch.equal(idx, torch.stack(want_idx))
        assert torch.equal(pad_left, torch.stack(want_pad))
        assert torch.equal(mask, torch.stack(want_mask))
        assert mask.sum() == sum(m.sum() for _, _, m in per_rank)  # no padding column counted


# --- a part of a batch: its own rows of every field, the whole batch's divisors -------------------
def rollouts(n=6, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, T, generator=g) < 0.7).long()
    return Rollouts(torch.randint(0, 50, (n, 3 + T), generator=g), torch.randint(0, 3, (n,), generator=g),
                    mask, torch.randn(n, generator=g), ref_logp=-torch.rand(n, T, generator=g),
                    old_logp=-torch.rand(n, T, generator=g), rewards=torch.rand(n, generator=g),
                    per_fn={"a": [float(i) for i in range(n)]}, truncated=torch.rand(n, generator=g) < 0.5,
                    influence=torch.randn(n, generator=g), selected=torch.rand(n, generator=g) < 0.5)


@pytest.mark.parametrize("rows", [slice(0, 2), slice(2, 6), slice(3, 4),
                                  torch.tensor([True, False, True, True, False, False])])
def test_a_part_takes_its_own_rows_of_every_field(rows):
    whole = rollouts()
    part = whole.part(rows)
    for name in ("idx", "pad_left", "mask", "advantages", "ref_logp", "old_logp", "rewards",
                 "truncated", "influence", "selected"):
        assert torch.equal(getattr(part, name), getattr(whole, name)[rows]), name
    kept = torch.arange(len(whole))[rows].tolist()  # a list field: the same rows
    assert part.per_fn == {"a": [float(i) for i in kept]}
    assert part.divisors(4) == whole.divisors(4)  # divided by the whole batch's numbers
    assert part.part(slice(0, 1)).divisors(4) == whole.divisors(4)  # a part's part too


# --- bnpo: the number of micro-batches, rounded up ----------------------------------------------
@pytest.mark.parametrize("n, mb, want", [(6, 100, 1), (6, 7, 1), (6, 6, 1), (6, 4, 2), (6, 1, 6),
                                         (8, 3, 3)])
def test_rank_part_counts_micro_batches_rounded_up(n, mb, want):
    assert rank_part(rollouts(n=n)).divisors(mb).num_micro_batches == want


CFG = dict(micro_batch_size=100, max_new_tokens=5, importance_sampling_level="token",
           use_bias_correction_kl=False, temperature=1.0, epsilon_low=0.2, epsilon_high=0.2,
           loss_type="bnpo", device="cpu")


@pytest.mark.parametrize("mb", [100, 7, 6])
def test_bnpo_loss_with_micro_batches_larger_than_the_batch(mb):
    """Micro-batches larger than the batch: one micro-batch, the loss the mean over its tokens."""
    torch.manual_seed(0)
    model = build_gpt(seed=0)
    batch = rollouts(n=6)
    batch = replace(batch, idx=batch.idx.clamp(max=model.config.vocab_size - 1), old_logp=None,
                    ref_logp=None)
    c = {**CFG, "micro_batch_size": mb, "beta": 0.0}
    stats = policy_backward(model, batch, c, loss_of(c))
    with torch.no_grad():
        logp, _ = completion_logprobs(model, batch.idx, batch.pad_left, 5, 1.0)
        knobs = LossKnobs(beta=0.0, loss_type="bnpo", max_len=5)
        divisors = Divisors(num_seqs=6, num_tokens=batch.mask.sum().item(), num_micro_batches=1)
        want, _ = grpo_loss(logp, logp, None, batch.advantages, batch.mask, knobs, divisors)
    assert len(stats["losses"]) == 1
    assert stats["losses"][0] == pytest.approx(want.item(), rel=1e-5, abs=1e-7)


# --- a TracIn step that kept no rollout: no AdamW step at all -------------------------------------
def test_a_step_that_kept_nothing_leaves_the_adapter_and_adamw_alone():
    torch.manual_seed(0)
    model = build_gpt(seed=0)
    apply_lora(model, 4, 8, 0.0, ("c_attn",))
    params = lora_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=0.1)
    for p in params:  # an earlier step: AdamW's moments are not zero
        p.grad = torch.randn_like(p)
    optimizer.step()
    before = [p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict())
    for p in params:  # what the hooks leave when no rollout is selected: zero gradients
        p.grad = torch.zeros_like(p)
    grad_norm, skip = grpo.update(model, optimizer, {"losses": [0.0]}, grad_clip=1.0, timer=PhaseTimer(),
                                  apply=False)
    assert (grad_norm, skip) == (0.0, None)
    assert all(torch.equal(p, q) for p, q in zip(params, before[0]))
    after = optimizer.state_dict()["state"]
    for k, state in before[1]["state"].items():
        assert all(torch.equal(v, after[k][name]) for name, v in state.items())


def test_policy_backward_sums_each_statistic_under_its_own_name():
    """policy_backward's sums over micro-batches of 2 rows (kept on the device, read after the loop) against
    the formulas written out over the whole batch: clipped below (ratio < 1 - eps_low where A < 0) and above
    (ratio > 1 + eps_high where A > 0) on the mask's tokens, their total, the k3 KL sum, the entropy sum,
    the token count, and one loss per micro-batch; old log-probs set so that both sides of the clip act."""
    torch.manual_seed(0)
    model = build_gpt(seed=0)
    batch = rollouts(n=6, seed=3)
    batch = replace(batch, idx=batch.idx.clamp(max=model.config.vocab_size - 1))
    with torch.no_grad():
        logp, _ = completion_logprobs(model, batch.idx, batch.pad_left, 5, 1.0)
        logits, _ = model(batch.idx[:, :-1], pad_left=batch.pad_left, keep_last=5)
    shift = torch.tensor([0.5, -0.5, 0.5, -0.5, 0.5, -0.5])[:, None]  # ratios e^-0.5 and e^0.5: both clip
    batch = replace(batch, old_logp=logp + shift, advantages=torch.tensor([-1.0, 1.0, 1.0, -1.0, -1.0, 1.0]))
    c = {**CFG, "micro_batch_size": 2, "beta": 0.1}
    stats = policy_backward(model, batch, c, loss_of(c))
    m, A = batch.mask.float(), batch.advantages[:, None]
    ratio = torch.exp(logp - batch.old_logp)
    low = (((ratio < 0.8) & (A < 0)).float() * m).sum().item()
    high = (((ratio > 1.2) & (A > 0)).float() * m).sum().item()
    d = batch.ref_logp - logp
    kl = ((torch.exp(d) - d - 1) * m).sum().item()
    ent = (-(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1) * m).sum().item()
    assert low > 0 and high > 0 and low != high
    assert stats["clipped_low"] == low and stats["clipped_high"] == high and stats["clipped_tokens"] == low + high
    assert stats["kl_sum"] == pytest.approx(kl, rel=1e-5) and stats["ent_sum"] == pytest.approx(ent, rel=1e-5)
    assert stats["num_tokens"] == batch.mask.sum().item() and len(stats["losses"]) == 3
    assert all(isinstance(x, float) for x in (*stats["losses"], stats["kl_sum"], stats["clipped_tokens"]))
