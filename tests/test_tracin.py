# Tests for tracin.py. Run: python -m pytest tests/test_tracin.py -q
# References: torch.func per-sample gradients (functional_call + grad, each sample alone) for
# the hooks; brute-force flattened gradient dot products for the ghost / materialised matrices;
# a second backward over the selected rows alone for subset_gradients; a plain autograd loop
# over checkpoints and samples for post-hoc TracIn.

import pytest
import torch
from torch.func import functional_call, grad

import tracin
from configurator import UserError
from lora import apply_lora, lora_parameters
from model import GPT, GPTConfig, save_checkpoint
from sample import generate
from train_grpo import completion_logprobs, grpo_loss

N_LAYER = 2


@pytest.fixture
def setup():
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=64, vocab_size=50, n_layer=N_LAYER, n_head=2, n_embd=32))
    apply_lora(m, r=4, alpha=8, targets=("c_attn", "c_proj", "c_fc"))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    # prompts of different lengths -> left padding; eot=0 ends some rows early -> right padding
    idx, pl, mask = generate(m, [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11]], 8, eot_id=0, num_samples=2,
                             temperature=1.5, seed=3)
    P = idx.size(1) - mask.size(1)
    for r, k in [(0, 2), (3, 4)]:  # rows 0 and 3 end early: eot at step k, padding after
        idx[r, P + k:] = 0
        mask[r] = (torch.arange(mask.size(1)) <= k).long()
    m.train()
    return m, (idx, pl, mask)


def batch_loss(m, idx, pl, mask, adv, N, beta=0.0, ref=None):
    logp, _ = completion_logprobs(m, idx, pl, mask.size(1), 1.0)
    return grpo_loss(logp, logp.detach(), ref, adv, mask, beta, num_seqs=N)[0]


def capture(m, data, adv, split="train", hooks=None):
    idx, pl, mask = data
    own = hooks is None
    hooks = hooks or tracin.GhostHooks(m)
    hooks.split = split
    batch_loss(m, idx, pl, mask, adv, idx.size(0)).backward()
    out = hooks.collect(split)
    m.zero_grad(set_to_none=True)
    if own:
        hooks.remove()
    return out


def func_per_sample_grads(m, data, adv):
    """{param name: (n, *shape)} per-sample LoRA gradients with torch.func, each sample alone."""
    idx, pl, mask = data
    N = idx.size(0)
    params = {n: p.detach() for n, p in m.named_parameters() if ".lora_" in n}

    def loss_one(p, i):
        logp, _ = functional_call(m, p, (idx[i:i + 1, :-1],), {"pad_left": pl[i:i + 1], "keep_last": mask.size(1)})
        from train_grpo import selective_log_softmax
        lp = selective_log_softmax(logp, idx[i:i + 1, -mask.size(1):])
        return grpo_loss(lp, lp.detach(), None, adv[i:i + 1], mask[i:i + 1], 0.0, num_seqs=N)[0]
    grads = [grad(loss_one)(params, i) for i in range(N)]
    return {n: torch.stack([g[n] for g in grads]) for n in params}


def materialised(captured):
    """{param name: (n, *shape)} from the hook buffers."""
    out = {}
    for layer, (x, gA, h, gB) in captured.items():
        out[f"{layer}.lora_A.weight"] = tracin.per_sample_grad(x, gA)
        out[f"{layer}.lora_B.weight"] = tracin.per_sample_grad(h, gB)
    return out


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_hooks_match_torch_func(setup):
    m, data = setup
    N = data[0].size(0)
    assert (data[1] > 0).any() and (data[2] == 0).any()  # left padding and ended rows are present
    adv = torch.linspace(-1.5, 2.0, N)
    ref = func_per_sample_grads(m, data, adv)
    got = materialised(capture(m, data, adv))
    assert set(got) == set(ref) and len(got) == 2 * 4 * N_LAYER  # A and B of c_attn, attn.c_proj, c_fc, mlp.c_proj
    for k in ref:
        assert rel_err(got[k], ref[k]) <= 1e-5, k
        assert ref[k].abs().max() > 0


def test_val_split_and_beta(setup):
    m, data = setup
    idx, pl, mask = data
    N = idx.size(0)
    from lora import disable_lora
    with torch.no_grad(), disable_lora(m):
        ref_logp, _ = completion_logprobs(m, idx, pl, mask.size(1), 1.0)
    with tracin.install_ghost_hooks(m) as hooks:
        batch_loss(m, idx, pl, mask, torch.ones(N), N, beta=0.1, ref=ref_logp).backward()
        train_before = {k: [t.clone() for t in v] for k, v in hooks._train_gAs.items()}
        hooks.split = "val"
        batch_loss(m, idx[:3], pl[:3], mask[:3], -torch.ones(3), 3).backward()
        assert hooks._xs and hooks._hs and hooks._gAs and hooks._gBs
        assert all(len(v) == 1 and v[0].size(0) == 3 for v in hooks._gAs.values())
        for k, v in hooks._train_gAs.items():
            assert len(v) == 1 and torch.equal(v[0], train_before[k][0])
        assert all(v[0].size(0) == N for v in hooks._train_xs.values())


def test_ghost_equals_materialised_equals_bruteforce(setup):
    m, data = setup
    N = data[0].size(0)
    adv = torch.linspace(-1.0, 1.0, N) + 0.1
    tr = capture(m, data, adv)
    val_data = tuple(t[:3] for t in data)
    va = capture(m, val_data, torch.tensor([1.0, -0.5, 0.7]))
    ghost = tracin.compute_ghost_inner_product_matrix(tr, va, method="ghost")
    mat = tracin.compute_ghost_inner_product_matrix(tr, va, method="materialise")
    auto = tracin.compute_ghost_inner_product_matrix(tr, va)
    g_tr = torch.cat([v.flatten(1) for v in func_per_sample_grads(m, data, adv).values()], 1)
    g_va = torch.cat([v.flatten(1) for v in func_per_sample_grads(m, val_data, torch.tensor([1.0, -0.5, 0.7])).values()], 1)
    brute = g_tr @ g_va.T
    assert ghost.shape == (N, 3)
    for x in (ghost, mat, auto):
        assert torch.allclose(x, brute, rtol=1e-4, atol=1e-7 * brute.abs().max().item())
    # validation GRADIENTS summed: influence = <g_i, sum_j g_val_j>
    assert torch.allclose(ghost.sum(1), g_tr @ g_va.sum(0), rtol=1e-4, atol=1e-9)
    # summing validation ACTIVATIONS first (GhostSuite issue #8) gives something else
    wrong = 0
    for layer, (x, gA, h, gB) in tr.items():
        vx, vgA, vh, vgB = va[layer]
        wrong = wrong + tracin.ghost_inner_products(x, gA, vx.sum(0, keepdim=True), vgA.sum(0, keepdim=True))[:, 0]
        wrong = wrong + tracin.ghost_inner_products(h, gB, vh.sum(0, keepdim=True), vgB.sum(0, keepdim=True))[:, 0]
    assert (wrong - ghost.sum(1)).abs().max() > 0.1 * ghost.sum(1).abs().max()


def test_subset_gradients_equal_backward_on_subset(setup):
    m, data = setup
    idx, pl, mask = data
    N = idx.size(0)
    adv = torch.linspace(-1.0, 1.0, N) + 0.05
    keep = torch.tensor([True, False, True, True, False, False])
    opt = torch.optim.SGD(lora_parameters(m), lr=0.1)
    with tracin.install_ghost_hooks(m) as hooks, tracin.ghost_mode(opt):
        batch_loss(m, idx, pl, mask, adv, N).backward()
        captured = hooks.collect("train")
    tracin.subset_gradients(m, captured, keep)
    got = {n: p.grad.clone() for n, p in m.named_parameters() if ".lora_" in n}
    m.zero_grad(set_to_none=True)
    batch_loss(m, idx[keep], pl[keep], mask[keep], adv[keep], N).backward()  # second path: subset alone
    for n, p in m.named_parameters():
        if ".lora_" in n:
            assert torch.allclose(got[n], p.grad, rtol=1e-5, atol=1e-8), n


def test_ghost_mode_blocks_updates_and_restores_grads(setup):
    m, data = setup
    idx, pl, mask = data
    params = lora_parameters(m)
    opt = torch.optim.SGD(params, lr=1.0)
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, 3.0)  # accumulated gradients from earlier micro-batches
    with tracin.ghost_mode(opt):
        batch_loss(m, idx, pl, mask, torch.ones(idx.size(0)), idx.size(0)).backward()
        with pytest.raises(RuntimeError, match="ghost_mode"):
            opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert all(torch.equal(p.grad, torch.full_like(p, 3.0)) for p in params)
    opt.step()  # works again outside
    assert not all(torch.equal(p, b) for p, b in zip(params, before))


def test_hooks_removed_leave_model_unchanged(setup):
    m, data = setup
    idx, pl, mask = data
    with torch.no_grad():
        out0, _ = m(idx, pad_left=pl, keep_last=5)
    with tracin.install_ghost_hooks(m) as hooks:
        batch_loss(m, idx, pl, mask, torch.ones(idx.size(0)), idx.size(0)).backward()
    assert not hooks._train_xs  # cleared on removal
    for mod in m.modules():
        assert not mod._forward_hooks
    batch_loss(m, idx, pl, mask, torch.ones(idx.size(0)), idx.size(0)).backward()
    assert not hooks._train_xs and not hooks._train_gAs
    with torch.no_grad():
        out1, _ = m(idx, pad_left=pl, keep_last=5)
    assert torch.equal(out0, out1)


def test_zero_advantage_zero_gradient_and_influence(setup):
    m, data = setup
    adv = torch.tensor([1.0, 0.0, -1.0, 0.0, 0.5, 0.0])
    tr = capture(m, data, adv)
    va = capture(m, tuple(t[:2] for t in data), torch.tensor([1.0, -1.0]))
    for g in materialised(tr).values():
        assert torch.all(g[adv == 0] == 0)
    infl = tracin.compute_ghost_inner_product_matrix(tr, va).sum(1)
    assert torch.all(infl[adv == 0] == 0) and torch.all(infl[adv != 0] != 0)
    assert not tracin.select_rollouts(infl)[adv == 0].any()


def test_select_rollouts():
    infl = torch.tensor([0.5, -0.1, 0.0, 2.0, -3.0, 0.2, 0.1, -0.2])
    assert tracin.select_rollouts(infl).tolist() == [True, False, False, True, False, True, True, False]
    top = tracin.select_rollouts(infl, "topk", 0.25)
    assert top.sum() == 2 and top[3] and top[0]
    with pytest.raises(UserError):
        tracin.select_rollouts(infl, "nope")


def test_layer_filter_and_nan(setup):
    m, data = setup
    adv = torch.linspace(-1, 1, data[0].size(0)) + 0.1
    tr = capture(m, data, adv)
    va = capture(m, tuple(t[:2] for t in data), torch.tensor([1.0, -1.0]))
    only = tracin.compute_ghost_inner_product_matrix(tr, va, layer_filter="h.1.mlp")
    sub = {k: v for k, v in tr.items() if "h.1.mlp" in k}
    assert len(sub) == 2  # c_fc and c_proj of block 1's MLP
    assert torch.allclose(only, tracin.compute_ghost_inner_product_matrix(sub, va))
    assert not torch.allclose(only, tracin.compute_ghost_inner_product_matrix(tr, va))
    with pytest.raises(UserError, match="layer_filter"):
        tracin.compute_ghost_inner_product_matrix(tr, va, layer_filter="nothing")
    name = next(iter(tr))
    x, gA, h, gB = tr[name]
    gA = gA.clone(); gA[0, -1, 0] = float("nan")
    tr[name] = (x, gA, h, gB)
    with pytest.raises(FloatingPointError):
        tracin.compute_ghost_inner_product_matrix(tr, va)


def test_hooks_need_lora():
    with pytest.raises(UserError, match="LoRA"):
        tracin.GhostHooks(GPT(GPTConfig(block_size=16, vocab_size=10, n_layer=1, n_head=1, n_embd=8)))


# ---------------------------------------------------------------------------- post-hoc TracIn
class ByteEnc:
    """Stand-in tokenizer: one token per character code (mod 40) + eot 0, for rollout_batch."""
    eot_token = 0

    def encode(self, s):
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


def test_posthoc_full_equals_loop_over_checkpoints(setup, tmp_path):
    m, _ = setup
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    enc = ByteEnc()
    full = tracin.find_critical_samples(m, paths, train, test, enc, mode="full", top_k=2, normalize=True,
                                        self_influence=True)
    # reference: plain autograd over checkpoints and samples
    from lora import load_lora_state_dict
    from model import load_checkpoint
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
    assert full["most_helpful"][0]["index"] == best if want[best] > 0 else not full["most_helpful"]
    assert all("cosine_score" in e and e["self_influence"] > 0 for e in full["scores"])
    # memory-efficient streams the same checkpoints from disk: same scores; loop path too
    eff = tracin.find_critical_samples(m, paths, train, test, enc, mode="memory_efficient")
    loop = tracin.find_critical_samples(m, paths, train, test, enc, mode="memory_efficient", gradient_method="loop")
    for other in (eff, loop):
        assert torch.allclose(torch.tensor([e["tracin_score"] for e in other["scores"]], dtype=torch.float64),
                              want, rtol=1e-4, atol=1e-10)
    simple = tracin.find_critical_samples(m, paths, train, test, enc, mode="simple")
    assert simple["num_checkpoints"] == 1


def test_posthoc_errors(setup, tmp_path):
    m, _ = setup
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    enc = ByteEnc()
    with pytest.raises(UserError, match="learning rates"):
        tracin.find_critical_samples(m, paths, train, test, enc, learning_rates=[0.1])
    with pytest.raises(UserError, match="no checkpoints"):
        tracin.find_critical_samples(m, [], train, test, enc)
    with pytest.raises(UserError, match="layer_filter"):
        tracin.find_critical_samples(m, paths, train, test, enc, layer_filter="nothing")


def test_cli_errors(tmp_path):
    with pytest.raises(UserError, match="no checkpoints"):
        tracin.main([f"--out_dir={tmp_path}", "--question=hi"])


def test_memory_efficient_loads_each_checkpoint_once(setup, tmp_path, monkeypatch):
    m, _ = setup
    paths, lrs, train, test = posthoc_setup(tmp_path, m)
    import model
    loads = []
    real = model.load_checkpoint
    monkeypatch.setattr(model, "load_checkpoint", lambda p, *a, **k: loads.append(p) or real(p, *a, **k))
    res = tracin.find_critical_samples(m, paths, train, test, ByteEnc(), mode="memory_efficient", micro_batch=2)
    assert sorted(loads) == sorted(paths)  # each exactly once, even with several train chunks
    assert [e["checkpoint_contributions"][0] for e in res["scores"]] != [0.0] * len(train)


def test_cli_needs_rollouts(tmp_path):
    save_checkpoint({"lora": {}, "lr": 0.1}, str(tmp_path / "ckpt_000000.pt"))
    with pytest.raises(UserError, match="rollouts"):
        tracin.load_rollouts(str(tmp_path / "rollouts.jsonl"), ByteEnc())
