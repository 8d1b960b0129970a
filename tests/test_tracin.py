# Tests for tracin.py.  Run from the repository root:
#     python -m pytest tests/test_tracin.py -q        (about 5 s on one CPU thread)
#
# Independent reference used by each test:
#   test_hooks_match_torch_func (beta 0 and > 0)  torch.func: functional_call on a LoRA-only parameter
#       dict, each sample run ALONE as a batch of 1 with its own pad_left, loss = grpo_loss on that row
#       with num_seqs=N; per-sample gradients by torch.func.jacrev (which vmaps the backward over the
#       samples' losses); vmap(grad(...)) runs through grpo_loss too (its statistics stay tensors:
#       test_vmap_grad_runs_through_grpo_loss, against one grad per row).
#   test_val_split_buffers_with_beta      the same torch.func reference for the val split; snapshots of
#       the train buffers taken before the val capture.
#   test_ghost_equals_materialised_and_bruteforce  brute force: flattened torch.func per-sample gradients,
#       train @ val^T; the ghost and materialised forms against each other, and the cost rule mixing them
#       (a call counter on the ghost kernel).
#   test_influence_sums_validation_gradients  <g_i, sum_j g_val_j> from the torch.func gradients, and a
#       deliberately wrong "sum the validation activations first" ghost product that must differ.
#   test_subset_gradients_equal_backward_on_subset  a second code path: zero grads, forward the kept rows
#       only, ordinary backward (num_seqs = full N).
#   test_ghost_mode_*                     snapshots (clones and object identity) of weights and .grad.
#   test_hooks_removed_*                  outputs recorded before installation; module._forward_hooks.
#   test_backward_after_exit_*            a backward after the context exits leaves the buffers empty.
#   test_zero_advantage_*                 exact zeros (the GRPO loss of a row with A = 0 is constant).
#   test_select_rollouts                  hand-written expected masks; sorted() for the top-k set.
#   test_layer_filter_*                   per-layer matrices computed one layer at a time and summed, and
#       brute force restricted to the filtered parameters.
#   test_nan_in_captured_gradient_*       a NaN written by hand into x / gA / gB (train and val sides).
#   test_batch_layout                     the batch really has left padding and eot-padded ended rows.
#   test_hooks_need_lora                  AssertionError by hand.
#   test_posthoc_*                        a plain torch.autograd.grad loop over checkpoints and samples
#       (autograd_grads): scores, cosines <g_i, sum_j g_test_j> / (||g_i|| ||sum_j g_test_j||) and
#       self-influences written out from those gradients; snapshots of the model's state.
#   test_trapezoid_steps                  hand-computed weights.
#   test_posthoc_checkpoints_whose_iter_num_repeats_*  the same checkpoints without iter_num (k_t = 1 each).
#   test_posthoc_refuses_a_checkpoint_whose_unpickling_*  a directory its code makes when torch.load runs it
#       with weights_only=False (the premise), never made by find_critical_samples.
#   test_posthoc_unknown_mode_*           UserError by hand, before any work.
import os
import re

import pytest
import torch

from torch.func import functional_call, grad, jacrev, vmap

from analysis import attribute
import ghost
import tracin
from configurator import UserError
from lora import apply_lora, disable_lora, load_lora_state_dict, lora_parameters, lora_state_dict
from model import GPT, GPTConfig
from runs.checkpoint import load_checkpoint, save_checkpoint
from model import Sampling, generate, uniforms
from grpo import Divisors, LossKnobs, completion_logprobs, grpo_loss

# functorch notes that SDPA has no batching rule on CPU (a slower fallback): not a test concern
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")

EOT = 0
TRAIN_PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11]]     # 3 prompts x 2 samples = 6 rollouts
VAL_PROMPTS = [[12, 13, 14, 15], [16], [17, 18, 19], [20, 21, 22, 23, 24]]
TRAIN_ADV = torch.tensor([-1.5, 0.8, -0.3, 1.2, 2.0, -0.7])    # nonzero, all different
VAL_ADV = torch.tensor([1.0, -0.6, 0.4, 1.3])
LAYERS = 8  # c_attn, attn.c_proj, c_fc, mlp.c_proj in each of 2 blocks


def make_model(dropout=0.0):
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=64, vocab_size=50, n_layer=2, n_head=2, n_embd=32, dropout=dropout))
    apply_lora(m, r=4, alpha=8, targets=("c_attn", "c_proj", "c_fc"))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # B != 0, so lora_A gets a nonzero gradient
    return m.float()


def make_batch(m, prompts, num_samples, seed, end_early=()):
    """A batch laid out as sample.generate lays it out. Rows in end_early=(row, k) get an end-of-text
    at completion step k and eot padding after it (mask 0), as generate writes a finished row."""
    u = uniforms(8, len(prompts) * num_samples, seed, "cpu")
    idx, pl, mask = generate(m, prompts, 8, EOT, num_samples=num_samples, sampling=Sampling(temperature=1.5), u=u)
    P = idx.size(1) - mask.size(1)
    for r, k in end_early:
        idx[r, P + k:] = EOT
        mask[r] = (torch.arange(mask.size(1)) <= k).long()
    m.train()
    return idx, pl, mask


@pytest.fixture
def world():
    """(model, train batch, val batch); fresh for every test (0.03 s)."""
    m = make_model()
    train = make_batch(m, TRAIN_PROMPTS, 2, seed=3, end_early=[(0, 2), (3, 4)])
    val = make_batch(m, VAL_PROMPTS, 1, seed=4, end_early=[(1, 1), (2, 5)])
    return m, train, val


def ref_logps(m, data):
    with torch.no_grad(), disable_lora(m):
        return completion_logprobs(m, data[0], data[1], data[2].size(1), 1.0)[0]


def batch_loss(m, data, adv, beta=0.0, ref=None, N=None):
    idx, pl, mask = data
    logp, _ = completion_logprobs(m, idx, pl, mask.size(1), 1.0)
    divisors = Divisors(num_seqs=N or idx.size(0), num_tokens=mask.sum().clamp(min=1).item())
    return grpo_loss(logp, logp.detach(), ref, adv, mask, LossKnobs(beta=beta), divisors)[0]


def capture(m, hooks, split, data, adv, beta=0.0, ref=None):
    hooks.split = split
    batch_loss(m, data, adv, beta, ref).backward()
    return hooks.collect(split)


def capture_both(m, train, val, train_adv=TRAIN_ADV, val_adv=VAL_ADV):
    with ghost.install_ghost_hooks(m) as hooks:
        tr = capture(m, hooks, "train", train, train_adv)
        va = capture(m, hooks, "val", val, val_adv)
    m.zero_grad(set_to_none=True)
    return tr, va


def func_per_sample_grads(m, data, adv, beta=0.0, ref=None):
    """Reference: {lora param name: (N, *shape)}, sample i run alone (batch of 1, its own pad_left),
    loss_i = grpo_loss of row i with num_seqs=N; d loss_i / d params by torch.func.jacrev."""
    idx, pl, mask = data
    N, T = idx.size(0), mask.size(1)
    params = {n: p.detach() for n, p in m.named_parameters() if ".lora_" in n}
    divisors = Divisors(num_seqs=N, num_tokens=mask.sum().clamp(min=1).item())  # 'grpo' reads num_seqs

    def losses(p):
        def fwd(*a, **k):
            return functional_call(m, p, a, k)
        out = []
        for i in range(N):
            s = slice(i, i + 1)
            lp, _ = completion_logprobs(fwd, idx[s], pl[s], T, 1.0)
            ref_s = None if ref is None else ref[s]
            out.append(grpo_loss(lp, lp.detach(), ref_s, adv[s], mask[s], LossKnobs(beta=beta), divisors)[0])
        return torch.stack(out)
    with torch.no_grad():  # the per-sample losses add up to the batch loss the hooks see
        assert torch.allclose(losses(params).sum(), batch_loss(m, data, adv, beta, ref), rtol=1e-5, atol=1e-7)
    return jacrev(losses)(params)


def materialised(captured):
    out = {}
    for layer, (x, gA, h, gB) in captured.items():
        out[f"{layer}.lora_A.weight"] = ghost.outer_product_sum(x, gA)
        out[f"{layer}.lora_B.weight"] = ghost.outer_product_sum(h, gB)
    return out


def flat(grads, keep=lambda name: True):
    return torch.cat([grads[k].flatten(1) for k in sorted(grads) if keep(k)], 1)


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_batch_layout(world):
    _, (idx, pl, mask), (vidx, vpl, vmask) = world
    for p, m_ in ((pl, mask), (vpl, vmask)):
        assert (p > 0).any() and (p == 0).any()           # left-padded and unpadded rows
        assert (m_[:, -1] == 0).any() and (m_[:, -1] == 1).any()  # rows ended early, rows running
    T = mask.size(1)
    assert (idx[0, -T:][mask[0] == 0] == EOT).all()       # eot padding after the end


def test_vmap_grad_runs_through_grpo_loss(world):
    """grpo_loss reads nothing back from the device (its statistics stay 0-d tensors: no .item(), which
    vmap refuses), so torch.func's vmap(grad(.)) gives each row's gradient: equal to one
    torch.autograd.grad per row."""
    m, (idx, pl, mask), _ = world
    params = {n: p.detach() for n, p in m.named_parameters() if ".lora_" in n}
    divisors = Divisors(num_seqs=idx.size(0), num_tokens=1)

    def one(p, row, pl1, m1, a1):
        lp, _ = completion_logprobs(lambda *a, **k: functional_call(m, p, a, k), row[None], pl1[None],
                                    mask.size(1), 1.0)
        return grpo_loss(lp, lp.detach(), None, a1[None], m1[None], LossKnobs(beta=0.0), divisors)[0]
    got = vmap(grad(one), in_dims=(None, 0, 0, 0, 0))(params, idx, pl, mask, TRAIN_ADV)
    for i in (0, idx.size(0) - 1):
        want = grad(one)(params, idx[i], pl[i], mask[i], TRAIN_ADV[i])
        for n in params:
            torch.testing.assert_close(got[n][i], want[n], rtol=1e-4, atol=1e-7)
    assert max(got[n].abs().max() for n in params) > 1e-4  # real gradients


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_hooks_match_torch_func(world, beta):
    m, train, _ = world
    N = train[0].size(0)
    ref = ref_logps(m, train) if beta else None
    with ghost.install_ghost_hooks(m) as hooks:
        got = materialised(capture(m, hooks, "train", train, TRAIN_ADV, beta, ref))
        assert all(v[0].size(0) == N for v in hooks._train_xs.values())
    want = func_per_sample_grads(m, train, TRAIN_ADV, beta, ref)
    assert set(got) == set(want) and len(got) == 2 * LAYERS
    for k in want:
        assert got[k].shape == want[k].shape == (N, *dict(m.named_parameters())[k].shape), k
        assert want[k].abs().max() > 0, k
        assert rel_err(got[k], want[k]) <= 1e-5, (k, rel_err(got[k], want[k]))
        for i in range(N):  # every sample's own gradient, not only the largest entries
            assert rel_err(got[k][i], want[k][i]) <= 1e-5, (k, i)


def test_val_split_buffers_with_beta(world):
    m, train, val = world
    ref = ref_logps(m, train)
    with ghost.install_ghost_hooks(m) as hooks:
        tr = capture(m, hooks, "train", train, TRAIN_ADV, beta=0.1, ref=ref)
        before = [{k: [t.clone() for t in v] for k, v in d.items()} for d in hooks.buffers("train")]
        assert not any(hooks.buffers("val"))  # nothing in val yet
        va = capture(m, hooks, "val", val, VAL_ADV)
        nv = val[0].size(0)
        for d in (hooks._xs, hooks._hs, hooks._gAs, hooks._gBs):
            assert len(d) == LAYERS and all(len(v) == 1 and v[0].size(0) == nv for v in d.values())
        after = hooks.buffers("train")  # (xs, gAs, hs, gBs), the order of `before`
        for b, a in zip(before, after):
            assert b.keys() == a.keys() and len(b) == LAYERS
            for k in b:
                assert len(a[k]) == 1 and torch.equal(a[k][0], b[k][0])
    for got, want in ((materialised(tr), func_per_sample_grads(m, train, TRAIN_ADV, 0.1, ref)),
                      (materialised(va), func_per_sample_grads(m, val, VAL_ADV))):
        for k in want:
            assert rel_err(got[k], want[k]) <= 1e-5, k


def materialised_products(x1, g1, x2, g2):
    """<G1_i, G2_j> with every per-sample gradient formed first: (n1, n2)."""
    return ghost.outer_product_sum(x1, g1).flatten(1) @ ghost.outer_product_sum(x2, g2).flatten(1).T


def one_form_matrix(tr, va, form):
    """The [n_train, n_val] matrix with one form (ghost or materialised) on every layer."""
    return sum(form(x, gA, vx, vgA) + form(h, gB, vh, vgB)
               for (x, gA, h, gB), (vx, vgA, vh, vgB) in ((tr[n], va[n]) for n in tr))


def test_ghost_equals_materialised_and_bruteforce(world, monkeypatch):
    m, train, val = world
    tr, va = capture_both(m, train, val)
    calls = []
    real = ghost.ghost_inner_products
    monkeypatch.setattr(ghost, "ghost_inner_products", lambda *a, **k: calls.append(1) or real(*a, **k))
    ghosted, mat = one_form_matrix(tr, va, real), one_form_matrix(tr, va, materialised_products)
    auto = ghost.compute_ghost_inner_product_matrix(tr, va)
    assert 0 < len(calls) < 2 * LAYERS  # at these sizes the cost rule mixes both forms
    brute = flat(func_per_sample_grads(m, train, TRAIN_ADV)) @ flat(func_per_sample_grads(m, val, VAL_ADV)).T
    assert ghosted.shape == (train[0].size(0), val[0].size(0)) and ghosted.dtype == torch.float32
    scale = brute.abs().max().item()
    assert scale > 0
    assert torch.allclose(ghosted, mat, rtol=1e-5, atol=1e-6 * scale)
    assert torch.allclose(auto, mat, rtol=1e-5, atol=1e-6 * scale)
    for x in (ghosted, mat, auto):
        assert torch.allclose(x, brute, rtol=1e-5, atol=1e-5 * scale)


def test_influence_sums_validation_gradients(world):
    m, train, val = world
    tr, va = capture_both(m, train, val)
    assert val[0].size(0) >= 3
    influence = ghost.compute_ghost_inner_product_matrix(tr, va).sum(1)
    g_tr = flat(func_per_sample_grads(m, train, TRAIN_ADV))
    g_va = flat(func_per_sample_grads(m, val, VAL_ADV))
    want = g_tr @ g_va.sum(0)
    scale = want.abs().max().item()
    assert torch.allclose(influence, want, rtol=1e-5, atol=1e-5 * scale)
    wrong = 0  # a tempting shortcut: sum the validation activations and output gradients first; sum_j g_j^T x_j is not that
    for layer, (x, gA, h, gB) in tr.items():
        vx, vgA, vh, vgB = va[layer]
        wrong = wrong + ghost.ghost_inner_products(x, gA, vx.sum(0, keepdim=True), vgA.sum(0, keepdim=True))[:, 0]
        wrong = wrong + ghost.ghost_inner_products(h, gB, vh.sum(0, keepdim=True), vgB.sum(0, keepdim=True))[:, 0]
    assert (wrong - want).abs().max() > 0.1 * scale


def test_subset_gradients_equal_backward_on_subset(world):
    m, train, _ = world
    N = train[0].size(0)
    keep = torch.tensor([True, False, True, True, False, False])  # rows with and without padding
    assert train[1][keep].unique().numel() > 1 and (train[2][keep] == 0).any()
    opt = torch.optim.AdamW(lora_parameters(m), lr=0.1)
    with ghost.install_ghost_hooks(m) as hooks, ghost.ghost_mode(opt):
        captured = capture(m, hooks, "train", train, TRAIN_ADV)
    ghost.subset_gradients(m, ghost.per_sample_grads(captured), keep)
    got = {n: p.grad.clone() for n, p in m.named_parameters() if ".lora_" in n}
    # second path: zero grads, forward the kept rows only, backward; num_seqs = full N
    m.zero_grad(set_to_none=True)
    batch_loss(m, tuple(t[keep] for t in train), TRAIN_ADV[keep], N=N).backward()
    want = {n: p.grad.clone() for n, p in m.named_parameters() if ".lora_" in n}
    m.zero_grad(set_to_none=True)
    batch_loss(m, train, TRAIN_ADV).backward()
    full = {n: p.grad.clone() for n, p in m.named_parameters() if ".lora_" in n}
    assert len(got) == 2 * LAYERS
    for n in want:
        assert want[n].abs().max() > 0
        assert torch.allclose(got[n], want[n], rtol=1e-5, atol=1e-5 * want[n].abs().max().item()), n
    assert any(not torch.allclose(want[n], full[n], rtol=1e-3) for n in want)  # the subset matters
    ghost.subset_gradients(m, ghost.per_sample_grads(captured), torch.ones(N, dtype=torch.bool))  # all kept: the full gradient
    for n, p in m.named_parameters():
        if ".lora_" in n:
            assert torch.allclose(p.grad, full[n], rtol=1e-5, atol=1e-5 * full[n].abs().max().item()), n


def test_ghost_mode_blocks_updates_and_restores_grads(world):
    m, train, _ = world
    params = lora_parameters(m)
    opt = torch.optim.AdamW(params, lr=1.0)
    weights = [p.detach().clone() for p in params]
    torch.manual_seed(7)
    for i, p in enumerate(params):  # accumulated micro-batch gradients on half; None on the others
        p.grad = torch.randn_like(p) if i % 2 == 0 else None
    saved = [p.grad for p in params]
    snap = [None if g is None else g.clone() for g in saved]
    with ghost.ghost_mode(opt):
        assert all(p.grad is None for p in params)  # capture starts from clean .grad
        with ghost.install_ghost_hooks(m) as hooks:
            capture(m, hooks, "train", train, TRAIN_ADV)
            assert all(p.grad is None for p in params)  # a capture forms no summed weight gradient
            hooks.split = None
            batch_loss(m, train, TRAIN_ADV).backward()  # an ordinary backward does
        assert all(p.grad is not None and p.grad.abs().max() > 0 for p in params)
        with pytest.raises(RuntimeError, match="ghost_mode"):
            opt.step()
    assert all(torch.equal(p, w) for p, w in zip(params, weights))
    assert not opt.state  # no optimizer state was created either
    for p, g, s in zip(params, saved, snap):
        assert p.grad is g  # the very tensor that was there, or None: capture's grads dropped
        assert s is None or torch.equal(p.grad, s)
    opt.step()  # step works again outside
    assert not all(torch.equal(p, w) for p, w in zip(params, weights))


def test_capture_skips_the_weight_gradient_and_restores_requires_grad(world):
    """While a split captures, the LoRA weights need no grad (the backward forms only gA, gB and what
    flows through them); afterwards every parameter's requires_grad is as before, a frozen one too."""
    m, train, _ = world
    frozen = lora_parameters(m)[0]
    frozen.requires_grad_(False)
    before = {n: q.requires_grad for n, q in m.named_parameters()}
    with ghost.install_ghost_hooks(m) as hooks:
        assert not any(q.requires_grad for q in lora_parameters(m))
        hooks.split = None
        assert [q.requires_grad for q in lora_parameters(m)] == [before[n] for n, q in m.named_parameters() if ".lora_" in n]
        hooks.split = "train"
        batch_loss(m, train, TRAIN_ADV).backward()
    assert {n: q.requires_grad for n, q in m.named_parameters()} == before
    assert all(q.grad is None for q in lora_parameters(m))
    frozen.requires_grad_(True)


def test_ghost_mode_restores_on_exception(world):
    m, train, _ = world
    params = lora_parameters(m)
    opt = torch.optim.SGD(params, lr=1.0)
    for p in params:
        p.grad = torch.full_like(p, 2.0)
    with pytest.raises(KeyError):
        with ghost.ghost_mode(opt):
            batch_loss(m, train, TRAIN_ADV).backward()
            raise KeyError("boom")
    assert all(torch.equal(p.grad, torch.full_like(p, 2.0)) for p in params)
    before = [p.detach().clone() for p in params]
    opt.step()  # the real step is back
    assert all(torch.equal(p, b - 2.0) for p, b in zip(params, before))


def test_hooks_removed_leave_model_unchanged(world):
    m, train, _ = world
    idx, pl, mask = train
    loras = [mod for n, mod in m.named_modules() if n.endswith(("lora_A", "lora_B"))]
    assert len(loras) == 2 * LAYERS and all(not mod._forward_hooks for mod in loras)
    with torch.no_grad():
        out0, _ = m(idx, pad_left=pl, keep_last=mask.size(1))
    with ghost.install_ghost_hooks(m) as hooks:
        assert all(len(mod._forward_hooks) == 1 for mod in loras)
        with torch.no_grad():
            assert torch.equal(m(idx, pad_left=pl, keep_last=mask.size(1))[0], out0)
        capture(m, hooks, "train", train, TRAIN_ADV)
        hooks.split = "val"
        batch_loss(m, train, TRAIN_ADV).backward()
        bufs = hooks.buffers("train") + hooks.buffers("val")
        assert all(len(d) == LAYERS for d in bufs)
    assert all(not mod._forward_hooks for mod in m.modules())
    assert all(not d for d in bufs)  # cleared on removal
    with torch.no_grad():
        out1, _ = m(idx, pad_left=pl, keep_last=mask.size(1))
    assert torch.equal(out0, out1)
    m.zero_grad(set_to_none=True)
    batch_loss(m, train, TRAIN_ADV).backward()  # forward + backward outside the context
    assert all(not d for d in bufs)
    assert all(p.grad is not None for p in lora_parameters(m))


def test_backward_after_exit_does_not_fill_old_buffers(world):
    m, train, _ = world
    with ghost.install_ghost_hooks(m) as hooks:
        loss = batch_loss(m, train, TRAIN_ADV)  # forward inside ...
    loss.backward()                             # ... backward after removal
    assert not hooks._train_gAs and not hooks._train_gBs


def test_zero_advantage_zero_gradient_and_influence(world):
    m, train, val = world
    adv = torch.tensor([1.0, 0.0, -1.0, 0.0, 0.5, 0.0])  # zero rows: with and without padding
    assert train[1][adv == 0].unique().numel() > 1
    tr, va = capture_both(m, train, val, train_adv=adv)
    for k, g in materialised(tr).items():
        assert torch.all(g[adv == 0] == 0), k
        assert (g[adv != 0].flatten(1).abs().amax(1) > 0).all(), k
    for layer, (x, gA, h, gB) in tr.items():
        assert torch.all(gA[adv == 0] == 0) and torch.all(gB[adv == 0] == 0)
    for form in (ghost.ghost_inner_products, materialised_products, None):
        infl = (ghost.compute_ghost_inner_product_matrix(tr, va) if form is None else one_form_matrix(tr, va, form)).sum(1)
        assert torch.all(infl[adv == 0] == 0) and torch.all(infl[adv != 0] != 0), form
    assert not tracin.select_rollouts(infl, tracin.TracInKnobs())[adv == 0].any()


def test_select_rollouts():
    infl = torch.tensor([0.5, -0.1, 0.0, 2.0, -3.0, 0.2, 0.1, -0.2])
    pos = tracin.select_rollouts(infl, tracin.TracInKnobs(selection="positive"))
    assert pos.dtype == torch.bool
    assert pos.tolist() == [True, False, False, True, False, True, True, False]  # 0 is not kept
    assert tracin.select_rollouts(infl, tracin.TracInKnobs()).tolist() == pos.tolist()  # the default
    for n in (6, 8, 14):  # 0.25 n = 1.5, 2, 3.5: rounded, not floored
        torch.manual_seed(n)
        x = torch.randn(n)
        top = tracin.select_rollouts(x, tracin.TracInKnobs(selection="topk", topk_frac=0.25, ranking="dot"))
        k = round(0.25 * n)
        assert int(top.sum()) == k
        assert set(torch.nonzero(top).flatten().tolist()) == set(sorted(range(n), key=lambda i: -x[i])[:k])
    with pytest.raises(AssertionError):  # a programming error: checks/grpo_knobs.py refuses the knob by name
        tracin.TracInKnobs(selection="nope")  # (tests/test_run_safety.py: --tracin_selection=all)


@pytest.mark.parametrize("value", [0.0, 1e-3, -2.0])
def test_topk_keeps_nothing_when_every_influence_is_the_same(value):
    """'topk' with no evidence (every influence equal, as when G = 0 makes them all 0) keeps nothing,
    as 'positive' keeps nothing at 0; one influence apart and it ranks again (here: that one alone)."""
    topk = tracin.TracInKnobs(selection="topk", topk_frac=0.125, ranking="dot")  # k = 1 of 8
    tied = torch.full((8,), value)
    assert not tracin.select_rollouts(tied, topk).any()
    apart = tied.clone()
    apart[5] += 1.0
    assert tracin.select_rollouts(apart, topk).tolist() == [i == 5 for i in range(8)]


def test_layer_filter_restricts_matrix(world):
    m, train, val = world
    tr, va = capture_both(m, train, val)
    g_tr = func_per_sample_grads(m, train, TRAIN_ADV)
    g_va = func_per_sample_grads(m, val, VAL_ADV)
    full = ghost.compute_ghost_inner_product_matrix(tr, va)
    for filt, n_layers in (("h.1.mlp", 2), ("attn", 4), ("c_fc", 2)):
        layers = [k for k in tr if filt in k]
        assert len(layers) == n_layers
        got = ghost.compute_ghost_inner_product_matrix(tr, va, layer_filter=filt)
        separate = sum(ghost.compute_ghost_inner_product_matrix({k: tr[k]}, {k: va[k]}) for k in layers)
        brute = flat(g_tr, lambda n: filt in n) @ flat(g_va, lambda n: filt in n).T
        scale = brute.abs().max().item()
        assert torch.allclose(got, separate, rtol=1e-5, atol=1e-6 * scale), filt
        assert torch.allclose(got, brute, rtol=1e-5, atol=1e-5 * scale), filt
        assert not torch.allclose(got, full, rtol=1e-3), filt
    with pytest.raises(AssertionError, match="layer_filter"):  # the tools refuse it (test_posthoc_*)
        ghost.compute_ghost_inner_product_matrix(tr, va, layer_filter="nothing")


@pytest.mark.parametrize("where", ["train_gA", "val_gB", "train_x"])
def test_nan_in_captured_gradient_gives_a_non_finite_product(world, where):
    """NaN in one captured factor reaches the matrix in both forms (the callers check: the online step is
    skipped, post-hoc attribution stops with a one-line error)."""
    m, train, val = world
    tr, va = capture_both(m, train, val)
    assert torch.isfinite(ghost.compute_ghost_inner_product_matrix(tr, va)).all()
    side, part = where.split("_")
    d = tr if side == "train" else va
    name = sorted(d)[3]
    x, gA, h, gB = (t.clone() for t in d[name])
    {"gA": gA, "gB": gB, "x": x}[part][1, -1, 0] = float("nan")
    d[name] = (x, gA, h, gB)
    for form in (ghost.ghost_inner_products, materialised_products):
        assert not torch.isfinite(one_form_matrix(tr, va, form)).all(), form
    assert not torch.isfinite(ghost.compute_ghost_inner_product_matrix(tr, va)).all()


def test_hooks_need_lora():
    """Programming errors (asserts): tracin=True with lora_dropout > 0 is refused at config time
    (test_knob_edges)."""
    plain = GPT(GPTConfig(block_size=16, vocab_size=10, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(AssertionError, match="LoRA"):
        ghost.GhostHooks(plain)
    with pytest.raises(AssertionError, match="LoRA"):
        with ghost.install_ghost_hooks(plain):
            pass
    apply_lora(plain, r=2, alpha=4, dropout=0.1)  # dropout in training mode: x is not what A saw
    with pytest.raises(AssertionError, match="dropout"):
        ghost.GhostHooks(plain.train())


# ---------------------------------------------------------------------------- post-hoc TracIn
class ByteEnc:
    """Stand-in tokenizer: one token per character code (mod 40) + eot 0, for rollout_batch."""
    eot_token = 0

    def encode(self, s, disallowed_special=None):  # tiktoken's keyword: no special tokens here anyway
        return [1 + ord(c) % 40 for c in s]


def posthoc_setup(tmp_path, m):
    paths, lrs = [], [0.1, 0.05, 0.02]
    torch.manual_seed(5)
    for t, lr in enumerate(lrs):  # three "checkpoints" of a trajectory
        with torch.no_grad():
            for n, p in m.named_parameters():
                if ".lora_" in n:
                    p.add_(torch.randn_like(p) * 0.05)
        sd = {k: v.clone() for k, v in m.state_dict().items() if ".lora_" in k}
        path = str(tmp_path / f"ckpt_{t:06d}.pt")
        save_checkpoint({"lora": sd, "lr": lr}, path)
        paths.append(path)
    train = [{"prompt": p, "completion_tokens": c, "completion_mask": [1] * len(c), "advantage": a}
             for p, c, a in [("ab", [3, 4, 0], 1.0), ("cde", [5, 0], -0.5), ("f", [6, 7, 8, 0], 0.7),
                             ("gh", [9, 9, 0], -1.2)]]
    test = [{"prompt": "xy", "completion_tokens": [3, 7, 0], "completion_mask": [1, 1, 1], "advantage": 1.0}]
    return paths, lrs, train, test


def test_posthoc_rollout_loss_has_the_grpo_loss_gradient(tmp_path):
    """sample_losses writes out -A_i * mean_t log pi(y_t) per sample: its LoRA gradient equals that of
    grpo.grpo_loss at ratio 1 (old = logp.detach()), no KL, 'grpo' aggregation over one sequence each,
    summed over the samples, with a mask that leaves completion tokens out (unequal lengths)."""
    m = make_model()
    _, _, train, _ = posthoc_setup(tmp_path, m)
    train[0]["completion_mask"] = [1, 0, 0]  # only the first token counts in this row
    batch = tracin.rollout_batch(ByteEnc(), train, "cpu")
    params = lora_parameters(m)
    ours = torch.autograd.grad(tracin.sample_losses(m, *batch, 0.7), params)
    idx, pad_left, mask, adv = batch
    logp, _ = completion_logprobs(m, idx, pad_left, mask.size(1), 0.7)
    one_each = Divisors(num_seqs=1, num_tokens=mask.sum().item())  # 'grpo' reads num_seqs
    ref, _ = grpo_loss(logp, logp.detach(), None, adv, mask, LossKnobs(beta=0.0), one_each)
    for a, b in zip(ours, torch.autograd.grad(ref, params)):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-8)
    assert max(a.abs().max() for a in ours) > 1e-4


def test_posthoc_full_equals_loop_over_checkpoints(world, tmp_path):
    m = world[0]
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    enc = ByteEnc()
    full = attribute.find_critical_samples(m, paths, train, test, enc, mode="full", top_k=2, normalize=True,
                                        self_influence=True)
    # reference: plain autograd over checkpoints and samples
    from lora import load_lora_state_dict
    from runs.checkpoint import load_checkpoint
    tb, sb = tracin.rollout_batch(enc, train, "cpu"), tracin.rollout_batch(enc, test, "cpu")
    want = torch.zeros(len(train), dtype=torch.float64)
    for path, lr in zip(paths, lrs):
        load_lora_state_dict(m, load_checkpoint(path)["lora"])
        params = lora_parameters(m)

        def g(b, i):
            loss = tracin.sample_losses(m, *(t[i:i + 1] for t in b))
            return torch.cat([x.flatten() for x in torch.autograd.grad(loss, params)])
        gt = g(sb, 0)
        for i in range(len(train)):
            want[i] += lr * torch.dot(g(tb, i), gt).item()
    got = torch.tensor([e["tracin_score"] for e in full["scores"]], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-10)
    assert full["num_checkpoints"] == 3 and full["mode"] == "full"
    assert [len(e["checkpoint_contributions"]) for e in full["scores"]] == [3] * 4
    assert full["max_influence_score"] == pytest.approx(want.max().item(), rel=1e-4)
    best = int(want.argmax())
    assert full["most_influential_positive"][0]["index"] == best if want[best] > 0 else not full["most_influential_positive"]
    assert all("cosine_score" in e and e["self_influence"] > 0 for e in full["scores"])
    # memory-efficient streams the same checkpoints from disk: same scores
    eff = attribute.find_critical_samples(m, paths, train, test, enc, mode="memory_efficient")
    for other in (eff,):
        assert torch.allclose(torch.tensor([e["tracin_score"] for e in other["scores"]], dtype=torch.float64),
                              want, rtol=1e-4, atol=1e-10)
    simple = attribute.find_critical_samples(m, paths, train, test, enc, mode="simple")
    assert simple["num_checkpoints"] == 1


def test_posthoc_errors(world, tmp_path):
    m = world[0]
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    enc = ByteEnc()
    with pytest.raises(UserError, match="learning rates"):
        attribute.find_critical_samples(m, paths, train, test, enc, learning_rates=[0.1])
    with pytest.raises(UserError, match="no checkpoints"):
        attribute.find_critical_samples(m, [], train, test, enc)
    for tr, te in (([], test), (train, [])):
        with pytest.raises(UserError, match="nothing to attribute over: give at least one checkpoint, one training"):
            attribute.find_critical_samples(m, paths, tr, te, enc)
    with pytest.raises(UserError, match="layer_filter"):
        attribute.find_critical_samples(m, paths, train, test, enc, layer_filter="nothing")


@pytest.mark.parametrize("kw, match", [
    (dict(checkpoints="ckpt_000002.pt"), "checkpoints: give a list"),
    (dict(n_probe=-1), "n_probe must be an integer >= 0, got -1"),
    (dict(n_probe=True), "n_probe must be an integer"),
    (dict(micro_batch=0), "micro_batch must be an integer >= 1"),
    (dict(top_k=-2), "top_k must be an integer >= 0"),
    (dict(temperature=float("nan")), "temperature must be >= 0"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(test=[{"prompt": "x", "completion_tokens": [], "completion_mask": [],
                 "advantage": 1.0}]), r"test_samples\[0\] is not a rollout"),
    (dict(test=[{"prompt": "x"}]), r"test_samples\[0\] is not a rollout"),
    (dict(train=[None]), r"train_samples\[0\] is not a rollout"),
    (dict(train=[{"prompt": "x", "completion_tokens": [3, 10 ** 6], "completion_mask": [1, 1],
                  "advantage": 1.0}]), r"train_samples\[0\] is not a rollout: .*ids below"),
    (dict(train=[{"prompt": "x", "completion_tokens": [3, 4], "completion_mask": [1],
                  "advantage": 1.0}]), r"train_samples\[0\]"),
    (dict(train=[{"prompt": "x", "completion_tokens": [3], "completion_mask": [1],
                  "advantage": float("nan")}]), r"train_samples\[0\]"),
    (dict(learning_rates=[0.1, float("nan"), 0.1]), r"checkpoint .*ckpt_000001.pt: learning rate nan"),
    (dict(learning_rates=["a"] * 3), r"checkpoint .*ckpt_000000.pt: learning rate 'a'"),
    (dict(checkpoint_steps=[1.0, 1.0, float("inf")]), r"ckpt_000002.pt: learning rate .*, steps inf"),
])
def test_posthoc_bad_arguments_are_one_line_errors_before_any_score(world, tmp_path, kw, match):
    """Each wrong argument is refused by name (never a traceback from inside torch, nor a NaN score);
    the model's weights, flag and .grad come back as they were."""
    m = world[0]
    paths, _, train, test = posthoc_setup(tmp_path, m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    args = dict(checkpoints=paths, train=train, test=test)
    args.update({k: kw.pop(k) for k in list(kw) if k in args})
    with pytest.raises(UserError, match=match):
        attribute.find_critical_samples(m, args["checkpoints"], args["train"], args["test"], ByteEnc(),
                                     **kw)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_posthoc_a_checkpoint_that_does_not_fit_is_named(world, tmp_path):
    m = world[0]
    paths, _, train, test = posthoc_setup(tmp_path, m)
    save_checkpoint({"model": {"w": torch.zeros(2)}}, paths[1])  # a base's checkpoint among them
    with pytest.raises(UserError, match=f"checkpoint {re.escape(paths[1])}: LoRA weights do not fit"):
        attribute.find_critical_samples(m, paths, train, test, ByteEnc())


def test_posthoc_cli_errors(tmp_path):
    with pytest.raises(UserError, match="no checkpoints"):
        attribute.main([f"--out_dir={tmp_path}", "--question=hi"])
    save_checkpoint({"lora": {}, "lr": 0.1}, str(tmp_path / "ckpt_000000.pt"))
    with pytest.raises(UserError, match="rollouts"):
        attribute.load_rollouts(str(tmp_path / "rollouts.jsonl"), ByteEnc())


def test_posthoc_memory_efficient_loads_each_checkpoint_once(world, tmp_path, monkeypatch):
    m = world[0]
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    from runs.checkpoint import load_checkpoint as real
    loads = []
    res = attribute.find_critical_samples(m, paths, train, test, ByteEnc(), mode="memory_efficient", micro_batch=2,
                                       load=lambda p: loads.append(p) or real(p))
    assert sorted(loads) == sorted(paths)  # each exactly once, even with several train chunks
    assert [e["checkpoint_contributions"][0] for e in res["scores"]] != [0.0] * len(train)


def test_bf16_autocast_influence_and_update_close_to_float32(world):
    """The CUDA path runs under bf16 autocast; CPU autocast exercises the same dtype mixing (bf16
    activations and gradients in the hook buffers, float32 LoRA weights). Influences and the subset
    update must stay close to the float32 ones (bf16 has 8 mantissa bits: ~1e-2 relative) and the
    .grad written by subset_gradients must be float32 like the weights it belongs to."""
    m, train, val = world
    tr32, va32 = capture_both(m, train, val)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tr16, va16 = capture_both(m, train, val)
    assert any(v[0].dtype == torch.bfloat16 for v in tr16.values())  # autocast really ran in bf16
    inf32 = ghost.compute_ghost_inner_product_matrix(tr32, va32).sum(1)
    inf16 = ghost.compute_ghost_inner_product_matrix(tr16, va16).sum(1)
    assert inf16.dtype == torch.float32
    assert (inf16 - inf32).abs().max() <= 0.05 * inf32.abs().max()
    keep = torch.tensor([True, False, True, True, False, True])
    grads = {}
    for name, cap in (("f32", tr32), ("bf16", tr16)):
        ghost.subset_gradients(m, ghost.per_sample_grads(cap), keep)
        grads[name] = [p.grad.clone() for p in lora_parameters(m)]
        m.zero_grad(set_to_none=True)
    for a, b in zip(grads["f32"], grads["bf16"]):
        assert b.dtype == torch.float32
        assert (a - b).abs().max() <= 0.05 * a.abs().max() + 1e-6


def test_posthoc_n_probe_spreads_over_the_run(world, tmp_path):
    """n_probe=2 of 4 rollouts scores rollouts 0 and 2 (evenly spaced), exactly as scoring that
    sub-list by hand does; not the first two."""
    m = world[0]
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    enc = ByteEnc()
    got = attribute.find_critical_samples(m, paths, train, test, enc, n_probe=2)
    want = attribute.find_critical_samples(m, paths, [train[0], train[2]], test, enc)
    first = attribute.find_critical_samples(m, paths, train[:2], test, enc)
    scores = lambda r: [e["tracin_score"] for e in r["scores"]]
    assert scores(got) == scores(want) and scores(got) != scores(first)


def test_posthoc_unknown_mode_raises_before_work(world, tmp_path, monkeypatch):
    """Checked first: mode='full' would otherwise load (here: fail to find) every checkpoint first."""
    m = world[0]
    _, _, train, test = posthoc_setup(tmp_path, m)
    monkeypatch.setattr(attribute, "rollout_batch", lambda *a: pytest.fail("work started"))
    missing = [str(tmp_path / "missing.pt")]
    with pytest.raises(UserError, match="mode.*'fast'"):
        attribute.find_critical_samples(m, missing, train, test, ByteEnc(), mode="fast")


def autograd_grads(m, paths, samples, temperature=1.0):
    """Reference: per checkpoint, the (n, P) flattened LoRA gradients of each sample's own loss, one
    torch.autograd.grad per sample run alone (batch of 1). Leaves the last checkpoint loaded."""
    batch, out = tracin.rollout_batch(ByteEnc(), samples, "cpu"), []
    for path in paths:
        load_lora_state_dict(m, load_checkpoint(path)["lora"])
        rows = [torch.autograd.grad(tracin.sample_losses(m, *(t[i:i + 1] for t in batch), temperature),
                                    lora_parameters(m)) for i in range(len(samples))]
        out.append(torch.stack([torch.cat([g.flatten() for g in r]) for r in rows]).double())
    return out


def column(res, key):
    return torch.tensor([e[key] for e in res["scores"]], dtype=torch.float64)


def test_posthoc_cosine_and_self_influence_match_autograd(world, tmp_path):
    """cosine_i = sum_t eta_t <g_i, G_t> / (||g_i|| ||G_t||), G_t = sum_j g_test_j (the norm of the
    summed test gradient, not sqrt(sum_j ||g_test_j||^2)); self_i = sum_t eta_t ||g_i||^2."""
    m = world[0]
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    test = test + [{"prompt": "zz", "completion_tokens": [8, 2, 5, 0], "completion_mask": [1] * 4, "advantage": 1.0}]
    tr, te = autograd_grads(m, paths, train), autograd_grads(m, paths, test)
    cos = sum(lr * (g @ G.sum(0)) / (g.norm(dim=1) * G.sum(0).norm()) for lr, g, G in zip(lrs, tr, te))
    self_inf = sum(lr * g.pow(2).sum(1) for lr, g in zip(lrs, tr))
    res = attribute.find_critical_samples(m, paths, train, test, ByteEnc(), normalize=True, self_influence=True)
    assert torch.allclose(column(res, "cosine_score"), cos, rtol=1e-4, atol=1e-8)
    assert torch.allclose(column(res, "self_influence"), self_inf, rtol=1e-4)
    assert (self_inf > 0).all() and cos.abs().min() > 1e-3


def test_posthoc_repeated_test_sample_keeps_the_cosine(world, tmp_path):
    """The same test sample 4 times: the score is 4 times that of once, the cosine the same."""
    m = world[0]
    paths, _, train, test = posthoc_setup(tmp_path, m)
    once, four = (attribute.find_critical_samples(m, paths, train, t, ByteEnc(), normalize=True) for t in (test, test * 4))
    assert torch.allclose(column(four, "tracin_score"), 4 * column(once, "tracin_score"), rtol=1e-5)
    assert torch.allclose(column(four, "cosine_score"), column(once, "cosine_score"), rtol=1e-5)


def autograd_scores(m, paths, train, test):
    """Reference for every key of find_critical_samples' per-sample entries, from one autograd.grad per
    sample and checkpoint, weighted by each checkpoint's stored learning rate."""
    lrs = [float(load_checkpoint(p)["lr"]) for p in paths]
    tr, te = autograd_grads(m, paths, train), autograd_grads(m, paths, test)
    return {"tracin_score": sum(lr * g @ G.sum(0) for lr, g, G in zip(lrs, tr, te)),
            "cosine_score": sum(lr * (g @ G.sum(0)) / (g.norm(dim=1) * G.sum(0).norm()) for lr, g, G in zip(lrs, tr, te)),
            "self_influence": sum(lr * g.pow(2).sum(1) for lr, g in zip(lrs, tr))}


def test_posthoc_hooks_agree_with_autograd_on_every_key(world, tmp_path):
    m = world[0]
    paths, _, train, test = posthoc_setup(tmp_path, m)
    hooks = attribute.find_critical_samples(m, paths, train, test * 2, ByteEnc(), normalize=True, self_influence=True)
    want = autograd_scores(m, paths, train, test * 2)
    for key in ("tracin_score", "cosine_score", "self_influence"):
        assert want[key].abs().min() > 0, key
        assert torch.allclose(column(hooks, key), want[key], rtol=1e-4, atol=1e-10), key


def test_posthoc_scores_ignore_dropout(tmp_path):
    """A base built with dropout=0.5: scores are taken with dropout off, so two calls agree exactly
    and equal those of the same weights built without dropout."""
    noisy, clean = make_model(dropout=0.5).train(), make_model(dropout=0.0)
    assert all(torch.equal(a, b) for a, b in zip(noisy.state_dict().values(), clean.state_dict().values()))
    paths, _, train, test = posthoc_setup(tmp_path, noisy)
    kw = dict(normalize=True, self_influence=True)
    runs = [attribute.find_critical_samples(m, paths, train, test, ByteEnc(), **kw) for m in (noisy, noisy, clean)]
    want = autograd_scores(clean.eval(), paths, train, test)
    for key in ("tracin_score", "cosine_score", "self_influence"):
        assert torch.equal(column(runs[0], key), column(runs[1], key)), key
        assert torch.allclose(column(runs[0], key), column(runs[2], key), rtol=1e-6, atol=1e-12), key
        assert torch.allclose(column(runs[2], key), want[key], rtol=1e-4, atol=1e-10), key


@pytest.mark.parametrize("training", [True, False])
def test_posthoc_leaves_the_model_as_it_was(world, tmp_path, training):
    """The train/eval flag, the LoRA weights loaded before the call (not the last checkpoint's) and
    every parameter's .grad (the very tensor, same values, or None) are restored, also on an error."""
    m = world[0]
    paths, _, train, test = posthoc_setup(tmp_path, m)
    torch.manual_seed(11)
    with torch.no_grad():
        for p in lora_parameters(m):
            p.add_(torch.randn_like(p))  # weights unlike any checkpoint's
    params = list(m.parameters())
    for i, p in enumerate(params):
        p.grad = torch.randn_like(p) if i % 3 == 0 else None
    grads = [(p.grad, None if p.grad is None else p.grad.clone()) for p in params]
    lora = lora_state_dict(m)
    for ckpts in (paths, paths + [str(tmp_path / "missing.pt")]):  # the second fails after 3 checkpoints
        m.train(training)
        try:
            attribute.find_critical_samples(m, ckpts, train, test, ByteEnc(), normalize=True, self_influence=True)
        except UserError as e:
            assert "missing.pt" in str(e) and len(ckpts) == 4
        assert m.training == training and all(mod.training == training for mod in m.modules())
        assert all(torch.equal(v, lora[k]) for k, v in lora_state_dict(m).items())
        for p, (g, snap) in zip(params, grads):
            assert p.grad is g and (snap is None or torch.equal(p.grad, snap))


def test_trapezoid_steps():
    """Checkpoint i at step s_i stands for (s_{i+1} - s_{i-1}) / 2 steps, the ends for half a gap."""
    iters = [0, 25, 50, 75, 100, 110]  # every 25 steps, the last at max_iters = 110
    assert tracin.trapezoid_steps(iters) == [12.5, 25.0, 25.0, 25.0, 17.5, 5.0]
    assert sum(tracin.trapezoid_steps(iters)) == 110
    assert tracin.trapezoid_steps([0, 10]) == [5.0, 5.0]
    assert tracin.trapezoid_steps([40]) == [1.0]


@pytest.mark.parametrize("iters", [[7, 7, 7], [0, 5, 5], [9, 4, 12]])
def test_posthoc_checkpoints_whose_iter_num_repeats_weigh_by_learning_rate_never_zero(world, tmp_path, iters):
    """Checkpoints saved at iterations that repeat (or run backwards: a run restarted into the same
    directory) cannot be placed on one time axis: each weighs k_t = 1 (w_t = eta_t, Captum's TracInCP),
    the same scores as checkpoints that hold no iter_num. The trapezoid would give a repeated one 0."""
    m = world[0]
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    plain = attribute.find_critical_samples(m, paths, train, test, ByteEnc())  # no iter_num: 1 each
    for path, it in zip(paths, iters):
        save_checkpoint({**load_checkpoint(path), "iter_num": it}, path)
    if iters == [7, 7, 7]:
        assert tracin.trapezoid_steps(iters) == [0.0, 0.0, 0.0]  # what the weights must not become
    res = attribute.find_critical_samples(m, paths, train, test, ByteEnc())
    assert res["checkpoint_weights"] == lrs
    assert (column(res, "tracin_score") != 0).all()
    assert column(res, "tracin_score").tolist() == column(plain, "tracin_score").tolist()


class RunsCodeWhenUnpickled:
    """An object whose unpickling calls os.mkdir(path): what a crafted checkpoint could do instead."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.mark.parametrize("mode", ["memory_efficient", "full"])
def test_posthoc_refuses_a_checkpoint_whose_unpickling_would_run_code(world, tmp_path, mode):
    """Paths without load=: read as data (tensors and plain containers), a pickled object refused in one
    line naming it, and its code never run."""
    m = world[0]
    paths, _, train, test = posthoc_setup(tmp_path, m)
    marker = tmp_path / "the_code_ran"
    save_checkpoint({**load_checkpoint(paths[1]), "note": RunsCodeWhenUnpickled(str(marker))}, paths[1])
    torch.load(paths[1], weights_only=False)  # the premise: unpickled, the checkpoint runs its code
    assert marker.is_dir()
    marker.rmdir()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(UserError) as e:
        attribute.find_critical_samples(m, paths, train, test, ByteEnc(), mode=mode)
    want = (rf"checkpoint {re.escape(paths[1])} holds a pickled Python object \(\w+\.mkdir\), not only "
            r"tensors: refused, as loading it could run code")
    assert re.fullmatch(want, str(e.value)), str(e.value)
    assert not marker.exists()
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_posthoc_checkpoint_steps_scale_each_checkpoint(world, tmp_path):
    m = world[0]
    paths, _, train, test = posthoc_setup(tmp_path, m)
    steps = [12.5, 25.0, 5.0]
    kw = dict(normalize=True, self_influence=True)
    plain = attribute.find_critical_samples(m, paths, train, test, ByteEnc(), **kw)
    weighted = attribute.find_critical_samples(m, paths, train, test, ByteEnc(), checkpoint_steps=steps, **kw)
    for p, w in zip(plain["scores"], weighted["scores"]):
        want = [k * c for k, c in zip(steps, p["checkpoint_contributions"])]
        assert w["checkpoint_contributions"] == pytest.approx(want, rel=1e-9)
        assert w["tracin_score"] == pytest.approx(sum(want), rel=1e-9)
    # cosine and self-influence: each checkpoint's term scales by its k_t too (one checkpoint at a time)
    for path, k in zip(paths, steps):
        one, one_k = (attribute.find_critical_samples(m, [path], train, test, ByteEnc(), checkpoint_steps=s, **kw)
                      for s in (None, [k]))
        for key in ("tracin_score", "cosine_score", "self_influence"):
            assert torch.allclose(column(one_k, key), k * column(one, key), rtol=1e-9), key
    simple = attribute.find_critical_samples(m, paths, train, test, ByteEnc(), mode="simple", checkpoint_steps=steps)
    assert column(simple, "tracin_score").tolist() == column(
        attribute.find_critical_samples(m, paths, train, test, ByteEnc(), mode="simple"), "tracin_score").tolist()
    with pytest.raises(UserError, match="3 checkpoints but 2 checkpoint_steps"):
        attribute.find_critical_samples(m, paths, train, test, ByteEnc(), checkpoint_steps=[1, 2])


def test_topk_ranks_by_dot_or_by_cosine():
    """'topk' with ranking 'cosine' ranks by <g_i, G> / ||g_i|| (GradAlign's cosine; ||G|| is the same for
    every row): a long gradient no longer leads because of its length. 'positive' reads the sign alone,
    which the two share."""
    infl = torch.tensor([2.0, 1.0, 0.5, -1.0])
    norms = torch.tensor([10.0, 1.0, 1.0, 0.5])  # cosines (up to ||G||): 0.2, 1.0, 0.5, -2.0
    for ranking, want in (("dot", [0, 1]), ("cosine", [1, 2])):
        knobs = tracin.TracInKnobs(selection="topk", topk_frac=0.5, ranking=ranking)
        assert torch.nonzero(tracin.select_rollouts(infl, knobs, norms)).flatten().tolist() == want
    for ranking in ("dot", "cosine"):
        positive = tracin.TracInKnobs(selection="positive", ranking=ranking)
        assert tracin.select_rollouts(infl, positive, norms).tolist() == [True, True, True, False]


def test_squared_norms_are_the_per_sample_gradients_norms(world):
    """ghost.squared_norms (what 'cosine' divides by, and post-hoc's ||g_i||^2) against the flattened
    per-sample gradients summed by hand."""
    m, train, val = world[:3]
    idx, pl, mask = train
    with ghost.install_ghost_hooks(m) as hooks:
        tracin.sample_losses(m, idx, pl, mask, TRAIN_ADV).backward()
        grads = ghost.per_sample_grads(hooks.collect("train"))
    flat = torch.cat([torch.cat([dA.flatten(1), dBt.flatten(1)], 1) for dA, dBt in grads.values()], 1)
    assert torch.allclose(ghost.squared_norms(grads), (flat ** 2).sum(1), rtol=1e-5)
