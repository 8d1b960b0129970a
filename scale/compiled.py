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

A compiled path never fails a run that eager would finish: a compile or capture that fails (a driver, a
torch build, an operator inductor cannot compile), at the first token or at a new bucket, is one warning
line, and that step and every later one run the model's eager forward over the ordinary cache, as
compile=False does (`CompiledDecode.__call__`). Dynamo compiles the step at most recompile_limit times (8
by default), then fails: the static caches, a graph each, stop one short of that, and a length none of
them holds samples eagerly, said once (`CompiledDecode.static_cache`; a run's lengths span a bucket or two).
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


def recompile_limit():
    """How many graphs dynamo compiles for one function; one more fails under fullgraph=True (8 by
    default; named cache_size_limit before torch 2.6)."""
    config = torch._dynamo.config
    return getattr(config, "recompile_limit", None) or config.cache_size_limit


def compile_failure(e):
    """Whether e is the compile stack failing, not the step: dynamo's and inductor's errors
    (BackendCompilerFailed, Unsupported, ...), a kernel's build or launch and a CUDA graph's capture are
    RuntimeErrors or OSErrors, triton's own errors come from its modules, and past recompile_limit dynamo
    raises FailOnRecompileLimitHit. Not a KeyboardInterrupt, NaN logits (NonFiniteLogits, raised after
    the loop) or a wrong argument (ValueError, TypeError); a RuntimeError of the step itself is raised
    again by the eager step that follows."""
    past_limit = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", RuntimeError)  # torch >= 2.5
    return isinstance(e, (RuntimeError, OSError, past_limit)) or type(e).__module__.split(".")[0] == "triton"


def cause(e):
    """'Type: first line' of what failed, under dynamo's wrapper (BackendCompilerFailed: inductor's error)."""
    e = getattr(e, "inner_exception", None) or e
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0][:150]}" if lines else type(e).__name__


class CompiledDecode:
    """The decode step that model.generate calls once per new token, compiled:
        generate(model, prompts, ..., decode=CompiledDecode(model, device))  (built by train_grpo.setup)
    generate prefills its ordinary cache eagerly, then `static_cache` copies the filled columns into this
    object's static cache of that bucket; each call runs the model's forward for one new column over it,
    through the compiled graph. A compile or capture that fails turns this object eager for good."""

    def __init__(self, model, device, mode=None):
        """mode: torch.compile's (None: CUDA graphs on a GPU, inductor's default on a CPU; bench/ passes its --compile)."""
        mode = mode or ("reduce-overhead" if str(device).startswith("cuda") else None)
        self.model, self.mode = model, None if mode == "default" else mode
        self.graphs = self.mode == "reduce-overhead"  # CUDA graphs: grpo.sample_rollouts folds no LoRA
        self.step = compiled_step(model, self.mode)
        self.caches = STATIC.setdefault(model, {})  # kept with the model, shared as its graphs are
        self.failed = False  # a compile or capture failed: every step eager from then on
        self.pos = 0  # the static cache's filled columns, counted here: reading its pos waits for the device
        self.moved = {}  # the static cache of a failed step -> the ordinary cache its generation goes on with
        self.bounded = False  # the graphs' bound has been said

    def static_cache(self, cache):
        """The static cache of cache's rows and bucket, holding cache's filled columns (the prefill), zeros
        after them (a stale NaN there would reach the values through weight 0: 0 * NaN = NaN).
        cache itself where this generation runs eagerly: after a failed compile, or past the graphs' bound."""
        (n_layer, rows, heads, length, hd), dtype = cache.k.shape, cache.k.dtype
        self.moved.clear()  # the generation of a failed step is over
        if self.failed:
            return cache
        key = (rows, bucket(length, self.model.config.block_size), dtype)
        if key not in self.caches and len(self.caches) >= recompile_limit() - 1:
            # a static cache is a graph, and dynamo fails the graph past recompile_limit (one is kept
            # spare for another guard's recompile): the shortest kept one as long serves, else eager
            kept = [k for k in self.caches if k[0] == rows and k[2] == dtype and k[1] >= length]
            if not kept:
                if not self.bounded:
                    print(f"note: the compiled decode step keeps {len(self.caches)} graphs, one short of "
                          f"dynamo's recompile limit: a length no graph holds ({length} tokens here) samples "
                          "eagerly (torch._dynamo.config.recompile_limit raises the limit)")
                self.bounded = True
                return cache
            key = min(kept, key=lambda k: k[1])
        if key not in self.caches:
            shape = (n_layer, rows, heads, key[1], hd)
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
        self.pos = P
        return static

    def __call__(self, tok, cache):
        """tok (N, 1) ids -> logits (N, 1, V), as model(tok, cache=cache)[0]; the cache advances one column.
        The model's eager forward over an ordinary cache (static_cache gave it back, or a step failed)."""
        cache = self.moved.get(cache, cache)
        if not isinstance(cache, StaticKVCache):
            return self.model(tok, cache=cache)[0]
        try:
            if self.graphs:  # CUDA graphs: the last step's logits are used up, may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
            logits = self.step(tok, cache)
        except Exception as e:
            if not compile_failure(e):
                raise
            return self.eager_from_here(e, tok, cache)
        self.pos += tok.size(1)
        return logits

    def eager_from_here(self, e, tok, static):
        """The step whose compile or capture failed, eagerly, and every later one: the columns written
        before it (self.pos; the failed step's own may be half written) go into an ordinary cache, which
        its generation goes on with, as compile=False would. The warning comes after the eager step: an
        error of the step itself is raised there again, not blamed on the compiler."""
        shape, dtype, P = (len(static.k), *static.k[0].shape), static.k[0].dtype, self.pos
        cache = KVCache(shape, static.pad_left.clone(), tok.device, dtype)
        for i in range(len(static.k)):
            cache.k[i, :, :, :P], cache.v[i, :, :, :P] = static.k[i][:, :, :P], static.v[i][:, :, :P]
        cache.pos = P
        logits = self.model(tok, cache=cache)[0]
        print(f"warning: the compiled decode step failed ({cause(e)}); sampling eagerly from here on "
              "(--compile=False skips compiling)")
        self.failed, self.graphs, self.moved = True, False, {static: cache}  # graphs: LoRA folded again
        self.caches.clear()  # the static caches freed: eager reads none
        return logits
