# Tests for the summed-gradient influence <g_i, sum_j g_val_j> (ghost.summed_gradient,
# ghost.summed_inner_products, tracin_influence='summed' in tracin.tracin_backward, the summed test
# gradient of post-hoc find_critical_samples) and the subset update (ghost.subset_gradients).
# Run: python -m pytest tests/test_influence_summed.py -q
#
# Independent references:
#   test_summed_products_match_bruteforce_and_matrix  flattened torch.func per-sample gradients (each
#       sample run alone, test_tracin.func_per_sample_grads): train @ sum of val rows; and the row sums
#       of the [n, n_val] matrix. Both sides go through grpo.policy_backward with micro-batches that do
#       not divide the batch (6 rows by 4, 4 rows by 3) and left-padded, early-ended rows.
#   test_summed_gradient_is_the_batch_gradient  .grad of the same backward without any hooks; idle hooks
#       (split None) keep no buffer.
#   test_tracin_backward_summed_equals_matrix  the 'matrix' path: same influence (<= 1e-5 relative),
#       same kept set, same .grad afterwards, same weights; a spy shows that 'summed' never forms the
#       matrix and never collects validation buffers.
#   test_subset_gradients_weighted_and_empty  torch.func per-sample gradients, weighted and summed by hand.
#   test_posthoc_summed_with_filter_and_chunks  plain torch.autograd.grad per sample over the filtered
#       LoRA parameters, each sample alone; rows of different lengths in train and test chunks that do
#       not divide their batches (chunks are sorted by length and trimmed of shared padding).
import pytest
import torch

import ghost
from analysis import attribute
import tracin
import train_grpo
from cfg_calls import informative_rows, loss_of, policy_backward, tracin_backward
from grpo import LossKnobs, Rollouts
from lora import load_lora_state_dict, lora_parameters
from runs.checkpoint import load_checkpoint
from test_tracin import (LAYERS, TRAIN_ADV, TRAIN_PROMPTS, VAL_ADV, VAL_PROMPTS, ByteEnc, capture_both, flat,
                         func_per_sample_grads, make_batch, make_model, posthoc_setup)

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")
AMP = torch.autocast("cpu", enabled=False)


@pytest.fixture
def world():
    m = make_model()
    train = make_batch(m, TRAIN_PROMPTS, 2, seed=3, end_early=[(0, 2), (3, 4)])
    val = make_batch(m, VAL_PROMPTS, 1, seed=4, end_early=[(1, 1), (2, 5)])
    assert (train[1] > 0).any() and (val[1] > 0).any()  # left padding on both sides
    return m, train, val


NO_KL = LossKnobs(beta=0.0)  # cfg's loss: grpo, no KL term


def cfg(mb, **kw):
    """train_grpo's defaults with the grpo loss (per completion / N), as func_per_sample_grads uses."""
    return {**train_grpo.defaults, "micro_batch_size": mb, "beta": 0.0, "loss_type": "grpo", **kw}


def as_batch(data, adv):
    idx, pl, mask = data
    return Rollouts(idx=idx, pad_left=pl, mask=mask, advantages=adv)


def summed_and_matrix(m, train, val, mb_train=4, mb_val=3):
    """(summed influence, matrix row sums, G) for the same batches through policy_backward."""
    policy_backward(m, as_batch(val, VAL_ADV), cfg(mb_val), NO_KL)  # ordinary backward: G in .grad
    G = ghost.summed_gradient(m)
    assert all(p.grad is None for p in lora_parameters(m))  # cleared for the next backward
    with ghost.install_ghost_hooks(m) as hooks:
        policy_backward(m, as_batch(train, TRAIN_ADV), cfg(mb_train), NO_KL)
        hooks.split = "val"
        policy_backward(m, as_batch(val, VAL_ADV), cfg(mb_val), NO_KL)
        tr, va = hooks.collect("train"), hooks.collect("val")
    assert len(tr) == len(va) == LAYERS
    m.zero_grad(set_to_none=True)
    return ghost.summed_inner_products(ghost.per_sample_grads(tr), G), ghost.compute_ghost_inner_product_matrix(tr, va).sum(1), G


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_summed_products_match_bruteforce_and_matrix(world):
    m, train, val = world
    summed, rows, _ = summed_and_matrix(m, train, val)
    want = flat(func_per_sample_grads(m, train, TRAIN_ADV)) @ flat(func_per_sample_grads(m, val, VAL_ADV)).sum(0)
    assert summed.shape == (train[0].size(0),) and summed.dtype == torch.float32
    assert (want.abs() > 1e-3 * want.abs().max()).all()  # every row has a real influence to get right
    assert rel(summed, want) <= 1e-5 and rel(summed, rows) <= 1e-5
    for i in range(len(want)):  # each row, not only the largest
        assert abs(summed[i] - want[i]) <= 1e-5 * abs(want[i]) + 1e-6 * want.abs().max(), i


def test_summed_gradient_is_the_batch_gradient(world):
    m, _, val = world
    policy_backward(m, as_batch(val, VAL_ADV), cfg(3), NO_KL)  # no hooks at all
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if ".lora_" in n}
    m.zero_grad(set_to_none=True)
    with ghost.install_ghost_hooks(m) as hooks:
        hooks.split = None  # idle hooks, as tracin_backward's 'summed' validation pass: nothing kept
        policy_backward(m, as_batch(val, VAL_ADV), cfg(3), NO_KL)
        assert not any(d for split in ("train", "val") for d in hooks.buffers(split))
    G = ghost.summed_gradient(m, layer_filter="mlp")
    assert len(G) == LAYERS // 2 and all("mlp" in k for k in G)
    for k, (GA, GB) in G.items():
        assert torch.equal(GA, grads[f"{k}.lora_A.weight"]) and torch.equal(GB, grads[f"{k}.lora_B.weight"])
    assert all(p.grad is None for p in lora_parameters(m))  # filtered or not, every layer is cleared
    with pytest.raises(AssertionError, match="summed loss first"):
        ghost.summed_gradient(m)


@pytest.mark.parametrize("rule,beta", [("positive", 0.0), ("topk", 0.1)])
def test_tracin_backward_summed_equals_matrix(world, monkeypatch, rule, beta):
    m, train, val = world
    adv = TRAIN_ADV.clone()
    adv[[1, 4]] = 0.0  # with beta 0: zero gradient, influence exactly 0 on both paths, never kept by 'positive'
    opt = torch.optim.AdamW(lora_parameters(m), lr=0.1)
    weights = [p.detach().clone() for p in lora_parameters(m)]
    out, calls = {}, []
    real_matrix, real_collect = ghost.compute_ghost_inner_product_matrix, ghost.GhostHooks.collect
    monkeypatch.setattr(tracin, "compute_ghost_inner_product_matrix",
                        lambda *a, **k: calls.append("matrix") or real_matrix(*a, **k))
    monkeypatch.setattr(ghost.GhostHooks, "collect",
                        lambda self, split: calls.append(split) or real_collect(self, split))
    for how in ("summed", "matrix"):
        calls.clear()
        c = cfg(4, beta=beta, tracin_influence=how, tracin_selection=rule, tracin_topk_frac=0.5)
        _, infl, keep, _ = tracin_backward(m, opt, as_batch(train, adv), as_batch(val, VAL_ADV), c)
        out[how] = infl, keep, [p.grad.clone() for p in lora_parameters(m)]
        assert sorted(calls) == (["train"] if how == "summed" else ["matrix", "train", "val"])
        m.zero_grad(set_to_none=True)
    (si, sk, sg), (mi, mk, mg) = out["summed"], out["matrix"]
    assert rel(si, mi) <= 1e-5
    assert torch.equal(sk, mk) and 0 < int(sk.sum()) < len(sk)  # same kept set, and a real choice
    if beta == 0:
        assert (si[[1, 4]] == 0).all() and (mi[[1, 4]] == 0).all()
    for a, b in zip(sg, mg):
        assert torch.equal(a, b)  # the same subset gradient from the same train buffers
    assert all(torch.equal(p, w) for p, w in zip(lora_parameters(m), weights))


def autograd_filtered(m, paths, samples, keep):
    """Per checkpoint, (n, P) gradients of each sample's own loss over the LoRA parameters whose name
    passes `keep`, one torch.autograd.grad per sample (batch of 1)."""
    batch, out = tracin.rollout_batch(ByteEnc(), samples, "cpu"), []
    params = [p for n, p in m.named_parameters() if ".lora_" in n and keep(n)]
    for path in paths:
        load_lora_state_dict(m, load_checkpoint(path)["lora"])
        rows = [torch.autograd.grad(tracin.sample_losses(m, *(t[i:i + 1] for t in batch)), params)
                for i in range(len(samples))]
        out.append(torch.stack([torch.cat([g.flatten() for g in r]) for r in rows]).double())
    return out


def test_posthoc_summed_with_filter_and_chunks(world, tmp_path):
    """6 train rows of different lengths in chunks of 3 and 2 (find_critical_samples sorts them by length and
    trims each chunk's padding), 3 test rows in micro-batches of 3 and 2: G_t sums over micro-batches."""
    m = world[0]
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    train = [{"prompt": "klmnop", "completion_tokens": [2, 3, 4, 5, 6, 0], "completion_mask": [1] * 6,
              "advantage": 0.9},
             *train, {"prompt": "q", "completion_tokens": [7, 0], "completion_mask": [1, 1], "advantage": -0.4}]
    lengths = [len(r["prompt"]) + len(r["completion_tokens"]) for r in train]
    assert sorted(lengths) != lengths  # the sorted order is not the given one: results must be put back
    test = test + [{"prompt": "zz", "completion_tokens": [8, 2, 5, 0], "completion_mask": [1] * 4, "advantage": 1.0},
                   {"prompt": "qrs", "completion_tokens": [4, 0], "completion_mask": [1, 1], "advantage": 1.0}]
    scores = {}
    for filt in (None, "attn"):
        keep = (lambda n: True) if filt is None else (lambda n: filt in n)
        tr, te = autograd_filtered(m, paths, train, keep), autograd_filtered(m, paths, test, keep)
        score = scores[filt] = sum(lr * (g @ G.sum(0)) for lr, g, G in zip(lrs, tr, te))
        cos = sum(lr * (g @ G.sum(0)) / (g.norm(dim=1) * G.sum(0).norm()) for lr, g, G in zip(lrs, tr, te))
        for mb in (3, 2):
            res = attribute.find_critical_samples(m, paths, train, test, ByteEnc(), layer_filter=filt, micro_batch=mb,
                                               normalize=True)
            got = torch.tensor([e["tracin_score"] for e in res["scores"]], dtype=torch.float64)
            got_cos = torch.tensor([e["cosine_score"] for e in res["scores"]], dtype=torch.float64)
            assert torch.allclose(got, score, rtol=1e-4, atol=1e-10), (filt, mb)
            assert torch.allclose(got_cos, cos, rtol=1e-4, atol=1e-8), (filt, mb)
    assert not torch.allclose(scores[None], scores["attn"], rtol=1e-2)  # the filter matters


def test_subset_gradients_weighted_and_empty(world):
    """sum_i w_i g_i with real weights (zeros among them) against torch.func per-sample gradients; no row
    kept: exact zeros."""
    m, train, val = world
    tr, _ = capture_both(m, train, val)
    want = func_per_sample_grads(m, train, TRAIN_ADV)
    w = torch.tensor([0.5, 0.0, -2.0, 1.0, 0.0, 3.0])
    ghost.subset_gradients(m, ghost.per_sample_grads(tr), w)
    for n, p in m.named_parameters():
        if ".lora_" in n:
            ref = torch.einsum("n,n...->...", w, want[n])
            assert rel(p.grad, ref) <= 1e-5, n
    ghost.subset_gradients(m, ghost.per_sample_grads(tr), torch.zeros(6, dtype=torch.bool))
    assert all(torch.equal(p, torch.zeros_like(p)) for p in (q.grad for q in lora_parameters(m)))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
def test_zero_advantage_validation_rows_are_skipped_and_G_is_unchanged(world, monkeypatch, loss_type):
    """informative_rows drops the validation rows with advantage 0 (their gradient is exactly zero without
    a KL term) and keeps the whole batch's counts as normalisers: G equals the G of every row, with fewer
    rows forwarded. bnpo (per micro-batch counts) keeps every row; all-zero keeps one row and G = 0."""
    m, _, val = world
    adv = VAL_ADV.clone()
    adv[[0, 2]] = 0.0
    c = cfg(2, loss_type=loss_type)
    Gs, rows = [], []
    for batch in (as_batch(val, adv), informative_rows(as_batch(val, adv), c)):
        rows.append(len(batch))
        policy_backward(m, batch, c, loss_of(c))
        Gs.append(torch.cat([torch.cat([a.flatten(), b.flatten()]) for a, b in ghost.summed_gradient(m).values()]))
    assert rel(Gs[1], Gs[0]) <= 1e-6
    assert rows == ([len(adv)] * 2 if loss_type == "bnpo" else [len(adv), len(adv) - 2])
    none = informative_rows(as_batch(val, torch.zeros_like(adv)), c)
    if loss_type != "bnpo":
        assert len(none) == 1
        policy_backward(m, none, c, loss_of(c))
        assert all((g == 0).all() for pair in ghost.summed_gradient(m).values() for g in pair)


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_rollouts_tracin_can_never_keep_have_influence_exactly_zero(world, beta):
    """tracin.py's list: a row whose mask counts no token (any beta), and with beta 0 a row of advantage 0,
    have g_i = 0, so influence exactly 0 and 'positive' never keeps them; with beta > 0 the advantage-0 row's
    KL term gives it an influence of its own."""
    m, train, val = world
    idx, pl, mask = train
    adv, mask = TRAIN_ADV.clone(), mask.clone()
    adv[1], mask[4] = 0.0, 0  # row 1: advantage 0; row 4: a truncated completion, masked out
    opt = torch.optim.AdamW(lora_parameters(m), lr=0.1)
    c = cfg(4, beta=beta, tracin_selection="positive")
    _, infl, keep, _ = tracin_backward(m, opt, as_batch((idx, pl, mask), adv), as_batch(val, VAL_ADV), c)
    m.zero_grad(set_to_none=True)
    never = [4] if beta else [1, 4]
    assert (infl[never] == 0).all() and not keep[never].any()
    assert all(infl[i] != 0 for i in range(len(infl)) if i not in never)
    assert keep.any() and not keep.all()  # a real selection among the others
