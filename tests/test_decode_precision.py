# The one-query decode attention keeps its scores, probabilities and weighted values in float32
# under bf16 autocast, in the model's one-query branch (model.CausalSelfAttention) over the ordinary
# cache and over the static one the compiled decode step reads (scale/compiled.py; the same code,
# called eagerly here). Reference: softmax(q K^T /
# sqrt(hd)) V written out in float64 from the query and from the keys and values the cache holds,
# the result rounded once to bf16. The cache is laid out so that bf16 scores or probabilities are
# far off: every key shares a large component (scores near 100, where bf16 steps by 0.5) and the
# values are large and of both signs (their weighted sum cancels, so a bf16 probability error
# shows).
# Run: python -m pytest -q tests/test_decode_precision.py
import pytest
import torch

from model import CausalSelfAttention, GPTConfig, KVCache, apply_rope, attention_mask, rope_cos_sin
from scale.compiled import StaticKVCache

ARCHS = {"gpt2": dict(arch="gpt2"), "llama-gqa": dict(arch="llama", n_kv_head=2, n_inner=64)}
B, H, C, L = 3, 4, 64, 21  # rows, query heads, width, cache columns (the new one included)
HD = C // H


def setup(arch):
    """(attention module, cache keys, values (B, Hkv, L, hd) bf16, x (B, 1, C), pad_left, rope)."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=64, vocab_size=50, n_layer=1, n_head=H, n_embd=C, **ARCHS[arch])
    attn = CausalSelfAttention(cfg).eval()
    Hkv = attn.n_kv_head
    g = torch.Generator().manual_seed(1)
    shared = torch.randn(1, Hkv, 1, HD, generator=g) * 6.0
    k = (shared + torch.randn(B, Hkv, L, HD, generator=g)).bfloat16()
    v = (torch.randn(B, Hkv, L, HD, generator=g) * 40.0).bfloat16()
    x = torch.randn(B, 1, C, generator=g)
    with torch.no_grad():  # q along the shared key component: large scores, a spread of a few units
        proj = attn.c_attn if hasattr(attn, "c_attn") else attn.q_proj
        q_dir = shared.repeat_interleave(H // Hkv, 1).reshape(C)
        w = torch.outer(q_dir, x.mean((0, 1))) / x.mean((0, 1)).pow(2).sum() * 0.3
        proj.weight[:C] = w + 0.05 * torch.randn(C, C, generator=g)
        if proj.bias is not None:
            proj.bias.zero_()
    pad_left = torch.tensor([0, 3, 7])
    rope = None
    if arch != "gpt2":
        rope = rope_cos_sin((L - 1 - pad_left)[:, None], HD, 10000.0)
    return attn, k, v, x, pad_left, rope


def captured(attn):
    """Hooks keeping the query projection's output and the output projection's input."""
    seen = {}
    proj = attn.c_attn if hasattr(attn, "c_attn") else attn.q_proj
    out = attn.c_proj if hasattr(attn, "c_proj") else attn.o_proj
    hooks = [proj.register_forward_hook(lambda m, i, o: seen.__setitem__("q", o[..., :C])),
             out.register_forward_pre_hook(lambda m, i: seen.__setitem__("y", i[0]))]
    return seen, hooks


def reference(q_proj_out, keys, values, visible, rope):
    """(B, H, 1, hd) in float64: the query as the module forms it, the attention written out."""
    q = q_proj_out.view(B, 1, H, HD).transpose(1, 2)
    if rope is not None:
        q = apply_rope(q, *rope)
    rep = H // keys.size(1)
    keys, values = (t.double().repeat_interleave(rep, 1) for t in (keys, values))
    s = (q.double() @ keys.transpose(-2, -1)) * HD ** -0.5              # (B, H, 1, L)
    s = s.masked_fill(~visible, float("-inf"))
    return s.softmax(-1) @ values


def check(y, ref):
    """y: bf16 (B, 1, C) as the output projection got it; ref: float64 (B, H, 1, hd)."""
    ref = ref.transpose(1, 2).reshape(B, 1, C)
    assert y.dtype == torch.bfloat16
    err = (y.double() - ref).abs()
    # rounding a float32 result to bf16 once: half a step of bf16 (2^-9 relative), float32's error
    assert (err <= ref.abs() * 2 ** -8 + 1e-3).all(), \
        f"max error {err.max():.4f}, |ref| max {ref.abs().max():.1f}"
    assert ref.abs().max() > 1.0


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_model_one_query_attention_is_float32_under_bf16_autocast(arch, static):
    attn, k, v, x, pad_left, rope = setup(arch)
    cache = (StaticKVCache if static else KVCache)((1, *k.shape), pad_left, "cpu", torch.bfloat16)
    cache.k[0][:, :, :L - 1], cache.v[0][:, :, :L - 1] = k[:, :, :-1], v[:, :, :-1]
    cache.pos = torch.tensor([L - 1]) if static else L - 1  # the last column is the new token's
    mask = attention_mask(pad_left, cache.pos, 1, L, x.device)              # (B, 1, 1, L)
    seen, hooks = captured(attn)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        attn(x, mask, cache, 0, rope)
    for h in hooks:
        h.remove()
    ref = reference(seen["q"], cache.k[0], cache.v[0], mask, rope)  # the new column written in
    check(seen["y"], ref)
    assert cache.k[0][:, :, -1].abs().sum() > 0  # it was
