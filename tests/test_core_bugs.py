"""Tests for bugs in the core math that the rest of the suite let through: each of these bugs was put
into the code by hand and the other tests still passed. Every test here checks against an independent
reference, never a copy of the code it tests. Run: python -m pytest -q tests/test_core_bugs.py  (~5 s)

  1. sample_next ignores `temperature`   ->  frequencies of inverse-CDF draws on the grid of uniforms
     u_i = (i + 1/2) / n match softmax(logits / T) within 1/n (no sampling noise; 2/n allowed), T = 0.5 and 2.
  2. grpo_loss swaps epsilon_low and epsilon_high  ->  the PPO clipped objective written out per token
     in Python floats (value, d loss / d logp per token, clip counts), bounds 0.1 / 0.3, ratios != 1,
     both signs of the advantage.
  3. update steps on a non-finite gradient when the loss is finite  ->  snapshots of the weights and of
     the optimizer state; a finite gradient does step (the control).
  4. an all-equal group gets advantages of ~3e-8, not 0  ->  exact 0.0 for rewards whose float32 mean is
     inexact (0.1 x 7, 0.3 x 6, 1/3 x 7), every scale_rewards mode, with and without unscored (NaN) rewards.
  5. the inverse-CDF draw lands on a masked token at a tie (searchsorted right=False)  ->  u on the exact
     cumulative boundaries (u = 0, u * total == cdf_k, u just below 1): hand-listed tokens under top_k,
     and the nucleus computed by hand in float64 under top_p.
  6. post-hoc scores put back with the wrong permutation after the length sort  ->  rollouts of unequal
     lengths whose sorting permutation is a 3-cycle (not its own inverse); each rollout alone through
     torch.autograd.grad with the loss written out (-A mean_t log softmax(logits / T)[token]).
  7. explicit learning_rates paired with the wrong checkpoint  ->  the same hand gradients, checkpoint by
     checkpoint, times the given rate: every checkpoint_contributions entry and the sum.
  8. the logged entropy ignores the temperature, or is computed in bf16  ->
     torch.distributions.Categorical(logits=logits.float() / T).entropy() at T = 0.7 and 1.6, and under CPU
     bf16 autocast from the same bf16 logits upcast (float32 result, within 1e-4).
Found by a second hunt over the same functions (each bug also missed by the rest of the suite):
  9. mode='simple' scores the first checkpoint, not the last  ->  the hand gradients at the last one.
 10. select_rollouts('topk') keeps nothing when topk_frac * n rounds to 0  ->  the argmax by hand.
 11. scale_rewards='batch' drops advantage_epsilon  ->  (r - group mean) / (batch std + eps) by hand.
 12. completion_logprobs at temperature 0 (greedy runs) divides by zero  ->  plain float64 log_softmax.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import cfg_calls
import grpo
from analysis import attribute
import tracin
import train_grpo as tg
from conftest import build_gpt
from lora import apply_lora, load_lora_state_dict, lora_parameters
from runs.checkpoint import load_checkpoint
from model import Sampling, generate, sample_next, uniforms
from test_tracin import ByteEnc, make_model, posthoc_setup

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


# ---------------------------------------------------------------------------- 1. sampling temperature
@pytest.mark.parametrize("T", [0.5, 2.0])
def test_sample_next_frequencies_follow_the_tempered_softmax(T):
    """Catches: sample_next ignoring `temperature` (drawing from softmax(logits) at every T).
    On the grid u_i = (i + 1/2) / n an inverse-CDF draw gives token k to the grid points inside
    [cdf_{k-1}, cdf_k): n p_k of them, within 1, so every frequency is p_k within 1/n (2/n allowed:
    the float32 cdf may move a boundary past one grid point)."""
    n = 20000
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -2.0])
    u = ((torch.arange(n, dtype=torch.float64) + 0.5) / n).float()
    draws = sample_next(logits.repeat(n, 1), Sampling(temperature=T), u)
    freq = torch.bincount(draws, minlength=6).double() / n
    p = torch.softmax(logits.double() / T, 0)
    assert (p - torch.softmax(logits.double(), 0)).abs().max() > 100 / n  # T really matters here
    assert (freq - p).abs().max() <= 2 / n, (freq, p)


# ---------------------------------------------------------------------------- 2. asymmetric clip
EPS_LOW, EPS_HIGH = 0.1, 0.3
RATIOS = [0.6, 0.8, 0.95, 1.05, 1.2, 1.5]  # below 0.7, in (0.7, 0.9), inside, inside, in (1.1, 1.3), above 1.3


def ppo_token(rho, A, el, eh):
    """(loss, d loss / d log rho) of one token: -min(rho A, clip(rho, 1 - el, 1 + eh) A)."""
    clipped = min(max(rho, 1 - el), 1 + eh)
    unclipped_term_wins = (1 - el < rho < 1 + eh) or rho * A < clipped * A
    return -min(rho * A, clipped * A), (-rho * A if unclipped_term_wins else 0.0)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_grpo_loss_with_asymmetric_clip_bounds(loss_type):
    """Catches: epsilon_low and epsilon_high swapped (in the clamp or in the clip counts). Ratio 1.2 with
    A > 0 lies inside 1 + 0.3 but outside 1 + 0.1; ratio 0.8 with A < 0 lies outside 1 - 0.1 but inside
    1 - 0.3: a swap changes the loss, the gradient and the counts."""
    adv = [1.0, -1.0, 0.5, -2.0]
    mask = [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0], [1, 1, 0, 1, 1, 1]]
    old = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).double()
    logp = (old + torch.tensor(RATIOS, dtype=torch.float64).log()).requires_grad_(True)
    knobs = grpo.LossKnobs(beta=0.0, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, loss_type=loss_type)
    mask_t = torch.tensor(mask)
    whole = grpo.Divisors(num_seqs=len(mask), num_tokens=mask_t.sum().item())
    loss, st = grpo.grpo_loss(logp, old, None, torch.tensor(adv).double(), mask_t, knobs, whole)
    (g,) = torch.autograd.grad(loss, logp)
    n_tok = sum(map(sum, mask))
    want_loss, low, high = 0.0, 0, 0
    for i, A in enumerate(adv):
        count = sum(mask[i])
        norm = 4 * count if loss_type == "grpo" else n_tok  # grpo: mean per completion, / n; dapo: / tokens
        for t, rho in enumerate(RATIOS):
            term, d = ppo_token(rho, A, EPS_LOW, EPS_HIGH)
            if not mask[i][t]:
                assert g[i, t].item() == 0.0
                continue
            want_loss += term / norm
            assert g[i, t].item() == pytest.approx(d / norm, rel=1e-9, abs=1e-12), (i, t)
            low += rho < 1 - EPS_LOW and A < 0
            high += rho > 1 + EPS_HIGH and A > 0
    assert loss.item() == pytest.approx(want_loss, rel=1e-12)
    assert (st["clipped_low"], st["clipped_high"], st["clipped_tokens"]) == (low, high, low + high)
    assert low >= 2 and high >= 1  # both sides of the clip act
    swapped = sum(ppo_token(rho, A, EPS_HIGH, EPS_LOW)[0] for A in adv for rho in RATIOS)
    assert swapped != pytest.approx(sum(ppo_token(rho, A, EPS_LOW, EPS_HIGH)[0] for A in adv for rho in RATIOS))


# ---------------------------------------------------------------------------- 3. non-finite gradient
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_update_skips_a_non_finite_gradient_with_a_finite_loss(tiny_gpt, bad):
    """Catches: update checking the loss only (or only NaN), so an Inf in one LoRA .grad with a finite
    loss still steps AdamW (the clip turns Inf into NaN, and NaN into the weights)."""
    apply_lora(tiny_gpt, r=2, alpha=4)
    params = lora_parameters(tiny_gpt)
    cfg, stats = {"grad_clip": 1.0, "device": "cpu"}, {"losses": [0.25, 0.5]}
    gen = torch.Generator().manual_seed(0)

    def fill_grads():
        for p in params:
            p.grad = 0.01 * torch.randn(p.shape, generator=gen)
    opt = torch.optim.AdamW(params, lr=0.1)
    before = [p.detach().clone() for p in params]
    fill_grads()
    params[3].grad.view(-1)[5] = bad
    norm, reason = cfg_calls.update(tiny_gpt, opt, cfg, stats)
    assert reason is not None and not math.isfinite(norm)
    assert all(torch.equal(p, b) for p, b in zip(params, before))  # weights untouched
    assert not opt.state  # AdamW never stepped (no moments, no step count)
    fill_grads()  # control: the same call with a finite gradient steps
    norm, reason = cfg_calls.update(tiny_gpt, opt, cfg, stats)
    assert reason is None and math.isfinite(norm)
    assert any(not torch.equal(p, b) for p, b in zip(params, before))


# ---------------------------------------------------------------------------- 4. exact zero advantages
@pytest.mark.parametrize("mode", ["group", "batch", "none"])
@pytest.mark.parametrize("value, n", [(0.1, 7), (0.3, 6), (1 / 3, 7)])
@pytest.mark.parametrize("unscored", [False, True])
def test_all_equal_group_has_exactly_zero_advantages(mode, value, n, unscored):
    """Catches: advantages of an all-equal group left at r - mean(r) (~3e-8 in float32 for n rewards of
    0.1, 0.3, 1/3, or 0.03 after 'batch' divides by its 1e-6 floor) instead of exactly 0.0. A second group
    with different rewards keeps its signal; with `unscored` each group also holds one NaN reward (the
    nan-mean path), so that the group's n scored rewards are the same n."""
    scored = torch.full((n,), value, dtype=torch.float32)
    assert (scored - scored.sum() / n).abs().max() > 0, "test setup: the float32 mean must be inexact"
    r, other = scored, torch.linspace(0.0, 1.0, n)
    if unscored:
        r, other = torch.cat([r[:2], torch.tensor([math.nan]), r[2:]]), torch.cat([torch.tensor([math.nan]), other])
    G = n + unscored
    adv, n_zero = grpo.compute_group_advantages(torch.cat([r, other]), G, mode, epsilon=1e-4)
    assert adv[:G].tolist() == [0.0] * G  # exactly, also where the reward was NaN
    assert n_zero == 1 and (adv[G:] != 0).sum() >= n - 1


# ---------------------------------------------------------------------------- 5. ties in the inverse CDF
def test_inverse_cdf_never_draws_a_masked_token_at_a_boundary():
    """Catches: torch.searchsorted(..., right=False): with u at a cumulative boundary the draw lands on
    the token whose cdf equals u * total, a masked one (probability 0) when masked tokens sit there.
    top_k: 4 equal logits among 8, so the probabilities are exactly 1/4 and u = 0, 1/4, 1/2, 3/4 hit the
    boundaries exactly; the token is the first whose cumulative probability EXCEEDS u."""
    logits = torch.tensor([-5.0, 0.0, -5.0, 0.0, 0.0, -5.0, 0.0, -5.0])  # top 4: tokens 1, 3, 4, 6
    u = torch.tensor([0.0, 0.25, 0.5, 0.75, 1 - 2 ** -24, 0.1, 0.3, 0.6])
    got = sample_next(logits.repeat(len(u), 1), Sampling(top_k=4), u)
    assert got.tolist() == [1, 3, 4, 6, 6, 1, 3, 4]


def test_inverse_cdf_never_draws_outside_the_nucleus_at_a_boundary():
    """Catches the same searchsorted tie under top_p: the least likely token (index 0) and the two after
    the nucleus are masked; u = 0, each cumulative boundary c_k / total and its float32 neighbours, and
    u just below 1 must all draw from the nucleus {1, 2, 3} (computed here in float64)."""
    p = torch.tensor([0.02, 0.4, 0.3, 0.2, 0.05, 0.03], dtype=torch.float64)
    top_p, nucleus, mass = 0.85, set(), 0.0
    for t in p.argsort(descending=True).tolist():  # smallest set of the most likely tokens with mass >= top_p
        nucleus.add(t)
        mass += p[t].item()
        if mass >= top_p:
            break
    assert nucleus == {1, 2, 3}
    cdf = torch.where(torch.tensor([t in nucleus for t in range(6)]), p, 0.0).cumsum(0) / mass
    c = cdf.float()
    u = torch.cat([torch.tensor([0.0, 1 - 2 ** -24]), c, torch.nextafter(c, torch.zeros_like(c)),
                   torch.nextafter(c, torch.ones_like(c))]).clamp(0.0, 1 - 2 ** -24)
    got = sample_next(p.log().float().repeat(len(u), 1), Sampling(top_p=top_p), u)
    assert set(got.tolist()) <= nucleus, list(zip(u.tolist(), got.tolist()))
    assert got[0] == 1 and got[1] == 3  # u = 0: the first nucleus token; u -> 1: the last one


# ---------------------------------------------------------------------------- 6, 7, 9: post-hoc TracIn
# rollouts of unequal lengths (prompt + "\n" + completion: 8, 12, 4, 9 tokens): the length sort's
# permutation [2, 0, 3, 1] is a 3-cycle, so putting scores back with `order` instead of its inverse
# moves them (a swap of two rows, its own inverse, would hide that)
UNEQUAL = [{"prompt": "abcd", "completion_tokens": [3, 4, 0], "advantage": 1.0},
           {"prompt": "efghij", "completion_tokens": [5, 6, 7, 8, 0], "advantage": -0.5},
           {"prompt": "k", "completion_tokens": [9, 0], "advantage": 0.7},
           {"prompt": "lm", "completion_tokens": [2, 3, 4, 5, 6, 0], "advantage": -1.2}]
for _s in UNEQUAL:
    _s["completion_mask"] = [1] * len(_s["completion_tokens"])
TEST = [{"prompt": "xy", "completion_tokens": [3, 7, 0], "completion_mask": [1, 1, 1], "advantage": 1.0},
        {"prompt": "zzz", "completion_tokens": [8, 2, 5, 0], "completion_mask": [1] * 4, "advantage": 1.0}]


def hand_inner_products(m, paths, train, test, temperature=1.0):
    """Reference: (checkpoints, n) float64 <g_i, G_t>, G_t = sum_j g_test_j. Each rollout alone (a batch
    of one, no padding) through torch.autograd.grad of its loss written out: -A mean_t log softmax(logits_t
    / T)[y_t] over its completion tokens (every one in its mask here)."""
    enc, out = ByteEnc(), []
    for path in paths:
        load_lora_state_dict(m, load_checkpoint(path)["lora"])
        params = lora_parameters(m)

        def grad(s):
            comp = s["completion_tokens"]
            idx = torch.tensor([enc.encode(s["prompt"] + "\n") + comp])
            logits = m(idx[:, :-1], keep_last=len(comp))[0][0]                        # (T, V)
            logp = F.log_softmax(logits.double() / temperature, -1)[torch.arange(len(comp)), comp]
            loss = -s["advantage"] * logp.mean()
            return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]).double()
        G = sum(grad(s) for s in test)
        out.append(torch.stack([grad(s) @ G for s in train]))
    return torch.stack(out)


def scores_of(res, key="tracin_score"):
    return torch.tensor([e[key] for e in res["scores"]], dtype=torch.float64)


@pytest.fixture
def posthoc(tmp_path):
    """(model, checkpoint paths, their stored learning rates, reference <g_i, G_t> (3, 4)) on UNEQUAL."""
    m = make_model().eval()
    paths, lrs, _, _ = posthoc_setup(tmp_path, m)
    lengths = [len(s["prompt"]) + 1 + len(s["completion_tokens"]) for s in UNEQUAL]
    order = torch.tensor(lengths).argsort()
    assert not torch.equal(order.argsort(), order), "test setup: the length sort must not be its own inverse"
    return m, paths, lrs, hand_inner_products(m, paths, UNEQUAL, TEST)


@pytest.mark.parametrize("micro_batch", [64, 3])
def test_posthoc_scores_of_unequal_lengths_come_back_in_input_order(posthoc, micro_batch):
    """Catches: hook_products putting the length-sorted scores back with the sort's permutation instead
    of its inverse: row i would get another rollout's score. One chunk, and chunks of 3 and 1."""
    m, paths, lrs, inner = posthoc
    want = sum(lr * ip for lr, ip in zip(lrs, inner))
    assert want.abs().min() > 1e-6 and len(set(want.tolist())) == len(UNEQUAL)
    res = attribute.find_critical_samples(m, paths, UNEQUAL, TEST, ByteEnc(), micro_batch=micro_batch)
    assert torch.allclose(scores_of(res), want, rtol=1e-4, atol=1e-10), (scores_of(res), want)
    assert [e["index"] for e in res["scores"]] == [0, 1, 2, 3]
    assert [e["prompt"] for e in res["scores"]] == [s["prompt"] for s in UNEQUAL]


def test_posthoc_explicit_learning_rates_weight_their_own_checkpoint(posthoc):
    """Catches: learning_rates[t] paired with another checkpoint than t (reversed, shifted) or ignored for
    the stored 'lr'. Rates unlike the stored ones and the stored ones reversed: every checkpoint's
    contribution is its own rate times its own hand inner product."""
    m, paths, stored, inner = posthoc
    for rates in ([0.3, 0.02, 0.11], stored[::-1]):
        res = attribute.find_critical_samples(m, paths, UNEQUAL, TEST, ByteEnc(), learning_rates=rates)
        for i, e in enumerate(res["scores"]):
            want = [rate * inner[t, i].item() for t, rate in enumerate(rates)]
            assert e["checkpoint_contributions"] == pytest.approx(want, rel=1e-4, abs=1e-12), (rates, i)
            assert e["tracin_score"] == pytest.approx(sum(want), rel=1e-4, abs=1e-12), (rates, i)


def test_posthoc_simple_mode_scores_the_last_checkpoint(posthoc):
    """Catches: mode='simple' taking the first checkpoint instead of the last. It is plain gradient
    alignment at the last checkpoint: <g_i, G>, no learning-rate weight."""
    m, paths, _, inner = posthoc
    assert (inner[-1] - inner[0]).abs().max() > 1e-3 * inner[-1].abs().max()  # the checkpoints differ
    res = attribute.find_critical_samples(m, paths, UNEQUAL, TEST, ByteEnc(), mode="simple")
    assert res["num_checkpoints"] == 1
    assert torch.allclose(scores_of(res), inner[-1], rtol=1e-4, atol=1e-10)


# ---------------------------------------------------------------------------- 8. logged entropy
@pytest.fixture
def sharp_rollouts():
    """A model with far-from-uniform logits (so the temperature changes the entropy) and left-padded rows."""
    m = build_gpt(seed=1, emb_scale=10.0, block_scale=10.0)
    u = uniforms(8, 6, 0, "cpu")
    idx, pl, mask = generate(m, [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]], 8, 0, num_samples=2, u=u)
    assert (pl > 0).any()
    return m, idx, pl, mask.size(1)


def test_entropy_uses_the_temperature(sharp_rollouts):
    """Catches: completion_logprobs(with_entropy=True) returning the entropy of softmax(logits), not of
    the sampling policy softmax(logits / T)."""
    m, idx, pl, T = sharp_rollouts
    with torch.no_grad():
        logits = m(idx[:, :-1], pad_left=pl, keep_last=T)[0]
    for temp in (0.7, 1.6):
        _, ent = grpo.completion_logprobs(m, idx, pl, T, temp, with_entropy=True)
        want = torch.distributions.Categorical(logits=logits.float() / temp).entropy()
        assert (want - torch.distributions.Categorical(logits=logits.float()).entropy()).abs().max() > 0.1
        assert ent.dtype == torch.float32 and ent.shape == (idx.size(0), T)
        assert torch.allclose(ent, want, atol=1e-5, rtol=0)


def test_entropy_under_bf16_autocast_is_float32(sharp_rollouts):
    """Catches: the entropy computed in bf16 under autocast (no .float() before the softmax): a bf16
    result ~1e-2 off. It must be float32 and within 1e-4 of the float32 entropy of the same bf16 logits."""
    m, idx, pl, T = sharp_rollouts
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(idx[:, :-1], pad_left=pl, keep_last=T)[0]
        _, ent = grpo.completion_logprobs(m, idx, pl, T, 0.7, with_entropy=True)
    assert logits.dtype == torch.bfloat16  # autocast really ran
    want = torch.distributions.Categorical(logits=logits.float() / 0.7).entropy()
    assert ent.dtype == torch.float32
    assert torch.allclose(ent, want, atol=1e-4, rtol=0), (ent - want).abs().max()


# ---------------------------------------------------------------------------- 10-12: more of the same kind
def test_topk_selection_keeps_at_least_one_rollout():
    """Catches: select_rollouts('topk') keeping round(frac * n) rollouts without the floor of 1: a small
    fraction of a small batch (0.05 * 8 -> 0) would keep none and train on nothing."""
    infl = torch.tensor([0.3, -1.0, 2.5, 0.1, -0.2, 1.7, 0.0, 0.4])
    for frac in (0.05, 0.01):
        assert tracin.select_rollouts(infl, tracin.TracInKnobs(selection="topk", topk_frac=frac, ranking="dot")).tolist() == [i == 2 for i in range(8)]


def test_batch_scaled_advantages_use_the_epsilon():
    """Catches: scale_rewards='batch' dropping advantage_epsilon: A = (r - group mean) / (batch std + eps),
    the batch std unbiased over every reward (torch.std's default, as for 'group')."""
    r = [1.0, 0.0, 3.0, 3.0, 2.0, 6.0]
    eps = 0.5
    mean_all = sum(r) / 6
    batch_std = math.sqrt(sum((x - mean_all) ** 2 for x in r) / 5)
    means = [(r[2 * g] + r[2 * g + 1]) / 2 for g in range(3)]
    want = [(x - means[i // 2]) / (batch_std + eps) for i, x in enumerate(r)]
    adv, _ = grpo.compute_group_advantages(torch.tensor(r), 2, "batch", epsilon=eps)
    assert adv.tolist() == pytest.approx(want, abs=1e-6)


def test_completion_logprobs_at_temperature_zero_are_plain_logprobs(sharp_rollouts):
    """Catches: completion_logprobs dividing by the temperature of a greedy run (0): log-probs must be
    those of softmax(logits) (temperature 1), finite, with a finite entropy."""
    m, idx, pl, T = sharp_rollouts
    with torch.no_grad():
        logits = m(idx[:, :-1], pad_left=pl, keep_last=T)[0]
        logp, ent = grpo.completion_logprobs(m, idx, pl, T, 0, with_entropy=True)
    want = F.log_softmax(logits.double(), -1).gather(-1, idx[:, -T:, None]).squeeze(-1)
    assert torch.allclose(logp.double(), want, atol=1e-5)
    assert torch.isfinite(ent).all()


# ---------------------------------------------------------------------------- 3b. a skipped update ends its generation
@pytest.mark.parametrize("bad_update", [0, 1])
def test_a_skipped_update_ends_the_generations_updates(tiny_gpt, monkeypatch, bad_update):
    """num_iterations = 3 on one generation: when update `bad_update` meets a non-finite loss, the weights
    stay as they were before it and no later update of the same generation runs (they would step from the
    state the skip refused, while the log calls the step skipped); the skip reason is that first one's."""
    apply_lora(tiny_gpt, r=2, alpha=4)
    params = lora_parameters(tiny_gpt)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in params:
            p.normal_(0, 0.1, generator=gen)
    idx = torch.randint(1, 50, (4, 9), generator=gen)
    batch = grpo.Rollouts(idx, torch.zeros(4, dtype=torch.long), torch.ones(4, 4, dtype=torch.long),
                          torch.tensor([1.0, -1.0, 0.5, -0.5]))
    cfg = {**tg.defaults, "micro_batch_size": 4, "num_iterations": 3, "beta": 0.0, "device": "cpu"}
    real, calls, weights = grpo.policy_backward, [], []

    def backward(model, b, step, **k):
        weights.append([p.detach().clone() for p in params])  # the weights this update starts from
        stats = real(model, b, step, **k)
        calls.append(len(calls))
        if len(calls) - 1 == bad_update:
            stats["losses"].append(float("nan"))
        return stats
    monkeypatch.setattr(grpo, "policy_backward", backward)
    opt = torch.optim.AdamW(params, lr=0.1)
    stats, norm, reason = cfg_calls.grpo_updates(tiny_gpt, opt, batch, cfg)
    assert reason == "non-finite loss or gradient"
    assert len(calls) == bad_update + 1  # nothing ran after the skipped update
    assert all(torch.equal(p, w) for p, w in zip(params, weights[bad_update]))  # it left them untouched
    assert len(stats["losses"]) == bad_update + 2  # one loss per update that ran, and the NaN
