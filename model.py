"""
A GPT in the nanoGPT mould (GPT-2 names: wte, wpe, c_attn, c_proj, c_fc,
lm_head), with
  - F.scaled_dot_product_attention,
  - left-padded batches: `pad_left[b]` pad tokens precede row b's prompt;
    they are masked out as keys and positions restart at 0 on the first
    real token, so a row's numbers do not depend on what else is in the
    batch (up to rounding: matmuls of other shapes sum in another order,
    about 3e-8 on the logits),
  - a KV cache for decoding (KVCache): each new token attends to the
    cached keys/values instead of recomputing the whole prefix,
  - `keep_last=k`: the LM head runs on the last k positions only (GRPO
    needs completion logits only; the head is the largest matmul and
    logits the largest activation),
  - optional gradient checkpointing per block,
  - the families of real checkpoints as a few switches (GPTConfig.arch and
    below): GPT-2 is this GPT with biases and tanh GELU; Qwen2 and Llama
    swap LayerNorm for RMSNorm, learned positions for RoPE, GELU for
    SwiGLU, and may share key/value heads (grouped-query attention),
and `generate`, GRPO's pass 1: batched KV-cache sampling that returns
token ids and a completion mask, never logits. Layout of a batch (prompts
of different lengths are left-padded, so every completion starts at the
same column P and the cache advances one column per step for all rows):

    row 0:  [pad pad q q q q | c c c EOT pad]
    row 1:  [q q q q q q     | c c c c   c  ]
             pad_left = (2, 0)
             completion_mask = (1 1 1 1 0), (1 1 1 1 1)

This file is the model alone: it reads no file (a checkpoint or a
Hugging Face directory is loaded elsewhere into this class).

Precision under dtype='bfloat16' (a GRPO run stores the frozen base
weights in bf16 and runs every pass under bf16 autocast, the `amp` each
pass is handed; training a base autocasts only: its weights and AdamW
stay float32). The whole list, the one place it is written.
bf16:
  - the frozen base weights, and the matmuls autocast runs (LoRA's too;
    not the float32 ones below): embeddings, the residual stream, the
    attention of a whole sequence (prefill, passes 2 and 3), RoPE's
    rotation (its angles are float32, cast to q's dtype: apply_rope)
  - the KV cache, in autocast's dtype (model.GPT.new_cache), and the
    logits, in the head's (SelectiveLogSoftmax upcasts one row at a time
    and hands their gradient back in the logits' dtype)
  - TracIn's hook buffers (ghost.GhostHooks): h = A x, gA = dL/dh and
    gB = dL/d(B h), as autocast's matmuls leave them, and x, the adapted
    layer's input (float32 where a LayerNorm feeds it on CUDA, whose
    autocast runs layer_norm in float32): half the memory; the inner
    products upcast them
float32:
  - LoRA's weights, their gradients and AdamW's state (lora.LoRALinear)
  - the adapter folded in for sampling, W + s B A: summed in float32,
    stored in the matmul's dtype (lora.folded_for_sampling)
  - RMSNorm's statistics (model.RMSNorm)
    and RoPE's angles (model.rope_cos_sin)
  - a decode step's attention scores, probabilities and weighted values
    (model.one_query_attention)
  - sampling's softmax and cumulative distribution (model.sample_next)
  - log-probs and their logsumexp (grpo.SelectiveLogSoftmax),
    the entropy (grpo.completion_logprobs),
    rewards and advantages (grpo.compute_group_advantages),
    ratio, KL and loss (grpo.grpo_loss, from the float32 log-probs),
    the gradient norm that clips (grpo.update, over LoRA's gradients)
  - per-sample gradients, G and the influence inner products
    (ghost.outer_product_sum, ghost.ghost_inner_products,
    ghost.summed_gradient, ghost.summed_inner_products,
    ghost.squared_norms); post-hoc attribution sums them over
    checkpoints in float64 (tracin.tracin_cp)
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as activation_checkpoint


@dataclass
class GPTConfig:
    block_size: int = 128
    vocab_size: int = 395
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    # recompute each block's activations in backward
    grad_checkpoint: bool = False
    # family switches: the defaults are the tiny GPT;
    # a Hugging Face directory's config.json sets them
    # 'gpt2': LayerNorm, learned positions, GELU MLP, one fused c_attn;
    # 'llama' (Qwen2 too): RMSNorm, RoPE, SwiGLU MLP, q/k/v/o_proj
    arch: str = "gpt2"
    # grouped-query attention: n_kv_head key/value heads (0 = n_head)
    n_kv_head: int = 0
    n_inner: int = 0      # MLP width (0 = 4 * n_embd)
    gelu: str = "none"    # F.gelu's `approximate`: 'tanh' is GPT-2's gelu_new
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # a bias on q, k, v only (Qwen2); `bias`: one everywhere (GPT-2)
    qkv_bias: bool = False
    tie_head: bool = True  # lm_head shares wte's weight


class KVCache:
    """Keys/values of every layer for a batch, preallocated to `max_len`
    columns.

    Column j of the cache holds the token at column j of the (left-padded)
    input. `pos` is the number of filled columns; `pad_left` (B,) says
    where each row's real tokens start. (A compiled decode step reads a
    fixed-shape form of it, with the same two methods.)
    """

    def __init__(self, shape, pad_left, device, dtype):
        # shape: (n_layer, B, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.pad_left = pad_left
        self.pos = 0

    def repeat_interleave(self, n):
        """Each row becomes n: the prompt's prefill is shared by its
        n samples, not recomputed."""
        self.k = self.k.repeat_interleave(n, dim=1)
        self.v = self.v.repeat_interleave(n, dim=1)
        self.pad_left = self.pad_left.repeat_interleave(n)

    def key_columns(self, T):
        """The columns T new tokens attend over: those filled so far and
        their own."""
        return self.pos + T

    def write(self, layer, k, v):
        """Cache T new columns (B, Hkv, T, hd) at pos; -> the keys and
        values of key_columns(T) columns."""
        start, end = self.pos, self.pos + k.size(2)
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def attention_mask(pad_left, q_start, Tq, Tk, device):
    """(B, 1, Tq, Tk) bool: query column q_start+i may see key column j iff
    j <= q_start+i and j is not padding. A padding query also sees itself,
    so no softmax row is empty (an empty row gives NaN, and NaN * 0 would
    leak into the real rows through the values)."""
    # (Tq, 1); q_start an int, or a static cache's (1,) tensor
    q = (q_start + torch.arange(Tq, device=device))[:, None]
    k = torch.arange(Tk, device=device)[None, :]                     # (1, Tk)
    real = k[None] >= pad_left[:, None, None]                        # (B, 1, Tk)
    seen = ((k <= q)[None] & real) | (k == q)[None]                  # (B, Tq, Tk)
    return seen[:, None]                                             # (B, 1, Tq, Tk)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (Qwen2, Llama): the statistics in
    float32 whatever the weights' dtype, the result back in x's."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        h = x.float()
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def make_norm(config):
    if config.arch == "llama":
        return RMSNorm(config.n_embd, config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


def rope_cos_sin(pos, head_dim, theta):
    """Rotary position embedding (RoFormer, arXiv 2104.09864): pair i of
    a head is rotated by the angle pos * theta^(-2i / head_dim).
    pos (B|1, T) -> cos, sin (B|1, 1, T, head_dim), float32."""
    pairs = torch.arange(0, head_dim, 2, device=pos.device).float()
    inv_freq = 1.0 / theta ** (pairs / head_dim)
    angles = pos[..., None].float() * inv_freq  # (B, T, head_dim / 2)
    # (B, 1, T, head_dim) for rotate_half
    angles = torch.cat((angles, angles), dim=-1)[:, None]
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x (B, H, T, hd) rotated: each head's first and second half form the
    pairs (rotate_half)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)


def one_query_attention(q, keys, values, seen):
    """ONE query per row (a decode step): softmax(q K^T / sqrt(hd)) V over
    the columns `seen`, in float32 whatever autocast says (bf16 would round
    the softmax). q (B, H, 1, hd); keys, values (B, Hkv, L, hd), each
    key/value head serving H / Hkv query heads (grouped-query attention:
    those queries side by side, not the cache repeated);
    seen (B, 1, 1, L) bool. Returns (B, H, 1, hd), q's dtype."""
    (B, H, _, hd), Hkv = q.shape, keys.size(1)
    dtype, scale = q.dtype, hd ** -0.5
    # else autocast makes both matmuls bf16
    with torch.autocast(q.device.type, enabled=False):
        # (B, Hkv, H / Hkv, hd): query head h reads key/value head h // (H / Hkv)
        q = q.float().view(B, Hkv, H // Hkv, hd)
        scores = q @ keys.float().transpose(-2, -1) * scale  # (B, Hkv, H / Hkv, L)
        att = scores.masked_fill(~seen, float("-inf")).softmax(-1)
        return (att @ values.float()).view(B, H, 1, hd).to(dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        divisible = config.n_embd % config.n_head == 0
        assert divisible, "n_embd must be divisible by n_head"
        C, self.hd = config.n_embd, config.n_embd // config.n_head
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head or config.n_head
        grouped = self.n_head % self.n_kv_head == 0
        assert grouped, "n_head must be a multiple of n_kv_head"
        kv = self.n_kv_head * self.hd
        self.split = (C, kv, kv)
        if config.arch == "gpt2":  # q, k, v from one fused matmul
            self.c_attn = nn.Linear(C, C + 2 * kv, bias=config.bias)
            self.c_proj = nn.Linear(C, C, bias=config.bias)
        else:
            qkv_bias = config.bias or config.qkv_bias
            self.q_proj = nn.Linear(C, C, bias=qkv_bias)
            self.k_proj = nn.Linear(C, kv, bias=qkv_bias)
            self.v_proj = nn.Linear(C, kv, bias=qkv_bias)
            self.o_proj = nn.Linear(C, C, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout

    def project_qkv(self, x, rope=None):
        """x (B, T, C) -> q (B, H, T, hd), k and v (B, Hkv, T, hd),
        rotated if RoPE."""
        B, T, _ = x.size()
        if hasattr(self, "c_attn"):
            q, k, v = self.c_attn(x).split(self.split, dim=2)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # (B, H, T, hd); k, v: Hkv heads
        q = q.view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def shared_kv(self, *kv):
        """Grouped-query attention: each key/value head serves
        n_head / n_kv_head query heads."""
        if self.n_kv_head == self.n_head:
            return kv
        n = self.n_head // self.n_kv_head
        return tuple(t.repeat_interleave(n, dim=1) for t in kv)

    def project_out(self, y):
        """y (B, H, T, hd) -> (B, T, C): the heads side by side,
        then the output projection."""
        B, _, T, _ = y.size()
        y = y.transpose(1, 2).contiguous().view(B, T, self.n_head * self.hd)
        proj = self.c_proj if hasattr(self, "c_proj") else self.o_proj
        return self.resid_dropout(proj(y))

    def forward(self, x, mask=None, cache=None, layer=0, rope=None):
        q, k, v = self.project_qkv(x, rope)
        T = x.size(1)
        # write this step's keys/values, then attend over the cache's columns
        if cache is not None:
            k, v = cache.write(layer, k, v)
        dropout_p = self.dropout if self.training else 0.0
        # decoding, one query: written out, float32, the key/value heads
        # shared in place; no SDPA per-call overhead
        if mask is not None and T == 1 and not self.training:
            return self.project_out(one_query_attention(q, k, v, mask))
        k, v = self.shared_kv(k, v)
        if mask is None:  # no padding, no cache: the fused causal kernel
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
                                               is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               dropout_p=dropout_p)
        return self.project_out(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        C, hidden = config.n_embd, config.n_inner or 4 * config.n_embd
        if config.arch == "gpt2":
            self.c_fc = nn.Linear(C, hidden, bias=config.bias)
            self.c_proj = nn.Linear(hidden, C, bias=config.bias)
        else:  # SwiGLU (Shazeer 2020): down(silu(gate x) * up x)
            self.gate_proj = nn.Linear(C, hidden, bias=config.bias)
            self.up_proj = nn.Linear(C, hidden, bias=config.bias)
            self.down_proj = nn.Linear(hidden, C, bias=config.bias)
        self.dropout, self.gelu = nn.Dropout(config.dropout), config.gelu

    def forward(self, x):
        if hasattr(self, "c_fc"):
            h = F.gelu(self.c_fc(x), approximate=self.gelu)
            return self.dropout(self.c_proj(h))
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.dropout(self.down_proj(h))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, cache=None, layer=0, rope=None):
        x = x + self.attn(self.ln_1(x), mask, cache, layer, rope)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        known = config.arch in ("gpt2", "llama")
        assert known, f"arch: 'gpt2' or 'llama', not {config.arch!r}"
        self.config = config
        wte = nn.Embedding(config.vocab_size, config.n_embd)
        # learned positions; 'llama' rotates q and k instead (RoPE)
        wpe = {}
        if config.arch == "gpt2":
            wpe = dict(wpe=nn.Embedding(config.block_size, config.n_embd))
        self.transformer = nn.ModuleDict(dict(
            wte=wte,
            **wpe,
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_head:
            # weight tying, as in GPT-2
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2: scale residual projections by depth
        std = 0.02 / math.sqrt(2 * config.n_layer)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=std)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def load_weights(self, sd):
        """Take sd's tensors as the parameters (assign: no copy),
        the head tied to wte again."""
        self.load_state_dict(sd, assign=True)
        # assign made two Parameters of one tensor: make them one again
        if self.config.tie_head:
            self.lm_head.weight = self.transformer.wte.weight

    def num_params(self):
        wpe = 0
        if "wpe" in self.transformer:
            wpe = self.transformer.wpe.weight.numel()
        return sum(p.numel() for p in self.parameters()) - wpe

    def new_cache(self, B, max_len, pad_left=None):
        c, p = self.config, next(self.parameters())
        if pad_left is None:
            pad_left = torch.zeros(B, dtype=torch.long, device=p.device)
        kind = p.device.type
        dtype = p.dtype
        if torch.is_autocast_enabled(kind):
            dtype = torch.get_autocast_dtype(kind)
        shape = (c.n_layer, B, c.n_kv_head or c.n_head, max_len, c.n_embd // c.n_head)
        return KVCache(shape, pad_left, p.device, dtype)

    def forward(self, idx, targets=None, pad_left=None, cache=None,
                keep_last=None):
        """idx (B, T) ids; pad_left (B,) left padding per row;
        cache: a KVCache read, appended to.
        targets (B, T), -1 = ignore: -> (logits (B, T, V), mean
        cross-entropy); else (logits of the last keep_last positions
        (B, keep_last, V), None), keep_last 1 (all sampling needs)."""
        B, T = idx.size()
        start, Tk = 0, T  # the first new column; the columns attended over
        if cache is not None:
            start, Tk, pad_left = cache.pos, cache.key_columns(T), cache.pad_left
        block_size = self.config.block_size
        assert Tk <= block_size, f"{Tk} tokens exceed block_size={block_size}"
        cols = start + torch.arange(T, device=idx.device)
        if pad_left is None and cache is None:
            # (1, T); no mask -> the fused causal kernel
            pos, mask = cols[None], None
        else:
            # (B, T): 0 at the first real token
            pos = (cols[None] - pad_left[:, None]).clamp(min=0)
            mask = attention_mask(pad_left, start, T, Tk, idx.device)
        x, rope = self.transformer.wte(idx), None
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(pos)
        else:  # RoPE: cos/sin of each position, shared by every layer
            head_dim = self.config.n_embd // self.config.n_head
            rope = rope_cos_sin(pos, head_dim, self.config.rope_theta)
        x = self.transformer.drop(x)
        checkpointed = (self.config.grad_checkpoint and self.training
                        and torch.is_grad_enabled())
        for i, block in enumerate(self.transformer.h):
            if checkpointed:
                # store only the block's input;
                # recompute its insides during backward
                x = activation_checkpoint(block, x, mask, cache, i, rope,
                                          use_reentrant=False)
            else:
                x = block(x, mask, cache, i, rope)
        if cache is not None:
            cache.pos += T  # a static cache's (1,) tensor: in place
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)  # (B, T, V)
            flat = logits.view(-1, logits.size(-1))
            loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=-1)
            return logits, loss
        # contiguous: on a strided slice the head copies its (V, C) weight
        # per row (bf16: 10x)
        last = x[:, -(keep_last or 1):].contiguous()
        return self.lm_head(last), None  # (B, keep_last, V)


# -----------------------------------------------------------------------------
# PASS 1: sampling

class NonFiniteLogits(FloatingPointError):
    """The model produced NaN/Inf logits while sampling: its weights have
    diverged."""


def pad_id(stops):
    """The id that pads prompts and finished rows: the first stop id,
    0 when none stops a row."""
    return int(stops[0]) if len(stops) else 0


def pad_prompts(prompts, pad, device):
    """Left-pad token lists into one (B, P) tensor;
    returns (idx, pad_left)."""
    assert prompts and all(len(p) > 0 for p in prompts), "every prompt needs a token"
    P = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), P), pad, dtype=torch.long)
    for i, p in enumerate(prompts):
        idx[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
    pad_left = torch.tensor([P - len(p) for p in prompts], dtype=torch.long)
    return idx.to(device), pad_left.to(device)


# the smallest temperature > 0 taken: logits / temperature, and the
# log-probs' gradients that carry 1 / temperature, must stay far inside
# float32 (3.4e38); below it sampling is greedy anyway
MIN_TEMPERATURE = 1e-4


@dataclass(frozen=True)
class Sampling:
    """How pass 1 picks each next token (sample_next), and how often
    generate asks whether every row has ended."""
    temperature: float = 1.0  # 0: greedy (argmax); else softmax(logits / temperature)
    top_k: int = None         # only the k likeliest tokens
    top_p: float = None       # only the smallest set with mass >= top_p (nucleus)
    vocab_size: int = None    # ids >= vocab_size never drawn (a head wider than the tokenizer)
    check_every: int = None   # steps between "all rows done?" (None: 8 on CUDA, 1 elsewhere)


GREEDY = Sampling(temperature=0)


def uniforms(max_new_tokens, rows, seed, device):
    """generate's randomness, u (max_new_tokens, rows), from a generator
    seeded `seed` on `device` (None: torch's default generator):
    the same seed, the same tokens."""
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    return torch.rand(max_new_tokens, rows, generator=generator, device=device)


def sample_next(logits, sampling, u=None):
    """logits (N, V) of the last position only -> next token ids (N,),
    by inverse CDF from ONE uniform u_i per row (u (N,); None: from torch's
    default generator): the first token whose cumulative probability
    exceeds u_i. A row depends on its u_i and its logits only: processes
    sample as one process (up to the logits' rounding)."""
    top_k, top_p = sampling.top_k, sampling.top_p
    logits = logits[:, :sampling.vocab_size]  # ids the tokenizer has
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)  # greedy
    # float32 under bf16 (the precision list at the top of this file)
    logits = logits.float() / sampling.temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # nucleus: the smallest set with mass >= top_p
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # tokens entirely beyond the nucleus
        drop = cum - sorted_logits.softmax(-1) >= top_p
        drop[:, 0] = False  # the likeliest token stays, for any top_p
        dropped = torch.zeros_like(drop).scatter(-1, order, drop)
        logits = logits.masked_fill(dropped, float("-inf"))
    cdf = logits.softmax(dim=-1).cumsum(-1)
    if u is None:
        u = torch.rand(cdf.size(0), device=cdf.device)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    nxt = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    # right=True never lands on a zero-probability token
    return nxt.clamp_(max=cdf.size(-1) - 1)


# pass 1 needs no graph: no activations are stored for backward
@torch.no_grad()
def generate(model, prompts, max_new_tokens, eot_id, num_samples=1,
             sampling=Sampling(), u=None, decode=None):
    """prompts: token-id lists, `num_samples` completions each; eot_id: the
    end id or a tuple (the first pads); sampling: how each token is picked
    (Sampling; GREEDY: argmax).
    -> (idx (N, P + T), pad_left (N,), completion mask (N, T), 1 up to and
    including end-of-text), N = B * num_samples, laid out as the module
    docstring shows; only the last position's logits (N, V) ever exist,
    none are returned.
    u (max_new_tokens, N): a uniform per step and row (sample_next), the
    only randomness (uniforms(..., seed, device) draws it from a seed);
    None: drawn here from torch's default generator.
    decode: a compiled decode step, the model's forward over a static
    cache, captured; None: eager."""
    device = next(model.parameters()).device
    several = isinstance(eot_id, (tuple, list))
    eot_ids = tuple(eot_id) if several else (eot_id,)
    stops = torch.tensor(eot_ids, device=device, dtype=torch.long)
    # what pads prompts and finished rows; () = nothing stops a row
    eot_id = pad_id(eot_ids)
    # see "all rows done?" below
    check_every = sampling.check_every or (8 if device.type == "cuda" else 1)
    idx, pad_left = pad_prompts(prompts, eot_id, device)
    (B, P), N = idx.shape, len(prompts) * num_samples
    L = P + max_new_tokens  # the cache's columns
    block_size = model.config.block_size
    assert max_new_tokens >= 1, f"max_new_tokens={max_new_tokens}"
    assert L <= block_size, f"{P} + max_new_tokens={max_new_tokens} > {block_size}"
    if u is None and sampling.temperature > 0:
        u = torch.rand(max_new_tokens, N, device=device)  # (S, N)
    assert u is None or u.shape == (max_new_tokens, N), "u must be (max_new_tokens, rows)"
    was_training = model.training
    model.eval()
    cache = model.new_cache(B, L, pad_left)
    logits, _ = model(idx, cache=cache)  # prefill once per prompt: (B, 1, V)
    cache.repeat_interleave(num_samples)  # share the prefill among the samples
    if decode:  # compiled: the filled columns copied into the step's own static cache
        cache = decode.static_cache(cache)
    logits = logits[:, -1].repeat_interleave(num_samples, dim=0)  # (N, V)
    out = torch.full((N, max_new_tokens), eot_id, dtype=torch.long,
                     device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    nonfinite = torch.zeros(N, dtype=torch.bool, device=device)
    for t in range(max_new_tokens):
        # NaN/Inf: no host sync; raised at the end
        nonfinite |= ~torch.isfinite(logits).all(-1)
        u_t = None if u is None else u[t]
        nxt = sample_next(logits, sampling, u_t)
        del logits  # the only logits alive, kept by nothing
        nxt = nxt.masked_fill(done, eot_id)  # finished rows only emit padding
        out[:, t] = nxt
        done |= torch.isin(nxt, stops)
        # all rows done? bool() waits for the device: on a GPU, asking every
        # step would stall the kernel queue once per token, so there we ask
        # every 8 steps (at most 7 wasted at the end)
        if t + 1 == max_new_tokens:
            break
        if t % check_every == check_every - 1 and bool(done.all()):
            break
        # one new column for every row: the model's forward, eager or
        # compiled (the same forward over a static cache)
        if decode:
            logits = decode(nxt[:, None], cache)
        else:
            logits = model(nxt[:, None], cache=cache)[0]
        logits = logits[:, -1]
    model.train(was_training)
    if bool(nonfinite.any()):
        raise NonFiniteLogits(f"NaN/Inf logits in {int(nonfinite.sum())} "
                              f"of {N} sampled rows")
    # mask: 1 up to and including the first end-of-text of each row
    is_eot = torch.isin(out[:, :t + 1], stops).long()
    # 0 strictly after the first EOT
    mask = ((is_eot.cumsum(1) - is_eot) == 0).long()
    # drop columns no row reached, all padding
    T = int(mask.sum(0).nonzero().max()) + 1
    prompt_rows = idx.repeat_interleave(num_samples, dim=0)
    idx = torch.cat([prompt_rows, out[:, :T]], dim=1)
    return idx, pad_left.repeat_interleave(num_samples), mask[:, :T]
