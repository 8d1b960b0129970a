"""
Speed claims measured side by side in one process (same inputs, warm-up, median of repeats).

    python bench.py                      # CPU
    python bench.py --device=cuda        # GPU
    python bench.py --quick=True         # tiny sizes (what the tests run)

Rows (issue 4/4):
  sampling   KV-cache generation vs nanoGPT-style full recompute of the whole prefix per token;
             tokens/s, ratio, and whether the greedy tokens are identical.
  step cost  one TracIn-GRPO step / one standard GRPO step on the same prompts, per phase
             (seed 000's timing table: generation, reward, grad capture train/val, influence, training)
  influence  train x val gradient inner products: the hooks (ghost / materialised by cost) vs a
             per-sample autograd loop (seed 001's method) vs torch.func vmap; time and max
             relative error against the loop.
  memory     peak memory of one GRPO step, the project's code (sample.generate + policy_backward) vs
             straightforward_grpo_step (keeps sampling logits, full log_softmax, deepcopy reference,
             no del), same inputs and seed, each next to predicted_memory's analytic figure. CUDA:
             max_memory_allocated; CPU: peak RSS of a fresh process per variant (a proxy).
  throughput one standard GRPO step of 8x8 completions x 64 tokens on a 6-layer, 384-wide model, per
             phase; steps/s, generated tokens/s, completions/s (the target is an H100's).
Writes the markdown table to bench_<device>.md as well.
"""
import contextlib
import io
import statistics
import sys
import time
import warnings

import torch

from configurator import check, configure, cli_main

defaults = dict(
    device="cpu",
    quick=False,          # small sizes: a smoke run
    repeats=3,
    n_seq=64,             # sampling: sequences
    new_tokens=256,       # sampling: new tokens per sequence
    n_train=64,           # influence: train rollouts
    n_val=16,             # influence: validation rollouts
    seq_lens=(64, 256),   # influence: completion lengths T
    base_ckpt="out/base/ckpt.pt",  # step cost: this base model if it exists, else random weights
    step_batch_size=8,    # step cost: prompts x group_size 8, as config/tiny_tracin.py
    step_val_batch_size=16,
    step_repeats=7,       # step cost: rounds of (standard, pg, nll); one step is short and the ratio noisy
    data_root="",         # step cost without a base model: where to build the task data ('' = data/gsm_synth)
    mem_n_layer=0,        # memory: 0 = by device (CUDA: GPT-2 small, 12 layers; CPU: 2)
    mem_n_head=0,         # memory: 0 = by device (12 / 2)
    mem_n_embd=0,         # memory: 0 = by device (768 / 128)
    mem_vocab=50304,      # memory: GPT-2's vocabulary, padded
    mem_prompts=8,        # memory: prompts x group
    mem_group=8,
    mem_prompt_len=0,     # memory: 0 = by device (32 / 16)
    mem_new_tokens=0,     # memory: 0 = by device (256 / 32)
    thr_n_layer=6,        # throughput: the model and step
    thr_n_head=6,
    thr_n_embd=384,
    thr_vocab=96,
    thr_prompts=8,
    thr_group=8,
    thr_prompt_len=24,
    thr_new_tokens=64,
    thr_repeats=0,        # throughput: 0 = repeats on CUDA, 1 on CPU (one step takes seconds there)
    seed=0,
)


def timed(fn, device, repeats):
    """Median seconds of `repeats` calls after one warm-up call; returns (seconds, last result)."""
    sync = torch.cuda.synchronize if "cuda" in device else (lambda: None)
    out = fn()
    times = []
    for _ in range(repeats):
        sync(); t0 = time.perf_counter()
        out = fn()
        sync(); times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_model(device, block_size, vocab_size=395):
    """The tiny-config GPT (4 layers, 64 wide, vocab 395) with random weights, larger context."""
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=4, n_head=4, n_embd=64)
    return GPT(cfg).to(device).eval()


@torch.no_grad()
def full_recompute_greedy(model, idx, new_tokens):
    """nanoGPT's generate: the whole sequence through the model for every new token."""
    for _ in range(new_tokens):
        logits, _ = model(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def bench_sampling(cfg):
    from sample import generate
    dev, n, T = cfg["device"], cfg["n_seq"], cfg["new_tokens"]
    model = bench_model(dev, 32 + T)
    g = torch.Generator().manual_seed(cfg["seed"])
    prompts = torch.randint(1, 394, (n, 32), generator=g)  # eot (394) never in prompts
    t_kv, (idx_kv, _, _) = timed(lambda: generate(model, prompts.tolist(), T, eot_id=-1, temperature=0),
                                 dev, cfg["repeats"])
    t_full, idx_full = timed(lambda: full_recompute_greedy(model, prompts.to(dev), T), dev, cfg["repeats"])
    same = torch.equal(idx_kv.cpu(), idx_full.cpu())
    ratio = t_full / t_kv
    return [("sampling", f"KV cache {n * T / t_kv:,.0f} tok/s vs full recompute {n * T / t_full:,.0f} tok/s "
             f"({n} seqs x {T} new tokens); identical greedy tokens: {same}", f"{ratio:.1f}x", ">= 5x",
             "met" if ratio >= 5 and same else "MISSED")]


def bench_influence(cfg):
    """Hooks vs per-sample loop vs vmap on the same GRPO loss, LoRA r=8 on every projection."""
    import tracin
    from lora import apply_lora
    from torch.func import functional_call, grad, vmap
    from grpo import completion_logprobs, grpo_loss, selective_log_softmax
    dev, rows = cfg["device"], []
    for T in cfg["seq_lens"]:
        model = bench_model(dev, 32 + T)
        apply_lora(model, r=8, alpha=16, targets=("c_attn", "c_proj", "c_fc"))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
        model.train()
        g = torch.Generator().manual_seed(cfg["seed"])
        n_tr, n_va = cfg["n_train"], cfg["n_val"]
        idx = torch.randint(0, 394, (n_tr + n_va, 32 + T), generator=g).to(dev)
        pad = torch.zeros(n_tr + n_va, dtype=torch.long, device=dev)
        mask = torch.ones(n_tr + n_va, T, dtype=torch.long, device=dev)
        adv = torch.randn(n_tr + n_va, generator=g).to(dev)
        tr, va = slice(0, n_tr), slice(n_tr, n_tr + n_va)

        def loss_of(sl):
            logp, _ = completion_logprobs(model, idx[sl], pad[sl], T, 1.0)
            return grpo_loss(logp, logp.detach(), None, adv[sl], mask[sl], 0.0, num_seqs=1)[0]

        def hooks():
            with tracin.install_ghost_hooks(model) as h:
                h.split = "train"; loss_of(tr).backward()
                h.split = "val"; loss_of(va).backward()
                m = tracin.compute_ghost_inner_product_matrix(h.collect("train"), h.collect("val"))
            model.zero_grad(set_to_none=True)
            return m

        params = [p for n, p in model.named_parameters() if ".lora_" in n]

        def loop():
            flat = []
            for i in range(n_tr + n_va):
                gs = torch.autograd.grad(loss_of(slice(i, i + 1)), params)
                flat.append(torch.cat([x.flatten().float() for x in gs]))
            G = torch.stack(flat)
            return G[:n_tr] @ G[n_tr:].T

        pdict = {n: p.detach() for n, p in model.named_parameters() if ".lora_" in n}

        def one(p, x, a):  # the same padding-mask attention as the hooks and the loop (pad_left = 0)
            logits, _ = functional_call(model, p, (x[None, :-1],), {"keep_last": T, "pad_left": pad[:1]})
            lp = selective_log_softmax(logits, x[None, -T:])
            return -(a * lp.mean())

        def vmapped():
            out = vmap(grad(one), in_dims=(None, 0, 0))(pdict, idx, adv)
            G = torch.cat([v.flatten(1).float() for v in out.values()], 1)
            return G[:n_tr] @ G[n_tr:].T

        t_loop, ref = timed(loop, dev, 1)
        t_hooks, got = timed(hooks, dev, cfg["repeats"])
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        try:
            with warnings.catch_warnings():  # CPU SDPA has no vmap batching rule: vmap loops over it (README)
                warnings.filterwarnings("ignore", "There is a performance drop")
                t_vmap, vm = timed(vmapped, dev, cfg["repeats"])
            vmap_txt = f"vmap {t_vmap * 1000:.0f} ms (err {((vm - ref).abs().max() / ref.abs().max()).item():.1e})"
        except Exception as e:  # vmap cannot trace every op; say so instead of failing the bench
            vmap_txt = f"vmap failed: {type(e).__name__}"
        ratio = t_loop / t_hooks
        rows.append((f"influence T={T}", f"{n_tr} train x {n_va} val: hooks {t_hooks * 1000:.0f} ms, loop "
                     f"{t_loop * 1000:.0f} ms, {vmap_txt}; hooks max rel err vs loop {err:.1e}",
                     f"{ratio:.1f}x", ">= 20x, err <= 1e-5", "met" if ratio >= 20 and err <= 1e-5 else "MISSED"))
    return rows


def bench_step_cost(cfg):
    """Standard vs TracIn grpo_step on the same prompts with the same sampling seed, per phase."""
    import os
    import random
    import train_grpo as tg
    from lora import apply_lora, lora_parameters
    from model import load_checkpoint, model_from_checkpoint
    from data.gsm_synth.prepare import load_tokenizer, load_split
    dev = cfg["device"]
    if os.path.exists(cfg["base_ckpt"]):
        ck = load_checkpoint(cfg["base_ckpt"])
        model, data_dir, what = model_from_checkpoint(ck), ck["data_dir"], cfg["base_ckpt"]
    else:  # random weights on the tiny task: same shapes, garbage completions
        from data.gsm_synth.prepare import prepare, ROOT
        data_dir = prepare(2, 10, "+-", 0.55, verbose=False, root=cfg["data_root"] or ROOT)
        model, what = bench_model(dev, 96, load_tokenizer(data_dir).n_vocab), "random weights"
    enc = load_tokenizer(data_dir)
    apply_lora(model, 8, 16, 0.0, ("c_attn", "c_proj", "c_fc"))
    model.to(dev)
    rng = random.Random(cfg["seed"])
    train, val = load_split(data_dir, "train"), load_split(data_dir, "val")
    tb = [train[rng.randrange(len(train))] for _ in range(cfg["step_batch_size"])]
    vb = [val[rng.randrange(len(val))] for _ in range(cfg["step_val_batch_size"])]
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled="cuda" in dev)
    modes = ("standard", "pg", "nll")  # TracIn's validation loss: sampled rollouts, or reference solutions
    runs = {mode: [] for mode in modes}
    for r in range(cfg["step_repeats"] + 1):  # the first round is a warm-up
        for mode in modes:  # interleaved, so that a slow spell of a shared machine hits every mode alike
            c = {**tg.defaults, "device": dev, "beta": 0.0, "tracin": mode != "standard", "micro_batch_size": 64,
                 "tracin_val_loss": mode if mode != "standard" else "pg"}
            opt = torch.optim.AdamW(lora_parameters(model), lr=0.0)  # lr 0: the weights stay as they are
            gen = torch.Generator(device=dev).manual_seed(cfg["seed"])
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # its notices ("no rollout kept") are not bench output
                log, _ = tg.grpo_step(model, opt, enc, [e["question"] for e in tb], [e["answer"] for e in tb], c,
                                      gen, amp, vb if c["tracin"] else None)
            log["total"] = time.perf_counter() - t0
            if r > 0:
                runs[mode].append(log)
    phases = {mode: {k: statistics.median(l.get(k, 0.0) for l in runs[mode])
                     for k in ("time/generation", "time/reward", "time/grad_capture_train", "time/grad_capture_val",
                               "time/influence", "time/policy", "time/optimizer", "total")} for mode in modes}
    s = phases["standard"]
    rows = []
    for mode, name in (("pg", "val = sampled rollouts (seed 000)"), ("nll", "val = reference solutions")):
        t = phases[mode]
        ratio = t["total"] / s["total"]
        detail = (f"{what}; {name}; standard: generation {s['time/generation']:.2f} s, reward "
                  f"{s['time/reward']:.3f} s, training (pass 2 + backward + AdamW) "
                  f"{s['time/policy'] + s['time/optimizer']:.2f} s, total {s['total']:.2f} s; TracIn: generation "
                  f"{t['time/generation']:.2f} s, reward {t['time/reward']:.3f} s, grad capture train "
                  f"{t['time/grad_capture_train']:.2f} s, grad capture val {t['time/grad_capture_val']:.2f} s, "
                  f"influence {t['time/influence']:.3f} s, training {t['time/optimizer']:.3f} s, "
                  f"total {t['total']:.2f} s")
        rows.append((f"step cost, TracIn {mode}", detail, f"{ratio:.2f}x", "<= 1.3x (seed: 2.0x)",
                     "met" if ratio <= 1.3 else "MISSED"))
    return rows


# ---------------------------------------------------------------------------------------------
# memory and throughput: one GRPO step with the project's own functions (train_grpo, sample) vs a
# straightforward implementation kept here as the baseline. Rewards do not matter for either, so
# random advantages stand in for them; eot_id=-1 (never sampled) runs every completion to full length.

def lora_gpt(n_layer, n_head, n_embd, vocab, block_size, seed, device):
    """A random-weight GPT with LoRA r=8 on c_attn, c_proj, c_fc (as the GRPO configs). lora_B is drawn
    from N(0, 0.02) instead of the fresh adapter's zeros, so that the policy differs from the reference
    and every pass (KL included) shows in the loss."""
    from lora import apply_lora
    from model import GPT, GPTConfig
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=vocab, n_layer=n_layer, n_head=n_head, n_embd=n_embd))
    apply_lora(model, 8, 16, 0.0, ("c_attn", "c_proj", "c_fc"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    return model.to(device)


def step_inputs(n_prompts, group, prompt_len, vocab, seed):
    """Random prompts (n_prompts, prompt_len) and random advantages (n_prompts * group,), on the CPU."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n_prompts, prompt_len), generator=g), torch.randn(n_prompts * group, generator=g)


def project_grpo_step(model, optimizer, prompts, group, new_tokens, advantages, amp, seed, beta=0.04,
                      temperature=1.0, micro_batch_size=0):
    """One standard GRPO step with the project's code, rewards replaced by `advantages`: pass 1 is
    sample.generate as make_rollouts calls it, passes 2 and 3 and the backward are
    train_grpo.policy_backward, then clip and AdamW as grpo_step does them.
    Returns (loss, idx, mask, seconds per phase: generation, reference, policy, optimizer)."""
    import train_grpo as tg
    from lora import lora_parameters
    from sample import generate
    dev = str(next(model.parameters()).device)
    c = {**tg.defaults, "device": dev, "beta": beta, "temperature": temperature, "max_new_tokens": new_tokens,
         "micro_batch_size": micro_batch_size or prompts.size(0) * group}
    sync = torch.cuda.synchronize if "cuda" in dev else (lambda: None)
    times = {"reference": 0.0, "policy": 0.0}
    t0 = time.perf_counter()
    with amp:
        idx, pad_left, mask = generate(model, prompts.tolist(), new_tokens, eot_id=-1, num_samples=group,
                                       temperature=temperature,
                                       generator=torch.Generator(device=dev).manual_seed(seed))
    sync(); times["generation"] = time.perf_counter() - t0
    st = tg.policy_backward(model, dict(idx=idx, pad_left=pad_left, mask=mask, advantages=advantages),
                            c, amp, times, beta)
    t0 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(lora_parameters(model), c["grad_clip"])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(); times["optimizer"] = time.perf_counter() - t0
    return sum(st["losses"]), idx, mask, times


def straightforward_grpo_step(model, optimizer, prompts, group, new_tokens, advantages, amp, seed, beta=0.04,
                              temperature=1.0, epsilon=0.2, eot_id=-1, grad_clip=1.0):
    """The same GRPO step (loss_type 'grpo', k3 KL, same sampling ops and generator) the way a first
    implementation writes it; the memory row's baseline. Sampling keeps every step's logits to take
    the old log-probs from them, log_softmax runs over the whole vocabulary at every position, the
    reference policy is a deep copy of the model, and nothing is deleted before the function returns.
    Returns (loss, idx, mask); the LoRA gradients stay in .grad."""
    import copy
    from lora import lora_modules, lora_parameters
    dev = next(model.parameters()).device
    ref_model = copy.deepcopy(model)                                  # a second copy of every weight
    for m in lora_modules(ref_model):
        m.disabled = True
    idx = prompts.to(dev).repeat_interleave(group, dim=0)             # (N, P); each row prefills its prompt
    N, P = idx.shape
    gen = torch.Generator(device=dev).manual_seed(seed)
    model.eval()
    step_logits = []
    with torch.no_grad(), amp:
        cache = model.new_cache(N, P + new_tokens)
        logits, _ = model(idx, cache=cache)
        for t in range(new_tokens):
            step_logits.append(logits[:, -1])                         # (N, V), kept for the old log-probs
            probs = torch.softmax(logits[:, -1].float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)
            idx = torch.cat([idx, nxt], dim=1)
            if t + 1 < new_tokens:
                logits, _ = model(nxt, cache=cache)
        old_logits = torch.stack(step_logits, dim=1)                  # (N, T, V)
        old_logp_all = torch.log_softmax(old_logits.float() / temperature, dim=-1)
        completion = idx[:, P:, None]                                 # (N, T, 1)
        old_logp = old_logp_all.gather(-1, completion).squeeze(-1)
        ref_logits, _ = ref_model(idx[:, :-1], keep_last=idx.size(1) - 1)   # every position: (N, P+T-1, V)
        ref_logp_all = torch.log_softmax(ref_logits.float() / temperature, dim=-1)
        ref_logp = ref_logp_all[:, P - 1:].gather(-1, completion).squeeze(-1)
    is_eot = (idx[:, P:] == eot_id).long()
    mask = ((is_eot.cumsum(1) - is_eot) == 0).float()                 # up to and including the first eot
    model.train()
    optimizer.zero_grad()
    with amp:
        logits, _ = model(idx[:, :-1], keep_last=idx.size(1) - 1)
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
        logp = logp_all[:, P - 1:].gather(-1, completion).squeeze(-1)
        ratio = torch.exp(logp - old_logp)
        A = advantages.to(dev)[:, None]
        surrogate = torch.min(ratio * A, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * A)
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        per_token = -surrogate + beta * kl
        loss = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(lora_parameters(model), grad_clip)
    optimizer.step()
    return loss.item(), idx, mask


def predicted_memory(n_params, N, T_prompt, T_new, V, n_layer, n_embd, bytes_per_el, straightforward,
                     group=8, weight_bytes=4, act_c=None):
    """Analytic peak memory of one GRPO step, in bytes above the resident policy weights ('step'), and
    the terms it is made of. bytes_per_el: logits, activations and KV cache (2 under bf16 autocast, 4
    in float32); log-softmax / logsumexp copies are float32 (4) either way; the weights are float32
    (weight_bytes) under autocast too. T = T_new completion positions, L = T_prompt + T_new - 1 all
    positions, S = T_prompt + T_new columns of the cache."""
    b, f, T = bytes_per_el, 4, T_new
    L, S = T_prompt + T_new - 1, T_prompt + T_new
    ntv, nlv = N * T * V, N * L * V
    # activations saved for backward: n_layer * N * S * n_embd * c * b. c = 17 counted with
    # saved_tensors_hooks on this GPT with LoRA in float32 (LayerNorm inputs and outputs 4, q k v 3,
    # attention output and its contiguous copy 2, MLP hidden before and after GELU 4 + 4); under bf16
    # autocast the two LayerNorm inputs stay float32 (2 more units): c = 19 (not measured: no GPU)
    c = act_c or (17 if b == 4 else 19)
    act = n_layer * N * S * n_embd * c * b
    kv = 2 * n_layer * N * S * n_embd * b                     # KV cache: 2 * n_layer * N * S * n_embd * b
    if straightforward:  # nothing is deleted: everything below is alive at the log_softmax backward
        terms = dict(
            ref_copy=n_params * weight_bytes,                 # deepcopy of the weights: n_params * 4
            kv_cache=kv,
            sampling_logits=2 * ntv * b,                      # the list of (N, V) + torch.stack: 2 * N*T*V * b
            old_log_softmax=ntv * f,                          # log_softmax of those: N*T*V * 4
            ref_pass=nlv * (b + f),                           # logits + log_softmax, every position: N*L*V * (b+4)
            policy_pass=nlv * (b + f),                        # the same, log_softmax saved for backward
            backward=2 * nlv * f,                             # grads of log_softmax's output and input: 2 * N*L*V * 4
            activations=act)
        return dict(terms, step=sum(terms.values()))
    # project: three passes one after the other, each one's tensors freed before the next
    # the cache for the prompts and its group-fold copy, briefly both; one step's logits, float copy, probs
    sampling = kv * (1 + 1 / group) + 3 * N * V * f
    reference = ntv * b                                       # keep_last logits; log-probs one row at a time
    # pass 2: SelectiveLogSoftmax saves the logits (b) and an (N, T) logsumexp, no float32 copy; its
    # backward builds the logits' gradient row by row and stacks it (briefly two N*T*V*b tensors)
    policy = act + ntv * b + 2 * ntv * b
    terms = dict(sampling=sampling, reference=reference, policy_backward=policy)
    return dict(terms, step=max(terms.values()))


def memory_sizes(cfg):
    """The issue's GPT-2-small step on CUDA; on CPU 2 layers x 128 wide, 16 + 32 tokens, with the same
    vocabulary and 8x8 sequences (so that logits still dominate), unless the mem_* keys say otherwise."""
    cuda = "cuda" in cfg["device"]
    return dict(n_layer=cfg["mem_n_layer"] or (12 if cuda else 2), n_head=cfg["mem_n_head"] or (12 if cuda else 2),
                n_embd=cfg["mem_n_embd"] or (768 if cuda else 128), vocab=cfg["mem_vocab"],
                n_prompts=cfg["mem_prompts"], group=cfg["mem_group"],
                prompt_len=cfg["mem_prompt_len"] or (32 if cuda else 16),
                new_tokens=cfg["mem_new_tokens"] or (256 if cuda else 32), seed=cfg["seed"], device=cfg["device"])


def _proc_status_bytes(key):
    """VmRSS (current) or VmHWM (peak since start or the last reset) of this process, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _reset_peak_rss():
    """Set this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_variant(variant, s):
    """Build the model, optimizer and inputs (the setup) and run a tiny warm-up step (lr 0: first-call
    allocations, lazy imports); then one step of `variant` ('project' or 'straightforward').
    Returns the memory before that step and the step's peak, in bytes.
    CUDA: the allocator's counters (memory_allocated before, max_memory_allocated after a reset).
    CPU: there is no allocator counter, so this is a proxy, measured in a fresh process (memory_child):
    the current RSS before the step and the peak RSS after it -- VmHWM after resetting it through
    /proc/self/clear_refs, or else ru_maxrss (then one variant per process). RSS counts a page once it
    is written, and also the small freed blocks that malloc keeps for reuse."""
    import resource
    from lora import lora_parameters
    dev = s["device"]
    cuda = "cuda" in dev
    model = lora_gpt(s["n_layer"], s["n_head"], s["n_embd"], s["vocab"], s["prompt_len"] + s["new_tokens"],
                     s["seed"], dev)
    opt = torch.optim.AdamW(lora_parameters(model), lr=1e-3)
    prompts, adv = step_inputs(s["n_prompts"], s["group"], s["prompt_len"], s["vocab"], s["seed"])
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    fn = project_grpo_step if variant == "project" else straightforward_grpo_step
    fn(model, torch.optim.AdamW(lora_parameters(model), lr=0.0), prompts[:1], 2, 2, adv[:2], amp, s["seed"])
    if cuda:
        torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        reset = _reset_peak_rss()
        before = _proc_status_bytes("VmRSS")
    t0 = time.perf_counter()
    loss, idx, mask = fn(model, opt, prompts, s["group"], s["new_tokens"], adv, amp, s["seed"])[:3]
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _proc_status_bytes("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return dict(before=before, peak=peak, loss=loss, tokens=hash(tuple(idx.flatten().tolist())),
                seconds=time.perf_counter() - t0, n_params=sum(p.numel() for p in model.parameters()))


def memory_child(variants, sizes_json):
    """Entry point of the fresh process that measures variants on CPU, one after the other (prints one
    JSON line each). Each variant builds its own model; the project's runs first, so that heap blocks
    freed by one step and reused by the next can only flatter the straightforward figure."""
    import gc
    import json
    for v in variants:
        print("MEMORY " + json.dumps({"variant": v, **memory_variant(v, json.loads(sizes_json))}), flush=True)
        gc.collect()


def bench_memory(cfg):
    """Peak memory of one GRPO step: the project's code vs straightforward_grpo_step, same inputs and seed."""
    import gc
    import json
    import os
    import subprocess
    s = memory_sizes(cfg)
    cuda = "cuda" in s["device"]
    variants = ("project", "straightforward")
    res = {}
    if cuda:
        for v in variants:
            res[v] = memory_variant(v, s)
            gc.collect(); torch.cuda.empty_cache()
    else:  # a fresh process; both variants in it if its peak RSS can be reset, else one process each.
        # MALLOC_MMAP_THRESHOLD_: glibc mmaps every block >= 1 MB and unmaps it on free, so RSS follows
        # the live tensors (by default it raises the threshold to 32 MB as blocks are freed, and keeps
        # freed blocks below it: 0.5-1 GB more RSS here, and a second variant reusing the first's)
        here = os.path.dirname(os.path.abspath(__file__))
        groups = [variants] if os.access("/proc/self/clear_refs", os.W_OK) else [(v,) for v in variants]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
        procs = [subprocess.Popen([sys.executable, "-c", f"import bench; bench.memory_child({g!r}, {json.dumps(s)!r})"],
                                  cwd=here, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for g in groups]
        for g, p in zip(groups, procs):
            out, err = p.communicate()
            for line in out.splitlines():
                if line.startswith("MEMORY "):
                    r = json.loads(line[len("MEMORY "):])
                    res[r["variant"]] = r
            if p.returncode or any(v not in res for v in g):
                raise RuntimeError(f"memory child {g} failed (exit {p.returncode}): {err.strip()[-2000:]}")
    b = 2 if cuda else 4
    N = s["n_prompts"] * s["group"]
    pred = {v: predicted_memory(res[v]["n_params"], N, s["prompt_len"], s["new_tokens"], s["vocab"], s["n_layer"],
                                s["n_embd"], b, v == "straightforward", group=s["group"])
            for v in res}
    mb = 1024 ** 2

    def fmt(x):  # MB
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"
    inc = {v: (res[v]["peak"] - res[v]["before"]) / mb for v in res}
    ratio = inc["project"] / inc["straightforward"]
    p, q = res["project"], res["straightforward"]
    what = "CUDA max_memory_allocated" if cuda else "peak RSS (a CPU proxy, not CUDA memory) in a fresh process"
    detail = (f"{s['n_layer']} layers, {s['n_embd']} wide, vocab {s['vocab']}, {s['n_prompts']}x{s['group']} seqs, "
              f"{s['prompt_len']} prompt + {s['new_tokens']} new tokens, {'bf16 autocast' if cuda else 'float32'}, "
              f"micro-batch {N} (the whole batch, as the baseline), beta 0.04; "
              f"{what} above the setup: project {fmt(inc['project'])} MB (predicted "
              f"{fmt(pred['project']['step'] / mb)}) vs straightforward {fmt(inc['straightforward'])} MB (predicted "
              f"{fmt(pred['straightforward']['step'] / mb)}); absolute peak {p['peak'] / mb:,.0f} vs "
              f"{q['peak'] / mb:,.0f} MB; loss {p['loss']:.6f} vs {q['loss']:.6f}, same tokens: "
              f"{p['tokens'] == q['tokens']}")
    return [("memory", detail, f"{ratio * 100:.0f} %", "<= 60 % of straightforward",
             "met" if ratio <= 0.6 else "MISSED")]


def bench_throughput(cfg):
    """A standard GRPO step (generation + policy_backward with beta > 0 + clip + AdamW) on the issue's
    6-layer, 384-wide model with a ~100-token vocabulary, per phase, warm-up then median."""
    from lora import lora_parameters
    dev = cfg["device"]
    cuda = "cuda" in dev
    B, G, P, T = cfg["thr_prompts"], cfg["thr_group"], cfg["thr_prompt_len"], cfg["thr_new_tokens"]
    model = lora_gpt(cfg["thr_n_layer"], cfg["thr_n_head"], cfg["thr_n_embd"], cfg["thr_vocab"], P + T, cfg["seed"],
                     dev)
    opt = torch.optim.AdamW(lora_parameters(model), lr=1e-4)
    prompts, adv = step_inputs(B, G, P, cfg["thr_vocab"], cfg["seed"])
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    repeats = cfg["thr_repeats"] or (cfg["repeats"] if cuda else 1)
    runs = []
    for r in range(repeats + 1):  # the first is a warm-up
        sync(); t0 = time.perf_counter()
        _, idx, mask, times = project_grpo_step(model, opt, prompts, G, T, adv, amp, cfg["seed"] + r, beta=0.04,
                                                micro_batch_size=64)
        sync(); times["step"] = time.perf_counter() - t0
        assert mask.size(1) == T and bool(mask.all()), "every completion must run to full length"
        runs.append(times)
    m = {k: statistics.median(run[k] for run in runs[1:])
         for k in ("generation", "reference", "policy", "optimizer", "step")}
    N, step = B * G, m["step"]
    detail = (f"{cfg['thr_n_layer']} layers, {cfg['thr_n_head']} heads, {cfg['thr_n_embd']} wide, vocab "
              f"{cfg['thr_vocab']}, {B}x{G} seqs x {T} new tokens ({P}-token prompts), "
              f"{'bf16 autocast' if cuda else 'float32'}, beta 0.04, LoRA r 8, micro-batch 64, median of {repeats}: "
              f"step {step:.3f} s = generation {m['generation']:.3f} + reference {m['reference']:.3f} + "
              f"policy+backward {m['policy']:.3f} + optimizer {m['optimizer']:.4f} s; {1 / step:.2f} steps/s, "
              f"{N * T / step:,.0f} generated tok/s, {N / step:,.0f} completions/s")
    verdict = ("met" if step <= 0.12 else "MISSED") if cuda else "n/a (H100 target)"
    return [("throughput", detail, f"{step / 0.12:.2f}x of 0.12 s", "<= 0.12 s/step (>= 500 completions/s) on an H100",
             verdict)]


def main(argv):
    cfg = configure(defaults, argv)
    for k, v in cfg.items():  # sizes and counts; the mem_ ones and thr_repeats take 0 for "by device"
        if isinstance(v, int) and not isinstance(v, bool) and k != "seed":
            auto = k.startswith("mem_") or k == "thr_repeats"
            check(cfg, k, v >= 0 if auto else v > 0, "must be >= 0 (0 = by device)" if auto else "must be > 0")
    check(cfg, "seq_lens", len(cfg["seq_lens"]) > 0 and all(isinstance(t, int) and t > 0 for t in cfg["seq_lens"]),
          "one or more positive completion lengths, e.g. (64, 256)")
    from model import check_device
    check_device(cfg["device"])
    if cfg["quick"]:
        cfg.update(n_seq=4, new_tokens=16, n_train=4, n_val=2, seq_lens=(8,), repeats=1, step_repeats=1,
                   step_batch_size=2, step_val_batch_size=2)
        cfg.update(mem_n_layer=1, mem_n_head=2, mem_n_embd=32, mem_vocab=512, mem_prompts=2, mem_group=2,
                   mem_prompt_len=8, mem_new_tokens=8, thr_n_layer=1, thr_n_head=2, thr_n_embd=32, thr_prompts=2,
                   thr_group=2, thr_prompt_len=8, thr_new_tokens=8)
    torch.manual_seed(cfg["seed"])
    rows, t0 = [], time.time()
    for fn in (bench_sampling, bench_step_cost, bench_influence, bench_memory, bench_throughput):
        print(f"bench: {fn.__name__[len('bench_'):]} ({time.time() - t0:.0f} s so far)", file=sys.stderr, flush=True)
        rows += fn(cfg)
    dev_name = torch.cuda.get_device_name() if "cuda" in cfg["device"] else "CPU"
    lines = [f"bench.py on {dev_name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}", "",
             "| row | measured | ratio | target | verdict |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if not cfg["quick"]:
        with open(f"bench_{cfg['device'].split(':')[0]}.md", "w") as f:
            f.write(text + "\n")
    return rows


if __name__ == "__main__":
    cli_main(main)
