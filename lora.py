"""
Hand-rolled LoRA (Hu et al. 2021): a frozen linear map W plus a trainable
low-rank update,

    out = W x + s * B (A x),
    A: (r, in) random,  B: (out, r) zeros,  s = alpha / r

so a fresh adapter changes nothing (B = 0) and only r * (in + out) numbers
per layer train. `lora_A` and `lora_B` are plain nn.Linear modules on
purpose: TracIn's hooks (ghost.py) attach to them and read x, h = A x and
the gradients at h and at B h.
"""
import re
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int, alpha: float,
                 dropout: float = 0.0):
        assert r >= 1, f"LoRA rank {r}"
        super().__init__()
        self.base = base
        # float32 even on a bf16 base (trained weights, AdamW state:
        # model.py's precision list), on its device
        device = base.weight.device
        # kaiming-uniform
        self.lora_A = nn.Linear(base.in_features, r, bias=False, device=device)
        self.lora_B = nn.Linear(r, base.out_features, bias=False, device=device)
        nn.init.zeros_(self.lora_B.weight)  # B = 0: the adapter starts as a no-op
        self.lora_dropout = nn.Dropout(dropout)
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        self.disabled = False  # set by disable_lora()
        self.folded = None     # W + s B A while folded_for_sampling()

    def forward(self, x):
        # checked first: a fold made before disable_lora holds the adapter
        if self.disabled:
            return self.base(x)  # the base model, exactly
        # pass 1: one matmul, not three
        if self.folded is not None and not torch.is_grad_enabled():
            return F.linear(x, self.folded, self.base.bias)
        out = self.base(x)
        # a bf16 base feeds bf16 x: the adapter's matmuls run in float32
        # (autocast's dtype if on)
        if not torch.is_autocast_enabled(x.device.type):
            x = x.to(self.lora_A.weight.dtype)
        u = self.lora_B(self.lora_A(self.lora_dropout(x)))
        return out + (u * self.scaling).to(out.dtype)

    def delta(self):
        """s B A, the update folded into W (folded_for_sampling, merge_lora):
        (d_out, d_in), float32 like A and B."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling


def targeted_linears(model, targets):
    """The names of the nn.Linear layers apply_lora wraps: the last part
    of the name in `targets`, or the full name matching a target used as
    a regex; never an adapter's own lora_A / lora_B."""
    targets = [targets] if isinstance(targets, str) else list(targets)

    def targeted(n):
        last = n.split(".")[-1]
        if last.startswith("lora_"):
            return False
        return any(last == t or re.fullmatch(t, n) for t in targets)
    return [n for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and targeted(n)]


def apply_lora(model, r=8, alpha=16, dropout=0.0,
               targets=("c_attn", "c_proj", "c_fc")):
    """Wrap every targeted nn.Linear (targeted_linears) in a LoRALinear;
    freeze every other parameter. Returns the names."""
    assert r >= 1, f"LoRA rank r={r}"
    names = targeted_linears(model, targets)
    assert names, f"LoRA targets {targets} match no nn.Linear"
    for p in model.parameters():
        p.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        # A, B: r x (d_in + d_out) numbers a layer
        adapted = LoRALinear(getattr(parent, child), r, alpha, dropout)
        setattr(parent, child, adapted)
    return names


def lora_modules(model):
    """{name: LoRALinear}, in the model's order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_parameters(model):
    return [p for n, p in model.named_parameters() if ".lora_" in n]


def lora_state_dict(model):
    """Only the adapter: a few hundred KB instead of the whole model."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if ".lora_" in k}


def load_lora_state_dict(model, sd):
    own = lora_state_dict(model)
    fits = set(own) == set(sd) and all(own[k].shape == v.shape for k, v in sd.items())
    assert fits, "LoRA weights do not fit this model"
    model.load_state_dict(sd, strict=False)


@contextmanager
def disable_lora(model):
    """Run the base model through the same module objects: GRPO's reference
    policy costs no second copy of the weights."""
    mods = list(lora_modules(model).values())
    previous = [m.disabled for m in mods]
    for m in mods:
        m.disabled = True
    try:
        yield model
    finally:
        for m, d in zip(mods, previous):
            m.disabled = d


@contextmanager
def folded_for_sampling(model):
    """Pass 1 with W' = W + s B A: one matmul per adapted layer and token
    instead of three. Every adapted layer holds its own copy W' while
    sampling runs (memory: the adapted weights once more, in the matmul's
    dtype: autocast's, else the base's); W, A and B are never written,
    so nothing drifts however often it folds."""
    mods = [m for m in lora_modules(model).values() if not m.disabled]
    kind = next(model.parameters()).device.type
    autocast = torch.is_autocast_enabled(kind)
    with torch.no_grad():  # W' is a constant
        for m in mods:
            delta = m.delta()  # (d_out, d_in), float32
            if autocast:
                dtype = torch.get_autocast_dtype(kind)
            else:
                dtype = m.base.weight.dtype
            m.folded = (m.base.weight.float() + delta).to(dtype)
    try:
        yield model
    finally:
        for m in mods:
            m.folded = None  # the copies are freed


@torch.no_grad()
def merge_lora(model):
    """Fold W <- W + s * B A into each base layer and drop the adapters
    (for fast inference)."""
    for name, m in lora_modules(model).items():
        # a new tensor, not +=: the base weight may be shared
        # (lm_head is tied to wte); float32, then the base's dtype
        W = m.base.weight
        merged = (W + m.delta()).to(W.dtype)
        m.base.weight = nn.Parameter(merged, requires_grad=W.requires_grad)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, m.base)
    return model
