"""
Per-sample LoRA gradients from ONE batched backward, with hooks
("ghost" gradients; Li et al. 2021), and their inner products:
the machinery TracIn (tracin.py) is built on.

For a linear map y_t = W x_t applied at every position t of a sample,
with output gradient g_t = dL/dy_t, the sample's weight gradient is
G = sum_t g_t x_t^T. For LoRA (lora.py):

    h = A x      ->  dL/dA = sum_t gA_t x_t^T,  gA = dL/dh   (r x d_in)
    u = B h      ->  dL/dB = sum_t gB_t h_t^T,  gB = dL/du   (d_out x r)
    out = W x + s u
    (the hook on u sees dL/du = s dL/dout: the scaling is already in gB)

So a forward hook that keeps x and h, and tensor hooks that keep gA and
gB, give every sample's LoRA gradient from ONE ordinary batched backward.
Two samples' gradient inner product needs no materialised gradient at all
(the "ghost" form):

    <G, G'> = sum_{t,s} (g_t . g'_s) (x_t . x'_s)  T^2 products a pair
    or, materialised, G = g^T x, then a dot product  d p numbers a sample

and ghost is chosen when 2 T^2 < d p, comparing what each form holds
(private-transformers' rule).
When only <G_i, sum_j G'_j> is needed (TracIn's selection and
attribution), the sum G' = sum_j G'_j comes from one ordinary backward of
the summed loss, each G_i is formed from the buffers (one batched matmul
per factor, O(T d p) per sample, p x d numbers: fewer than the buffers
when T > p) and <G_i, G'> is a dot product; the same G_i, weighted by the
selection, sum to the update. No pairs at all.

Gradients are exact over ALL positions of a sample, prompt included:
LoRA acts on prompt tokens too, and their hidden states reach the
completion's log-probs through attention. Padding positions get exactly
zero gradient (no real token attends to them), so they add 0.

Precision: under bf16 the buffers h, gA, gB are bf16 (autocast's
matmuls) and x is the layer's input as it comes, every product here
float32; which tensors are which, the whole list, opens model.py.
"""
from contextlib import contextmanager

import torch

from lora import lora_modules


class GhostHooks:
    """Forward hooks on every lora_A (keeps x and h = A x; a tensor hook on
    h keeps gA = dL/dh) and lora_B (a tensor hook on u = B h keeps
    gB = dL/du).
    Buffers (dicts: layer name -> list of per-micro-batch tensors,
    rows = samples), named as in the TracIn-GRPO guide:
        train rollouts: _train_xs, _train_hs, _train_gAs, _train_gBs
        validation rows (TracIn's 'matrix' influence only):
            _xs, _hs, _gAs, _gBs
    Set `.split` to 'train' or 'val' before each capture, or to None for
    an ordinary backward that keeps nothing (its summed gradient is read
    from .grad); `.remove()` detaches every hook.

    While a split captures, the LoRA weights do not require grad:
    the backward then computes only what the hooks keep (gA, gB) and the
    gradients flowing through them, not the batch's summed weight gradient
    dL/dA = sum gA x^T, dL/dB = sum gB h^T (two matmuls per layer),
    which nobody reads (the update is summed from the per-sample
    gradients, subset_gradients).
    Where x needs no grad (the first block), h is made a leaf that does,
    so that gA and everything above it still flow; nothing upstream
    needed one."""

    def __init__(self, model):
        self._train_xs, self._train_hs = {}, {}
        self._train_gAs, self._train_gBs = {}, {}
        self._xs, self._hs, self._gAs, self._gBs = {}, {}, {}, {}
        # weights: LoRA weight -> its requires_grad before,
        # put back by remove()
        self.handles, self.weights = [], {}
        for name, m in lora_modules(model).items():
            # dropout: g_i of one random mask, not the sampler's (tracin.capture_problem)
            assert m.lora_dropout.p == 0 or not m.training, "hooks need lora_dropout=0"
            hook_A = m.lora_A.register_forward_hook(self._hook_A(name))
            hook_B = m.lora_B.register_forward_hook(self._hook_B(name))
            self.handles += [hook_A, hook_B]
            weights = (m.lora_A.weight, m.lora_B.weight)
            self.weights |= {w: w.requires_grad for w in weights}
        assert self.handles, "no LoRA layers to hook: call lora.apply_lora(model, ...) first"
        self.split = "train"

    @property
    def split(self):
        return self._split

    @split.setter
    def split(self, split):
        """'train' / 'val': capture per sample, no weight gradient formed;
        None: ordinary backward into .grad."""
        self._split = split
        for w, requires_grad in self.weights.items():
            w.requires_grad_(requires_grad and split is None)

    def buffers(self, split=None):
        """(xs, gAs, hs, gBs) of `split`: each input beside its output
        gradient, as collect()."""
        if (split or self.split) == "train":
            return (self._train_xs, self._train_gAs,
                    self._train_hs, self._train_gBs)
        return self._xs, self._gAs, self._hs, self._gBs

    def _hook_A(self, name):
        def hook(module, inputs, h):
            # sampling / reference passes, or split None: nothing to capture
            if self.split is None or not torch.is_grad_enabled():
                return
            xs, gAs, hs, _ = self.buffers()
            xs.setdefault(name, []).append(inputs[0].detach())  # x (n, T, d_in)
            hs.setdefault(name, []).append(h.detach())  # h = A x (n, T, r)
            # x needs no grad (first block), A none while capturing:
            # a leaf, so gA still arrives; nothing above is lost
            if not h.requires_grad:
                h = h.detach().requires_grad_()
            h.register_hook(self._keep(gAs, name))  # gA = dL/dh
            return h  # replaces lora_A's output (the same values)
        return hook

    def _hook_B(self, name):
        def hook(module, inputs, u):
            capturing = self.split is not None and torch.is_grad_enabled()
            if capturing and u.requires_grad:
                gBs = self.buffers()[3]
                u.register_hook(self._keep(gBs, name))  # gB = dL/d(B h)
        return hook

    def _keep(self, store, name):
        # a tensor hook lives as long as its graph:
        # after remove() no late backward refills
        def keep(g):
            if self.handles:
                store.setdefault(name, []).append(g.detach())
        return keep

    def collect(self, split):
        """{layer: (x, gA, h, gB)} with micro-batches concatenated along the
        sample axis."""
        xs, gAs, hs, gBs = self.buffers(split)
        assert xs, f"nothing captured for split {split!r}: run a forward+backward first"
        # backward visits micro-batches in the order their forwards ran,
        # so list positions pair up; one micro-batch: no copy
        cat = lambda ts: ts[0] if len(ts) == 1 else torch.cat(ts)
        return {n: (cat(xs[n]), cat(gAs[n]), cat(hs[n]), cat(gBs[n]))
                for n in xs}

    def clear(self, split=None):
        for d in self.buffers(split):
            d.clear()

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []
        for w, requires_grad in self.weights.items():
            w.requires_grad_(requires_grad)
        self.clear("train")
        self.clear("val")


@contextmanager
def install_ghost_hooks(model):
    hooks = GhostHooks(model)
    try:
        yield hooks
    finally:
        hooks.remove()  # the model behaves exactly as before


@contextmanager
def ghost_mode(optimizer):
    """Gradient capture without a weight update: optimizer.step() raises
    inside (a step pre-hook, removed on the way out), and the .grad that
    existed before is put back afterwards: capture neither updates nor
    disturbs accumulation."""
    saved = {p: p.grad for g in optimizer.param_groups for p in g["params"]}
    for p in saved:
        p.grad = None

    def refuse(*args):
        raise RuntimeError("optimizer.step() called inside ghost_mode: "
                           "capture must not update")
    handle = optimizer.register_step_pre_hook(refuse)
    try:
        yield
    finally:
        handle.remove()
        # capture's gradients are dropped; what was there before comes back
        for p, g in saved.items():
            p.grad = g


# -----------------------------------------------------------------------------
# inner products

def outer_product_sum(x, g):
    """One linear map's materialised gradient per sample: sum_t g_t x_t^T.
    (n, T, d), (n, T, p) -> (n, p, d)."""
    return torch.einsum("ntp,ntd->npd", g.float(), x.float())  # float32 from bf16 buffers


def ghost_inner_products(x1, g1, x2, g2, chunk=16):
    """<G1_i, G2_j> = sum_{t,s} (g1_it . g2_js)(x1_it . x2_js)
    without forming G. -> (n1, n2)"""
    x2, g2 = x2.float(), g2.float()  # float32 products from bf16 buffers
    out = []
    # chunks bound the (c, n2, T, T) intermediate
    for i in range(0, x1.size(0), chunk):
        gg = torch.einsum("itp,jsp->ijts", g1[i:i + chunk].float(), g2)
        xx = torch.einsum("itd,jsd->ijts", x1[i:i + chunk].float(), x2)
        out.append((gg * xx).sum(dim=(2, 3)))
        del gg, xx  # (c, n2, T, T) each
    return torch.cat(out)


def linear_inner_products(x1, g1, x2, g2):
    """(n1, n2) gradient inner products of one linear map,
    ghost or materialised, whichever costs less."""
    T, d, p = max(x1.size(1), x2.size(1)), x1.size(2), g1.size(2)
    if 2 * T * T < d * p:
        return ghost_inner_products(x1, g1, x2, g2)
    G1 = outer_product_sum(x1, g1).flatten(1)
    G2 = outer_product_sum(x2, g2).flatten(1)
    return G1 @ G2.T


def compute_ghost_inner_product_matrix(train, val, layer_filter=None):
    """[n_train, n_val] <grad L(train_i), grad L(val_j)> over the
    (filtered) LoRA parameters, from GhostHooks.collect() dicts
    {layer: (x, gA, h, gB)}; float32, NaN/Inf kept (callers check)."""
    names = [n for n in train if layer_filter is None or layer_filter in n]
    assert names, f"layer_filter {layer_filter!r} matches no LoRA layer"
    total = 0
    for n in names:
        (x, gA, h, gB), (vx, vgA, vh, vgB) = train[n], val[n]
        of_A = linear_inner_products(x, gA, vx, vgA)
        of_B = linear_inner_products(h, gB, vh, vgB)
        total = total + (of_A + of_B)
    return total


def summed_gradient(model, layer_filter=None):
    """G, the gradient of the loss just back-propagated without hooks, out
    of .grad (then None): {layer: (G_A (r, d_in), G_B (d_out, r))},
    float32. G = sum_j grad L_j for a summed loss (post-hoc's
    sample_losses), sum_j grad L_j / n_val for GRPO's validation loss
    ('grpo')."""
    out = {}
    for name, m in lora_modules(model).items():
        a, b = m.lora_A.weight, m.lora_B.weight
        ready = a.grad is not None and b.grad is not None
        assert ready, f"no gradient in {name}: back-propagate the summed loss first"
        if layer_filter is None or layer_filter in name:
            out[name] = (a.grad.float(), b.grad.float())  # G: float32
        # G is read: the next backward (post-hoc: the train capture) must not add into it
        a.grad = b.grad = None
    return out


def per_sample_grads(captured, names=None):
    """Every sample's LoRA gradient
    {layer: (dA (n, r, d_in), dB^T (n, r, d_out))}, float32, for the
    layers in `names` (default: all), from the hooks' buffers, one batched
    matmul per factor:
        dA_i = sum_t gA_it x_it^T = gA_i^T x_i
        dB_i^T = sum_t h_it gB_it^T = h_i^T gB_i
    (dB transposed: the r-wide factor leads, the faster layout).
    O(T d r) per sample; they serve both the influence and the update."""
    return {n: (outer_product_sum(x, gA), outer_product_sum(gB, h))
            for n, (x, gA, h, gB) in captured.items()
            if names is None or n in names}


def summed_inner_products(grads, summed):
    """(n,) <grad L(sample_i), G> = <dA_i, G_A> + <dB_i, G_B> over the
    layers of G (summed_gradient) from per_sample_grads: one matrix-vector
    product per factor; NaN/Inf: the callers check."""
    total = 0
    for name, (GA, GB) in summed.items():
        dA, dBt = grads[name]
        of_A = dA.flatten(1) @ GA.flatten()
        of_B = dBt.flatten(1) @ GB.T.flatten()
        total = total + (of_A + of_B)
    return total


def squared_norms(grads):
    """(n,) ||grad L(sample_i)||^2 over the layers of per_sample_grads:
    the norms a cosine divides by."""
    return sum(dA.pow(2).sum((1, 2)) + dBt.pow(2).sum((1, 2)) for dA, dBt in grads.values())


def subset_gradients(model, grads, weights):
    """Write sum_i weights_i * grad L(sample_i) into each LoRA parameter's
    .grad from the per-sample gradients (per_sample_grads): the update for
    the selected rollouts needs no extra forward or backward, one
    (n,) x (n, r d) product per factor.
    weights: (n,) bool (kept or not) or float."""
    for name, m in lora_modules(model).items():
        dA, dBt = grads[name]
        w = weights.to(dA.device, torch.float32)
        A, B = m.lora_A.weight, m.lora_B.weight
        gA = (w @ dA.flatten(1)).view(dA.shape[1:])     # (r, d_in)
        gB = (w @ dBt.flatten(1)).view(dBt.shape[1:]).T  # (d_out, r)
        A.grad = gA.to(A.dtype)
        B.grad = gB.to(B.dtype)
