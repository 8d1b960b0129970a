"""
nanoGPT's `compile` knob, for the decode step of sampling (pass 1): one new token for every row against
the KV cache, the step model.generate repeats max_new_tokens times. What is compiled is the model's own
forward (GPT.forward, CausalSelfAttention.forward, one_query_attention: no second copy of the block),
over a static cache (StaticKVCache, the form of model.KVCache it reads), as gpt-fast does:
  - the new token's column is a (1,) tensor, not an int: an input value, not a constant of the graph;
  - every column of the cache is read, the mask hiding the ones not written yet and each row's left
    padding (the softmax gives them weight exactly 0), so each step has the same shapes;
  - each layer's keys and values are a tensor of their own, written in place inside the graph (into a
    slice of one 5-D tensor inductor copies the whole tensor: 97 ms against 0.04 ms, measured on CPU);
  - the cache's length is rounded up to a bucket (`bucket`: 16, 24, 32, 48, 64, 96, ...), so prompts of
    other lengths reuse one graph: a run compiles once per (rows, bucket, dtype), not once per step;
  - each bucket's static cache is made once per model and kept (STATIC): on a GPU its tensors are
    static addresses of the CUDA graph (mode 'reduce-overhead'), written in place at every replay instead
    of copied into the graph's own buffers.
Why the model's forward over the ordinary cache compiles badly (docs/performance.md, "The decode step
compiled"): `cache.pos` is a Python int that grows by one every step and the columns read grow with it,
so a static graph is recompiled every step until the recompile limit. The prefill (the prompt, once per
call) stays eager. The result is the eager step's up to float rounding (tests/test_compiled.py).

Where it plugs in, in sight: train_grpo.setup asks `choose` whether to compile (compile=None: on a GPU
when the run's predicted saving exceeds the capture time, said in one line; eager on a CPU), builds one
CompiledDecode and hands it to every grpo_step as an argument (`decode=`), down through
grpo.make_rollouts to model.generate, which copies the prefilled cache into `decode.static_cache` and
calls `decode` for each new column instead of the model's forward. The model object is never changed;
evaluation (runs/evaluate.evaluate) samples eagerly. Under CUDA graphs sampling reads LoRA's A and B as
they are (grpo.sample_rollouts folds them in otherwise): a folded copy, new every step, would be copied
into the graph's own buffers at every token.
"""
import functools
import shutil
import weakref

import torch

from configurator import UserError
from model import KVCache

COMPILED = weakref.WeakKeyDictionary()  # model -> {mode: its compiled decode step}
STATIC = weakref.WeakKeyDictionary()  # model -> {(rows, columns, dtype): its static KVCache}: the graphs' addresses
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


# compile=None (auto) weighs these, measured on an H100 (docs/performance.md, "CUDA graphs and the GPU
# configs"): a captured decode step saved 0.3 ms a layer and token (generation 0.166 -> 0.050 s a step at
# 6 layers, 64 tokens), and capturing one graph took about 2.5 s a layer (6.5-16.5 s at 4-6 layers)
SAVED_PER_LAYER_TOKEN = 0.3e-3  # seconds
CAPTURE_PER_LAYER = 2.5         # seconds a graph
GRAPHS = 2                      # a run's (rows, bucket) graphs: its prompt lengths span a bucket or two


def choose(knob, device, steps, new_tokens, n_layer):
    """Whether the run compiles its decode step, and the start-up line that says why (None: nothing to
    say). knob: compile's value, True / False, or None / 'auto': on a GPU when the run's predicted saving
    (steps x new_tokens decode steps at most) exceeds the predicted capture time; eager on a CPU."""
    if isinstance(knob, bool):
        return knob, None
    if not str(device).startswith("cuda"):
        return False, None  # CPU: eager (a compile pays back only in long runs, docs/performance.md)
    saving = steps * new_tokens * n_layer * SAVED_PER_LAYER_TOKEN
    capture = GRAPHS * n_layer * CAPTURE_PER_LAYER
    on = saving > capture
    return on, (f"compile=auto: decode step {'compiled (CUDA graphs)' if on else 'eager'}: {steps} steps x "
                f"{new_tokens} tokens x {n_layer} layers would save ~{saving:.0f} s against ~{capture:.0f} s "
                f"capturing {GRAPHS} graphs{'' if on else '; --compile=True forces it'}")


def bucket(n, block_size):
    """The static cache's columns for n tokens: the next of 16, 24, 32, 48, 64, 96, ... (2^k and 3 * 2^(k-1)),
    at most block_size. One graph serves every length of a bucket; under a third of its columns go unused."""
    size = 16
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3  # 2^k -> 3 * 2^(k-1) -> 2^(k+1)
    return min(size, block_size)


def decode_step(model, tok, cache):
    """The model's own forward for one new column: tok (N, 1) ids over a static cache -> logits (N, 1, V)."""
    return model(tok, cache=cache)[0]


def compiled_step(model, mode=None):
    """The model's compiled decode step, made once per model and mode (the graphs live as long as it does).
    fullgraph=True: a graph break is an error, not a silent fall-back to eager Python between graphs;
    dynamic=False: a new (rows, bucket) compiles a new static graph instead of a symbolic one."""
    mode = None if mode == "default" else mode  # torch.compile's default mode, by its name or by None
    steps = COMPILED.setdefault(model, {})  # dropped with the model (a deep copy compiles its own)
    if mode not in steps:
        steps[mode] = torch.compile(functools.partial(decode_step, model), mode=mode, fullgraph=True,
                                    dynamic=False)
    return steps[mode]


class StaticKVCache(KVCache):
    """model.KVCache in the form a captured decode step reads: every step has the same shapes and
    constants, so one graph serves them all. `pos` is a (1,) tensor (a value of the graph, not a
    constant), all max_len columns are read (the mask hides the ones not written yet), each layer has a
    tensor of its own (written in place inside a graph; into a slice of one 5-D tensor inductor copies the
    whole tensor). GPT.forward and CausalSelfAttention.forward call its key_columns and write."""

    def __init__(self, shape, pad_left, device, dtype):
        # shape: (n_layer, B, n_kv_head, max_len, head_dim), as model.KVCache
        self.k = [torch.zeros(shape[1:], device=device, dtype=dtype) for _ in range(shape[0])]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.pad_left, self.max_len = pad_left, shape[3]

    def key_columns(self, T):
        return self.max_len  # every column

    def write(self, layer, k, v):
        """T new columns at the tensor pos, in place (index_put_); -> every column's keys and values."""
        cols = self.pos + torch.arange(k.size(2), device=k.device)
        self.k[layer][:, :, cols], self.v[layer][:, :, cols] = k, v
        return self.k[layer], self.v[layer]


class CompiledDecode:
    """The decode step that model.generate calls once per new token, compiled:
        generate(model, prompts, ..., decode=CompiledDecode(model, device))  (built by train_grpo.setup)
    generate prefills its ordinary cache eagerly, then `static_cache` copies the filled columns into this
    object's static cache of that bucket; each call runs the model's forward for one new column over it,
    through the compiled graph."""

    def __init__(self, model, device, mode=None):
        """mode: torch.compile's (None: CUDA graphs on a GPU, inductor's default on a CPU; bench/ passes its --compile)."""
        mode = mode or ("reduce-overhead" if str(device).startswith("cuda") else None)
        self.model, self.mode = model, None if mode == "default" else mode
        self.graphs = self.mode == "reduce-overhead"  # CUDA graphs: grpo.sample_rollouts folds no LoRA
        self.step = compiled_step(model, self.mode)
        self.caches = STATIC.setdefault(model, {})  # kept with the model, shared as its graphs are

    def static_cache(self, cache):
        """The static cache of cache's rows and bucket, holding cache's filled columns (the prefill), zeros
        after them (a stale NaN there would reach the values through weight 0: 0 * NaN = NaN)."""
        (n_layer, rows, heads, length, hd), dtype = cache.k.shape, cache.k.dtype
        columns = bucket(length, self.model.config.block_size)
        key = (rows, columns, dtype)
        if key not in self.caches:
            shape = (n_layer, rows, heads, columns, hd)
            static = StaticKVCache(shape, cache.pad_left.clone(), cache.k.device, dtype)
            for t in (*static.k, *static.v, static.pos, static.pad_left):
                torch._dynamo.mark_static_address(t)  # CUDA graphs: read and written where it lies
            self.caches[key] = static
        static, P = self.caches[key], cache.pos
        for i in range(len(static.k)):
            for mine, theirs in ((static.k[i], cache.k[i]), (static.v[i], cache.v[i])):
                mine[:, :, :P].copy_(theirs[:, :, :P])
                mine[:, :, P:].zero_()
        static.pos.fill_(P)
        static.pad_left.copy_(cache.pad_left)
        return static

    def __call__(self, tok, cache):
        """tok (N, 1) ids -> logits (N, 1, V), as model(tok, cache=cache)[0]; the cache advances one column."""
        if self.graphs:  # CUDA graphs: the last step's logits are used up, may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        return self.step(tok, cache)
