# The compiled decode step (scale/compiled.py) on a grouped-query model: 4 query heads share 2
# key/value heads, query head h reading key/value head h // 2 (Qwen2, Llama; with one key/value head
# every pairing is the same, so tests/test_compiled.py's llama layout cannot tell). Reference: the
# eager model's logits at every decode step, through the same KV cache layout (prompts of other
# lengths: left padding).
# Run: python -m pytest -q tests/test_compiled_gqa.py      (one inductor compile: tens of seconds)
import shutil

import pytest
import torch

from conftest import TINY
from model import GPT, GPTConfig
from model import pad_prompts
from scale import compiled

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                                reason="inductor needs a C++ compiler on CPU (CI has g++)")

GQA = dict(arch="llama", n_layer=1, n_head=4, n_kv_head=2, n_inner=48, rope_theta=500.0,
           norm_eps=1e-6)
PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
STEPS = 9


def decode_logits(model, idx, pad_left, decode=None):
    """Prefill idx, then feed STEPS given tokens one column at a time, through the model's forward or
    `decode` (the compiled step): each step's (B, V) logits."""
    n = idx.size(1) + STEPS
    cache = model.new_cache(idx.size(0), n, pad_left)
    out = [model(idx, cache=cache)[0][:, -1]]
    cache = decode.static_cache(cache) if decode else cache
    step = decode or (lambda tok, c: model(tok, cache=c)[0])
    for t in range(STEPS):
        out.append(step(idx[:, t % idx.size(1), None], cache)[:, -1])
    return torch.stack(out, 1)  # (B, 1 + STEPS, V)


def test_compiled_grouped_query_decode_equals_eager():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, **GQA}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)  # peaked attention: a key/value head given to the wrong queries shows
        for blk in model.transformer.h:  # the two key/value heads far apart
            blk.attn.k_proj.weight[8:].mul_(-1.0)
            blk.attn.v_proj.weight[8:].mul_(-3.0)
    model.eval()
    idx, pad_left = pad_prompts(PROMPTS, 0, "cpu")
    with torch.no_grad():
        eager = decode_logits(model, idx, pad_left)
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            fast = decode_logits(model, idx, pad_left, compiled.CompiledDecode(model, "cpu"))
    assert compiled.COMPILED.get(model)  # the decode steps went through the compiled graph
    torch.testing.assert_close(fast, eager, rtol=1e-4, atol=1e-4)
    assert eager[:, 1:].std() > 0.2  # the logits are not flat
    torch._dynamo.reset()
