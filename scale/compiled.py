"""
nanoGPT's `compile` knob, for the decode step of sampling (pass 1): one new token for every row against
the KV cache, the step model.generate repeats max_new_tokens times. Off by default (train_grpo.py's
`compile`): on a CPU it pays back only in long runs (docs/performance.md, "The decode step compiled").

Why the model's own forward compiles badly (measured there): the cache is written at `cache.pos`, a Python
int that grows by one every step, and read back up to `pos + 1` columns, a shape that grows by one every
step. A static graph is recompiled at every step (guard `cache.pos == 12`, `== 13`, ...) until the recompile
limit, after which the steps run eager; a dynamic one is 6-9x slower than eager. And a write into the cache
inside the graph copies the whole cache (functionalization of the in-place update), at any shape.
The step here has one shape per call and writes nothing:
  - the new token's column is a 0-d tensor, not an int: an input value, not a constant of the graph;
  - it attends over ALL the cache's columns, a mask hiding the ones not written yet and each row's left
    padding (the softmax gives them weight exactly 0), plus the new column's own key and value beside
    them; it returns the new keys and values and the caller writes that one column, eagerly;
  - the cache's length is rounded up to a multiple of COLUMNS, so prompts of other lengths reuse one
    graph: a run compiles once per (rows, columns bucket, dtype), not once per step.
The result is the eager step's up to float rounding (tests/test_compiled.py). The prefill (the prompt,
once per call) stays eager.

Where it plugs in, in sight: with compile=True train_grpo.setup builds one CompiledDecode and
hands it to every grpo_step as an argument (`decode=`), which passes it down through grpo.make_rollouts
to model.generate; generate calls it for each new column instead of the model's forward. The model
object is never changed; evaluation (runs/evaluate.evaluate) samples eagerly.
"""
import functools
import shutil
import weakref

import torch

from configurator import UserError
from model import one_query_attention, rope_cos_sin

COMPILED = weakref.WeakKeyDictionary()  # model -> {mode: its compiled decode step}
COLUMNS = 16  # the cache length is a multiple of this: one compiled graph serves the prompt lengths of one bucket
TRIED_COMPILERS = {}  # C++ compiler -> its problem, or None where it works: tried once per process


def check_compile(device):
    """A one-line error where torch.compile cannot run the decode step; the mode it runs in otherwise:
    inductor's default on CPU, CUDA graphs on a GPU ('reduce-overhead', measured on an H100).
    On CPU the C++ compiler inductor will call (CXX, else g++) builds a tiny shared library once per
    process first: a compiler that exists but does not work fails here, not inside inductor."""
    import os
    import subprocess
    import sys
    import tempfile
    from scale.device import check_device_name
    check_device_name(device)  # a misspelt device ('cpu0') is blamed as a device, before compile is
    if not hasattr(torch, "compile"):
        raise UserError(f"compile=True needs torch >= 2.0 (torch.compile); this is torch {torch.__version__}: "
                        "upgrade torch or set compile=False")
    if device.startswith("cuda"):
        return "reduce-overhead"
    if device != "cpu":
        raise UserError(f"compile=True runs on 'cpu' or 'cuda', not {device!r}: set compile=False")
    cxx = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")  # as inductor
    fix = "install g++ (or set CXX to a working C++ compiler) or set compile=False"
    if not shutil.which(cxx):
        named = " (from CXX)" if "CXX" in os.environ else ""
        raise UserError(f"compile=True on CPU needs a C++ compiler (inductor builds its kernels "
                        f"with one): {cxx!r}{named} is not on PATH; {fix}")
    tried = TRIED_COMPILERS
    if cxx not in tried:
        with tempfile.TemporaryDirectory() as tmp:
            src, lib = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
            with open(src, "w") as f:
                f.write('extern "C" int probe(int x) { return x + 1; }\n')
            try:
                r = subprocess.run([cxx, "-std=c++17", "-shared", "-fPIC", "-O1", src, "-o", lib],
                                   capture_output=True, text=True, timeout=120)
                lines = (r.stderr or r.stdout).strip().splitlines()
                tried[cxx] = None if r.returncode == 0 and os.path.isfile(lib) else \
                    f"exit status {r.returncode}" + (f": {lines[0][:100]}" if lines else "")
            except (OSError, subprocess.SubprocessError) as e:
                tried[cxx] = f"{type(e).__name__}: {str(e)[:100]}"
    if tried[cxx]:
        raise UserError(f"compile=True on CPU needs a working C++ compiler: {cxx!r} failed to "
                        f"build a one-line C++ file ({tried[cxx]}); {fix}")
    return None


def decode_step(model, tok, k, v, col, pad_left):
    """One new column for every row over the WHOLE cache: tok (N, 1) ids, k, v (n_layer, N, Hkv, L, hd) the
    cache (read, never written here), col a 0-d long tensor: the column the new token takes, pad_left (N,).
    Returns logits (N, 1, V) and the new column's keys and values, (n_layer, N, Hkv, hd) each, for the caller
    to write (a write inside the graph copies the whole cache: functionalization of an in-place update).
    The same arithmetic as GPT.forward with a KVCache and CausalSelfAttention's one-query branch."""
    c, L = model.config, k.size(3)
    cols = torch.arange(L, device=tok.device)                               # (L,)
    pos = (col - pad_left).clamp(min=0)[:, None]                            # (N, 1): position of the new token
    # the cached columns this row's query sees: filled (< col) and not padding (model.attention_mask)
    seen = ((cols < col) & (cols >= pad_left[:, None]))[:, None, None]     # (N, 1, 1, L)
    x, rope, new_k, new_v = model.transformer.wte(tok), None, [], []
    if "wpe" in model.transformer:
        x = x + model.transformer.wpe(pos)
    else:
        rope = rope_cos_sin(pos, c.n_embd // c.n_head, c.rope_theta)
    for i, block in enumerate(model.transformer.h):
        y, ki, vi = attend(block.attn, block.ln_1(x), k[i], v[i], seen, rope)
        x = x + y
        x = x + block.mlp(block.ln_2(x))
        new_k.append(ki), new_v.append(vi)
    return model.lm_head(model.transformer.ln_f(x)), torch.stack(new_k), torch.stack(new_v)


def attend(attn, h, k_cache, v_cache, seen, rope):
    """CausalSelfAttention.forward for one query (eval mode), its own parts: the cached columns `seen`
    plus the new one, through model.one_query_attention. Returns (output (N, 1, C), the new key and
    value (N, Hkv, hd))."""
    q, k, v = attn.project_qkv(h, rope)                                    # (N, H | Hkv, 1, hd)
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)                        # as the cache holds them
    keys, values, kn, vn = attn.shared_kv(k_cache, v_cache, k, v)          # read, not copied
    y = one_query_attention(q, keys, values, seen, kn, vn)                  # (N, H, 1, hd)
    return attn.project_out(y), k[:, :, 0], v[:, :, 0]


def compiled_step(model, mode=None):
    """The model's compiled decode step, made once per model and mode (the graphs live as long as it does).
    fullgraph=True: a graph break is an error, not a silent fall-back to eager Python between graphs;
    dynamic=False: a new (rows, columns) bucket compiles a new static graph instead of a symbolic one."""
    mode = None if mode == "default" else mode  # torch.compile's default mode, by its name or by None
    steps = COMPILED.setdefault(model, {})  # dropped with the model (a deep copy compiles its own)
    if mode not in steps:
        steps[mode] = torch.compile(functools.partial(decode_step, model), mode=mode, fullgraph=True,
                                    dynamic=False)
    return steps[mode]


class CompiledDecode:
    """The decode step that model.generate calls once per new token, compiled:
        generate(model, prompts, ..., decode=CompiledDecode(model, device))  (built by train_grpo.setup)
    The cache generate makes is COLUMNS-rounded (cache_len); each call runs one new column for every row
    through the compiled graph and writes its keys and values into the cache, eagerly. The prefill (the
    prompt, once per call) and every other forward are the model's own."""

    def __init__(self, model, device, mode=None):
        """mode: torch.compile's (None: CUDA graphs on a GPU, inductor's default on a CPU; bench/ passes its --compile)."""
        mode = mode or ("reduce-overhead" if str(device).startswith("cuda") else None)
        self.model, self.mode = model, None if mode == "default" else mode
        self.step = compiled_step(model, self.mode)

    def cache_len(self, n):
        """The cache's columns for n tokens: rounded up to a bucket, so one graph serves many prompt lengths."""
        return min(-(-n // COLUMNS) * COLUMNS, self.model.config.block_size)

    def __call__(self, tok, cache):
        """tok (N, 1) ids -> logits (N, 1, V), as model(tok, cache=cache)[0]; the cache advances one column."""
        col = torch.tensor(cache.pos, device=tok.device)  # a value, not a shape: the graph does not depend on it
        if self.mode == "reduce-overhead":  # CUDA graphs: the last step's logits are used up, may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        logits, k, v = self.step(tok, cache.k, cache.v, col, cache.pad_left)  # (N, 1, V), (n_layer, N, Hkv, hd)
        cache.k[:, :, :, cache.pos], cache.v[:, :, :, cache.pos] = k, v        # eager: one column, no cache copy
        cache.pos += 1
        return logits
