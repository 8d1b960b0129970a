# Sampling with the adapter switched off (lora.disable_lora) around or inside
# lora.folded_for_sampling: the completions are the base's own. Reference: generate on an
# independent copy of the model whose LoRA weights are all zero (B = 0: the adapter adds nothing),
# with the same uniforms.
# Run: python -m pytest -q tests/test_lora_sampling_base.py
import copy

import pytest
import torch

from conftest import TINY
from lora import apply_lora, disable_lora, folded_for_sampling, lora_modules
from model import GPT, GPTConfig
from model import generate

PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
FAMILIES = {"gpt2": {}, "llama": dict(arch="llama", n_kv_head=1, n_inner=48)}


def trained_looking(family):
    """(model with a LoRA whose B is far from zero, a copy of it with every LoRA weight zeroed)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, **FAMILIES[family]}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)  # peaked logits: the tokens follow the weights, not the uniforms alone
    apply_lora(model, 4, 8, 0.0, ("c_attn", "c_fc", "q_proj", "v_proj", "up_proj"))
    with torch.no_grad():
        for m in lora_modules(model).values():
            m.lora_B.weight.normal_(0, 0.5)
    base = copy.deepcopy(model)
    with torch.no_grad():
        for m in lora_modules(base).values():
            m.lora_A.weight.zero_()
            m.lora_B.weight.zero_()
    return model.eval(), base.eval()


def sample(model, u):
    return generate(model, PROMPTS, 12, eot_id=(), num_samples=2, u=u)


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_inside_disable_lora_is_the_base(family):
    model, base = trained_looking(family)
    u = torch.rand(12, 6, generator=torch.Generator().manual_seed(1))
    want = sample(base, u)
    with folded_for_sampling(model):
        adapted = sample(model, u)
    assert not torch.equal(adapted[0], want[0])  # the adapter changes the tokens: the test can tell
    with disable_lora(model), folded_for_sampling(model):  # off first, then folded (as pass 1)
        off_then_folded = sample(model, u)
    with folded_for_sampling(model), disable_lora(model):  # folded first, then switched off
        folded_then_off = sample(model, u)
    for got in (off_then_folded, folded_then_off):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    with folded_for_sampling(model):  # switched back on: the adapter's tokens again
        again = sample(model, u)
    assert all(torch.equal(a, b) for a, b in zip(again, adapted))


def test_disabled_logits_inside_the_fold_are_the_base_logits():
    model, base = trained_looking("gpt2")
    idx = torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = base(idx, keep_last=6)[0]
        with folded_for_sampling(model), disable_lora(model):
            got = model(idx, keep_last=6)[0]
        with folded_for_sampling(model):
            adapted = model(idx, keep_last=6)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (adapted - want).abs().max() > 1e-2
