# Sampling's two shortcuts against the paths they replace.
# Run: python -m pytest -q tests/test_fast_sampling.py
#
#   one query against the cache (model.CausalSelfAttention, decoding in eval mode): written out instead of
#       SDPA. Reference: the same model in train mode with dropout 0, where decoding goes through
#       F.scaled_dot_product_attention with the same mask; the full uncached forward as well.
#   LoRA folded in for sampling (lora.folded_for_sampling): W' = W + s B A. Reference: the unfolded
#       LoRALinear (three matmuls); the frozen W and the adapter compared bit for bit after many folds.
import pytest
import torch

from conftest import TINY, build_gpt
from lora import apply_lora, disable_lora, folded_for_sampling, lora_parameters
from model import GPT, GPTConfig
from model import GREEDY, generate, uniforms

FAMILIES = {"gpt2": {}, "llama": dict(arch="llama", n_kv_head=1, n_inner=48, rope_theta=500.0, norm_eps=1e-6)}


def decode_logits(model, idx, pad_left, steps):
    """Prefill idx, then feed `steps` given next tokens one column at a time: every step's (B, V) logits."""
    cache = model.new_cache(idx.size(0), idx.size(1) + steps, pad_left)
    out = [model(idx, cache=cache)[0][:, -1]]
    for t in range(steps):
        out.append(model(idx[:, t % idx.size(1), None], cache=cache)[0][:, -1])
    return torch.stack(out, 1)


def family_gpt(family, seed=0, scale=4.0):
    """A tiny GPT of that family, its weight matrices scaled so that attention and logits are peaked."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **FAMILIES[family]}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return model.eval()


def lora_model(family, seed=0, b_std=0.3):
    model = family_gpt(family, seed)
    apply_lora(model, 4, 8, 0.0, ("c_attn", "c_proj", "c_fc", "q_proj", "k_proj", "v_proj", "o_proj",
                                  "gate_proj", "up_proj", "down_proj"))
    with torch.no_grad():
        for p in lora_parameters(model):
            if p.dim() == 2 and p.size(1) == 4:  # lora_B: a trained-looking adapter, not the fresh zeros
                p.normal_(0, b_std)
    return model.eval()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bf16", [False, True])
def test_one_query_attention_equals_sdpa(family, bf16):
    model = family_gpt(family, seed=3)
    if bf16:
        model = model.to(torch.bfloat16)
    idx = torch.randint(1, 50, (3, 7))
    pad_left = torch.tensor([0, 2, 5])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        plain = decode_logits(model.eval(), idx, pad_left, 12).float()
        sdpa = decode_logits(model.train(), idx, pad_left, 12).float()  # dropout 0: the same function
    tol = dict(rtol=2e-2, atol=2e-2) if bf16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain, sdpa, **tol)
    assert plain.abs().max() > 0.1  # the logits are not trivially small


def test_one_query_attention_gives_the_uncached_greedy_tokens():
    """Greedy decoding through the cache (the written-out attention) equals recomputing the whole
    sequence with the fused causal kernel at every step."""
    model = build_gpt(seed=1, emb_scale=10.0, block_scale=3.0).eval()
    prompt = [5, 9, 2, 7]
    idx, _, _ = generate(model, [prompt], 20, eot_id=(), sampling=GREEDY)
    seq = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(20):
            seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
    assert idx[0].tolist() == seq[0].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_folded_lora_gives_the_unfolded_logits_and_tokens(family):
    model = lora_model(family)
    idx = torch.randint(1, 50, (4, 6))
    pad_left = torch.tensor([0, 1, 3, 0])
    with torch.no_grad():
        base = decode_logits(model, idx, pad_left, 8)
        with folded_for_sampling(model):
            folded = decode_logits(model, idx, pad_left, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16), folded_for_sampling(model):
            assert all(m.folded.dtype == torch.bfloat16 for m in model.modules() if hasattr(m, "folded") and
                       m.folded is not None)  # folded in the dtype the matmul runs in: no cast per call
    torch.testing.assert_close(folded, base, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        with disable_lora(model):
            plain = decode_logits(model, idx, pad_left, 8)
    assert (plain - base).abs().max() > 1e-2  # the adapter matters, so folding it in is tested
    prompts = [[3, 4, 5], [6, 7], [8]]
    u = torch.rand(10, 6, generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=10, eot_id=(), num_samples=2, u=u)
    with folded_for_sampling(model):
        got = generate(model, prompts, **kw)
    want = generate(model, prompts, **kw)
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # the same uniforms: the same tokens


def test_folding_never_changes_the_weights_and_ends_with_the_block():
    """W and the adapter are bit for bit what they were after many folds; a gradient is never taken
    through the folded copy (a forward with grad enabled inside the block uses W, A and B)."""
    model = lora_model("gpt2")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(50):
        with folded_for_sampling(model):
            generate(model, [[1, 2, 3]], 4, eot_id=(), u=uniforms(4, 1, 0, "cpu"))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(m.folded is None for m in model.modules() if hasattr(m, "folded"))
    idx = torch.randint(1, 50, (2, 5))
    with folded_for_sampling(model):
        model(idx, keep_last=5)[0].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_parameters(model))
    with pytest.raises(RuntimeError), folded_for_sampling(model):
        raise RuntimeError("an error inside the block")
    assert all(m.folded is None for m in model.modules() if hasattr(m, "folded"))
