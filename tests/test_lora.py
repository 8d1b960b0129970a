# Tests for lora.py (LoRALinear, apply_lora, disable_lora, merge_lora, LoRA-only state dicts).
# Hermetic: tiny random GPTs on CPU.
# Run with: python -m pytest tests/test_lora.py -q
#
# Independent references used:
#   - a deepcopy of the model taken before apply_lora (the untouched base model): a fresh adapter
#     and disable_lora must reproduce its logits exactly (torch.equal);
#   - LoRALinear's output written out by hand: x @ W.T + b + (alpha / r) * x @ A.T @ B.T;
#   - merge_lora: the unmerged adapted model's logits (allclose) and the base model's module
#     structure/state-dict keys;
#   - gradients: which tensors autograd fills after one backward (requires_grad / .grad);
#   - targets: names counted from model.named_modules() by hand;
#   - state dicts: the logits of the model the adapter was saved from.
import copy
import re

import pytest
import torch
import torch.nn as nn

from configurator import UserError
from lora import (
    LoRALinear,
    apply_lora,
    disable_lora,
    load_lora_state_dict,
    lora_modules,
    lora_parameters,
    lora_state_dict,
    merge_lora,
)
from runs.checkpoint import load_adapter
from runs.loading import check_lora

DEFAULT_TARGETS = ("c_attn", "c_proj", "c_fc")


def idx_batch(seed=0, B=2, T=10, V=50):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def logits(model, idx):
    return model(idx, keep_last=idx.size(1))[0]


@torch.no_grad()
def perturb_lora(model, seed=0, std=0.1):
    """Make every adapter non-zero (lora_B starts at 0)."""
    g = torch.Generator().manual_seed(seed)
    for m in lora_modules(model).values():
        m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g) * std)


# ------------------------------------------------------------------------------------------
# a fresh adapter is a no-op; a perturbed one is not; disable_lora gives the base model back

@pytest.mark.parametrize("bias", [False, True])
def test_fresh_adapter_changes_nothing(make_gpt, bias):
    model = make_gpt(seed=0, bias=bias)
    base = copy.deepcopy(model)
    names = apply_lora(model, r=4, alpha=8)
    assert len(names) == 4 * model.config.n_layer
    idx = idx_batch()
    assert torch.equal(logits(model, idx), logits(base, idx))


def test_perturbed_adapter_and_disable_lora(tiny_gpt):
    base = copy.deepcopy(tiny_gpt)
    apply_lora(tiny_gpt, r=4, alpha=8)
    perturb_lora(tiny_gpt)
    idx = idx_batch()
    ref = logits(base, idx)
    adapted = logits(tiny_gpt, idx)
    assert not torch.allclose(adapted, ref, atol=1e-4)
    with disable_lora(tiny_gpt) as m:
        assert m is tiny_gpt
        assert torch.equal(logits(tiny_gpt, idx), ref)
    again = logits(tiny_gpt, idx)
    assert torch.equal(again, adapted)
    assert not torch.allclose(again, ref, atol=1e-4)


def test_disable_lora_restores_state_on_error_and_when_nested(tiny_gpt):
    apply_lora(tiny_gpt, r=2)
    perturb_lora(tiny_gpt)
    idx = idx_batch()
    adapted = logits(tiny_gpt, idx)
    with pytest.raises(RuntimeError):
        with disable_lora(tiny_gpt):
            raise RuntimeError("boom")
    assert all(not m.disabled for m in lora_modules(tiny_gpt).values())
    assert torch.equal(logits(tiny_gpt, idx), adapted)
    with disable_lora(tiny_gpt):
        base_out = logits(tiny_gpt, idx)
        with disable_lora(tiny_gpt):
            pass
        # leaving the inner context must not re-enable the adapters of the outer one
        assert all(m.disabled for m in lora_modules(tiny_gpt).values())
        assert torch.equal(logits(tiny_gpt, idx), base_out)
    assert all(not m.disabled for m in lora_modules(tiny_gpt).values())


# ------------------------------------------------------------------------------------------
# merge_lora

@pytest.mark.parametrize("targets", [DEFAULT_TARGETS, ("c_attn",), ("c_fc",)])
def test_merge_lora_matches_unmerged(tiny_gpt, targets):
    base_keys = set(tiny_gpt.state_dict())
    apply_lora(tiny_gpt, r=4, alpha=8, targets=targets)
    perturb_lora(tiny_gpt)
    idx = idx_batch()
    adapted = logits(tiny_gpt, idx)
    out = merge_lora(tiny_gpt)
    assert out is tiny_gpt
    assert not any(isinstance(m, LoRALinear) for m in tiny_gpt.modules())
    assert set(tiny_gpt.state_dict()) == base_keys            # the base model's structure again
    torch.testing.assert_close(logits(tiny_gpt, idx), adapted, atol=1e-5, rtol=0)


def test_merge_lora_on_tied_lm_head_matches_unmerged(tiny_gpt):
    apply_lora(tiny_gpt, r=4, alpha=8, targets=("lm_head",))
    perturb_lora(tiny_gpt, std=0.5)
    idx = idx_batch()
    adapted = logits(tiny_gpt, idx)
    merge_lora(tiny_gpt)
    torch.testing.assert_close(logits(tiny_gpt, idx), adapted, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------
# only LoRA parameters train

def test_only_lora_parameters_get_gradients(tiny_gpt):
    names = apply_lora(tiny_gpt, r=4, alpha=8)
    perturb_lora(tiny_gpt)          # lora_A's gradient is B^T (...): zero while B == 0
    tiny_gpt.train()
    idx = idx_batch()
    _, loss = tiny_gpt(idx, targets=torch.roll(idx, -1, dims=1))
    loss.backward()
    lora_params = {n: p for n, p in tiny_gpt.named_parameters() if ".lora_" in n}
    assert len(lora_params) == 2 * len(names)
    assert {id(p) for p in lora_parameters(tiny_gpt)} == {id(p) for p in lora_params.values()}
    for n, p in tiny_gpt.named_parameters():
        if n in lora_params:
            assert p.requires_grad, n
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert not p.requires_grad, n
            assert p.grad is None, n


# ------------------------------------------------------------------------------------------
# LoRALinear's formula

@pytest.mark.parametrize("r, alpha", [(4, 8), (2, 1), (1, 16)])
@pytest.mark.parametrize("bias", [False, True])
def test_lora_linear_output_by_hand(r, alpha, bias):
    torch.manual_seed(0)
    base = nn.Linear(8, 6, bias=bias)
    layer = LoRALinear(base, r=r, alpha=alpha)
    assert layer.scaling == alpha / r
    assert layer.lora_A.weight.shape == (r, 8) and layer.lora_B.weight.shape == (6, r)
    assert torch.count_nonzero(layer.lora_B.weight) == 0
    with torch.no_grad():
        layer.lora_B.weight.normal_()
    x = torch.randn(3, 5, 8)
    W, A, B = base.weight.detach(), layer.lora_A.weight.detach(), layer.lora_B.weight.detach()
    expected = x @ W.T + (alpha / r) * (x @ A.T @ B.T)
    if bias:
        expected = expected + base.bias.detach()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# targets and rank checks

def test_targets_c_attn_wraps_one_module_per_layer(make_gpt):
    for n_layer in (2, 3):
        model = make_gpt(n_layer=n_layer)
        names = apply_lora(model, r=2, targets=("c_attn",))
        assert names == [f"transformer.h.{i}.attn.c_attn" for i in range(n_layer)]
        assert len(lora_modules(model)) == n_layer
        for i in range(n_layer):
            assert isinstance(model.transformer.h[i].attn.c_attn, LoRALinear)
            assert isinstance(model.transformer.h[i].attn.c_proj, nn.Linear)


def test_targets_string_regex_and_default(make_gpt):
    model = make_gpt()
    assert apply_lora(model, r=2, targets="c_fc") == ["transformer.h.0.mlp.c_fc", "transformer.h.1.mlp.c_fc"]
    model = make_gpt()
    names = apply_lora(model, r=2, targets=(r"transformer\.h\.0\..*",))
    assert sorted(names) == sorted(["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj",
                                    "transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj"])
    model = make_gpt()
    expected = [n for n, m in model.named_modules()
                if isinstance(m, nn.Linear) and n.split(".")[-1] in DEFAULT_TARGETS]
    assert apply_lora(model, r=2) == expected
    assert len(expected) == 4 * model.config.n_layer
    assert not isinstance(model.lm_head, LoRALinear)


def test_targets_matching_nothing_are_refused_before_apply_lora(tiny_gpt):
    """runs/loading.check_lora refuses them in one line (train_grpo.py, load_policy, bench/predict call
    it first); apply_lora itself trusts its arguments (an assert)."""
    with pytest.raises(AssertionError):
        apply_lora(tiny_gpt, r=4, targets=("q_proj", "v_proj"))
    with pytest.raises(UserError) as excinfo:
        check_lora(tiny_gpt, 4, ("q_proj", "v_proj"))
    msg = str(excinfo.value)
    assert msg.startswith("LoRA targets ['q_proj', 'v_proj'] match no nn.Linear in the model (its linear layers: ")
    for layer in ("c_attn", "c_proj", "c_fc", "lm_head"):   # it names the model's linear layers
        assert layer in msg
    assert "q_proj" in msg
    assert not lora_modules(tiny_gpt)                              # the model is untouched
    assert all(p.requires_grad for p in tiny_gpt.parameters())


@pytest.mark.parametrize("r", [0, -1])
def test_bad_rank_is_a_programming_error(tiny_gpt, r):
    """lora_r is refused at config time (checks/grpo_knobs.validate)."""
    with pytest.raises(AssertionError, match="rank"):
        apply_lora(tiny_gpt, r=r)
    assert not lora_modules(tiny_gpt)
    assert all(p.requires_grad for p in tiny_gpt.parameters())


# ------------------------------------------------------------------------------------------
# LoRA-only state dicts

def test_lora_state_dict_only_lora_keys(tiny_gpt):
    names = apply_lora(tiny_gpt, r=4)
    sd = lora_state_dict(tiny_gpt)
    assert len(sd) == 2 * len(names)
    assert all(".lora_A." in k or ".lora_B." in k for k in sd)
    assert set(sd) == {f"{n}.lora_{ab}.weight" for n in names for ab in "AB"}
    # a copy, not a view of the live weights
    key = next(k for k in sd if ".lora_B." in k)
    sd[key].fill_(1.0)
    assert torch.count_nonzero(tiny_gpt.get_parameter(key)) == 0


def test_load_lora_state_dict_round_trip(make_gpt):
    src = make_gpt(seed=0)
    apply_lora(src, r=4, alpha=8, targets=("c_attn", "c_fc"))
    perturb_lora(src)
    sd = lora_state_dict(src)
    dst = make_gpt(seed=0)                        # same base weights, fresh adapter
    apply_lora(dst, r=4, alpha=8, targets=("c_attn", "c_fc"))
    idx = idx_batch()
    assert not torch.allclose(logits(dst, idx), logits(src, idx), atol=1e-4)
    load_lora_state_dict(dst, sd)
    assert torch.equal(logits(dst, idx), logits(src, idx))
    for k, v in lora_state_dict(dst).items():
        assert torch.equal(v, sd[k])


def test_load_lora_state_dict_other_rank_raises(make_gpt):
    src = make_gpt()
    apply_lora(src, r=4)
    dst = make_gpt()
    apply_lora(dst, r=8)
    with pytest.raises(AssertionError):
        load_lora_state_dict(dst, lora_state_dict(src))
    key = "transformer.h.0.attn.c_attn.lora_A.weight"  # a checkpoint's adapter enters at load_adapter
    with pytest.raises(UserError, match=re.escape(f"LoRA weight {key} has shape (4, 32), model expects (8, 32) "
                                                  "(another lora_r, or a base of another shape?)")):
        load_adapter(dst, lora_state_dict(src))


@pytest.mark.parametrize("src_targets, dst_targets", [
    (("c_attn",), DEFAULT_TARGETS),      # missing keys
    (DEFAULT_TARGETS, ("c_attn",)),      # unexpected keys
    (("c_fc",), ("c_attn",)),            # both
])
def test_load_lora_state_dict_other_targets_raises(make_gpt, src_targets, dst_targets):
    src = make_gpt()
    apply_lora(src, r=4, targets=src_targets)
    dst = make_gpt()
    apply_lora(dst, r=4, targets=dst_targets)
    before = lora_state_dict(dst)
    with pytest.raises(AssertionError):
        load_lora_state_dict(dst, lora_state_dict(src))
    with pytest.raises(UserError, match=r"^LoRA weights do not fit this model: missing \[.*\], unexpected \[.*\] "
                                        r"\(were they saved with other lora_targets\?\)$"):
        load_adapter(dst, lora_state_dict(src))
    after = lora_state_dict(dst)
    assert all(torch.equal(before[k], after[k]) for k in before)   # nothing half-loaded
