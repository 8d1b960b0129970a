"""bfloat16 against float32 on the same rollouts, as train_grpo runs with dtype='bfloat16': the frozen
base stored in bf16 under bf16 autocast; LoRA weights, their gradients, log-probs, loss and influence
in float32. Independent references: the float32 model on the same inputs; float32 recomputation from
the same hook buffers; the saved-tensor hooks of autograd. Run: python -m pytest -q tests/test_bf16.py"""
import copy

import torch

import ghost
import cfg_calls
import grpo
import tracin
from lora import lora_parameters, merge_lora
from test_influence_summed import NO_KL, as_batch, cfg
from test_tracin import VAL_ADV, VAL_PROMPTS, make_batch, make_model

BF16 = torch.autocast("cpu", dtype=torch.bfloat16)
F32 = torch.autocast("cpu", enabled=False)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16], [17], [18, 19, 20], [21, 22, 23, 24],
           [25, 26]]


def halved(m):
    """A copy with every non-LoRA parameter stored in bf16, as train_grpo's load_frozen_base leaves it."""
    h = copy.deepcopy(m)
    for n, p in h.named_parameters():
        if ".lora_" not in n:
            p.data = p.data.bfloat16()
    return h


def world():
    m = make_model()
    train = make_batch(m, PROMPTS, 4, seed=3, end_early=[(0, 2), (5, 4), (17, 1)])  # 32 rollouts
    adv = torch.randn(32, generator=torch.Generator().manual_seed(5))
    val = make_batch(m, VAL_PROMPTS, 1, seed=4)
    m16 = halved(m)
    return m, m16, train, adv, val


AMP = {"f32": F32, "bf16": BF16}  # the precision each model's passes compute in (grpo's amp=)


def flat_grads(m):
    return torch.cat([p.grad.flatten() for p in lora_parameters(m)])


def ranks(x):
    return x.argsort().argsort().double()


def spearman(a, b):
    return torch.corrcoef(torch.stack([ranks(a), ranks(b)]))[0, 1].item()


def test_grpo_step_in_bf16_is_close_to_float32():
    m32, m16, train, adv, _ = world()
    assert {p.dtype for n, p in m16.named_parameters() if ".lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for p in lora_parameters(m16)} == {torch.float32}
    out = {}
    for name, m in (("f32", m32), ("bf16", m16)):
        c = cfg(8, beta=0.04)
        knobs = cfg_calls.loss_of(c)
        batch = cfg_calls.with_reference(m, as_batch(train, adv), c, knobs, amp=AMP[name])  # pass 3
        stats = cfg_calls.policy_backward(m, batch, c, knobs, amp=AMP[name])  # pass 2
        out[name] = sum(stats["losses"]), flat_grads(m)
        assert all(p.grad.dtype == torch.float32 for p in lora_parameters(m))  # AdamW sees float32
    (l32, g32), (l16, g16) = out["f32"], out["bf16"]
    assert abs(l16 - l32) <= 1e-2 * abs(l32)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) >= 0.99


def test_policy_and_old_logprobs_agree_exactly_in_bf16():
    """Pass 2 (with grad) and the no-grad pass compute float32 log-probs from the same bf16 logits, so
    the ratio of the first update of a generation is exactly 1."""
    _, m16, train, adv, _ = world()
    c = cfg(8)
    old = cfg_calls.old_logprobs(m16, as_batch(train, adv), c, amp=BF16)
    idx, pl, mask = train
    with BF16:
        new, _ = grpo.completion_logprobs(m16, idx, pl, mask.size(1), c["temperature"])
    assert old.dtype == new.dtype == torch.float32 and new.requires_grad
    assert torch.equal(torch.exp(new.detach() - old), torch.ones_like(old))


def test_tracin_step_in_bf16_ranks_and_keeps_as_float32():
    """Influence in bf16 vs float32: Spearman rank correlation >= 0.95; the kept sets (influence > 0)
    agree on at least 90 % of the rollouts (the ones they differ on sit near influence 0)."""
    m32, m16, train, adv, val = world()
    out = {}
    for name, m in (("f32", m32), ("bf16", m16)):
        opt = torch.optim.AdamW(lora_parameters(m), lr=0.1)
        _, infl, keep, _ = cfg_calls.tracin_backward(m, opt, as_batch(train, adv), as_batch(val, VAL_ADV), cfg(8),
                                                  amp=AMP[name])
        assert infl.dtype == torch.float32
        out[name] = infl, keep, flat_grads(m)
    (i32, k32, g32), (i16, k16, g16) = out["f32"], out["bf16"]
    assert spearman(i16, i32) >= 0.95
    assert (k16 == k32).float().mean() >= 0.9 and 0 < int(k32.sum()) < len(k32)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) >= 0.99  # the subset update


def test_bf16_hook_buffers_give_their_float32_recomputation():
    """The hooks keep bf16 activations and gradients (half the memory); the inner products are taken
    in float32 from them: equal to recomputing in float64 from the same buffers."""
    _, m16, train, adv, val = world()
    with ghost.install_ghost_hooks(m16) as hooks:  # policy_backward enters BF16 itself
        cfg_calls.policy_backward(m16, as_batch(train, adv), cfg(8), NO_KL, amp=BF16)
        hooks.split = "val"
        cfg_calls.policy_backward(m16, as_batch(val, VAL_ADV), cfg(8), NO_KL, amp=BF16)
        tr, va = hooks.collect("train"), hooks.collect("val")
    assert all(t.dtype == torch.bfloat16 for v in tr.values() for t in v)
    got = ghost.compute_ghost_inner_product_matrix(tr, va)
    want = sum(torch.einsum("ntp,ntd->npd", g.double(), x.double()).flatten(1)
               @ torch.einsum("ntp,ntd->npd", vg.double(), vx.double()).flatten(1).T
               for n in tr for (x, g, vx, vg) in ((tr[n][0], tr[n][1], va[n][0], va[n][1]),
                                                  (tr[n][2], tr[n][3], va[n][2], va[n][3])))
    assert got.dtype == torch.float32
    assert ((got.double() - want).abs().max() / want.abs().max()) <= 1e-5


def test_selective_log_softmax_on_bf16_logits_saves_no_float32_copy():
    logits = torch.randn(4, 6, 50, dtype=torch.bfloat16, requires_grad=True)
    tokens = torch.randint(0, 50, (4, 6))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logp = grpo.selective_log_softmax(logits, tokens, 0.7)
    assert logp.dtype == torch.float32
    assert not any(t.dtype == torch.float32 and t.numel() >= logits.numel() for t in saved)  # no (N, T, V) float32
    ref = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, tokens[..., None])[..., 0]
    assert torch.allclose(logp, ref, atol=1e-5)


def test_adapter_and_merge_keep_their_dtypes():
    _, m16, _, _, _ = world()
    assert {v.dtype for k, v in m16.state_dict().items() if ".lora_" in k} == {torch.float32}  # what is saved
    merged = merge_lora(copy.deepcopy(m16))
    assert {p.dtype for p in merged.parameters()} == {torch.bfloat16}


def test_a_bf16_run_stores_the_base_in_bf16_and_saves_float32(tiny_setup, tmp_path, chars_reward, capsys,
                                                             monkeypatch):
    """train_grpo.py --dtype=bfloat16 on the CPU: the frozen base in bf16, the adapter, its gradients and
    AdamW's state in float32 (so is every checkpoint); 'auto' names its choice and the reason."""
    from scale import device as device_module
    import train_grpo
    seen = {}
    real_update = grpo.update

    def spy(model, optimizer, *args, **kwargs):
        seen["base"] = {p.dtype for n, p in model.named_parameters() if ".lora_" not in n}
        seen["grads"] = {p.grad.dtype for p in lora_parameters(model) if p.grad is not None}
        return real_update(model, optimizer, *args, **kwargs)
    monkeypatch.setattr(grpo, "update", spy)  # grpo_updates' clip + AdamW
    monkeypatch.setattr(device_module, "bf16_is_fast", lambda device: (True, "a test's CPU"))
    cfg = train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path}/run", "--dtype=auto",
                           "--max_iters=2", "--batch_size=2", "--group_size=4", "--max_new_tokens=8", "--eval_n=4",
                           "--reward_funcs=('chars',)", "--reward_weights=(1.0,)"])
    assert "dtype auto: bfloat16 (a test's CPU)" in capsys.readouterr().out and cfg["dtype"] == "bfloat16"
    assert seen == {"base": {torch.bfloat16}, "grads": {torch.float32}}
    ckpt = torch.load(f"{tmp_path}/run/ckpt.pt", weights_only=True)
    assert {v.dtype for v in ckpt["lora"].values()} == {torch.float32}
    states = [t for s in ckpt["optimizer"]["state"].values() for t in s.values() if t.dim() > 0]
    assert states and {t.dtype for t in states} == {torch.float32}
    assert ckpt["config"]["dtype"] == "bfloat16"  # resumed as it ran
