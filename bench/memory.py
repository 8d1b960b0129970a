"""
Peak memory and throughput of one GRPO step. The project's step (project_grpo_step: model.generate
as grpo.make_rollouts calls it, then grpo.policy_backward, clip and AdamW) runs next to
straightforward_grpo_step, the same step written the straightforward way and kept here as the
baseline. Rewards do not matter for either, so random advantages stand in for them; eot_id=-1
(never sampled) runs every completion to full length. bench/run.py prints the two rows:

  memory      peak memory of one step, the project's vs the straightforward one, same inputs and
              seed, each next to predicted_memory's analytic figure. CUDA: max_memory_allocated;
              CPU: peak RSS of a fresh process (memory_child), a proxy.
  throughput  one project step at the throughput size (6 layers x 384, 8 prompts x 8 completions x
              64 tokens), per phase; steps/s, generated tokens/s, completions/s (the target is an H100's).
"""
import copy
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

import grpo
from runs.metrics import PhaseTimer
from bench.scripts import GRPO_DEFAULTS, knob_records
from data.tasks import PROJECT
from scale.compiled import CompiledDecode
from lora import apply_lora, disable_lora, lora_parameters
from model import GPT, GPTConfig
from model import Sampling, generate, uniforms

MB = 1024 ** 2


# ---------------------------------------------------------------------------------------------
# the model, the inputs and the two steps

def lora_gpt(n_layer, n_head, n_embd, vocab, block_size, seed, device):
    """A random-weight GPT with LoRA r=8 on c_attn, c_proj, c_fc (as the GRPO configs). lora_B is drawn
    from N(0, 0.02) instead of the fresh adapter's zeros, so that the policy differs from the reference
    and every pass (KL included) shows in the loss."""
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
                      temperature=1.0, micro_batch_size=0, compile_mode=None):
    """One standard GRPO step with the project's code, rewards replaced by `advantages`: pass 1 is
    model.generate as grpo.sample_rollouts calls it (grpo.lora_for_sampling), passes 2 and 3 and the backward are
    grpo.policy_backward, then clip and AdamW as grpo_step does them.
    compile_mode: the decode step compiled in that torch.compile mode (scale/compiled.CompiledDecode).
    Returns (loss, idx, mask, seconds per phase: generation, reference, policy, optimizer)."""
    dev = str(next(model.parameters()).device)
    decode = CompiledDecode(model, dev, compile_mode) if compile_mode else None
    c = {**GRPO_DEFAULTS, "device": dev, "beta": beta, "temperature": temperature,
         "max_new_tokens": new_tokens, "micro_batch_size": micro_batch_size or prompts.size(0) * group}
    sync = torch.cuda.synchronize if "cuda" in dev else (lambda: None)
    timer = PhaseTimer("reference", "policy")  # the passes' seconds
    times = {}
    t0 = time.perf_counter()
    with amp, grpo.lora_for_sampling(model, decode):  # as grpo.sample_rollouts: W + s B A for pass 1
        u = uniforms(new_tokens, prompts.size(0) * group, seed, dev)
        idx, pad_left, mask = generate(model, prompts.tolist(), new_tokens, eot_id=-1, num_samples=group,
                                       sampling=Sampling(temperature=temperature), u=u, decode=decode)
    sync(); times["generation"] = time.perf_counter() - t0
    batch = grpo.Rollouts(idx=idx, pad_left=pad_left, mask=mask, advantages=advantages)
    step, _ = knob_records(c)
    batch = grpo.with_reference(model, batch, step, timer=timer, amp=amp)  # pass 3, then 2 and backward
    st = grpo.policy_backward(model, batch, step, timer=timer, amp=amp)
    times.update(reference=timer.seconds["reference"], policy=timer.seconds["policy"])
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
    dev = next(model.parameters()).device
    ref_model = copy.deepcopy(model)                                  # a second copy of every weight
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
            cdf = probs.cumsum(-1)                                    # model.sample_next's inverse-CDF draw,
            u = torch.rand(N, generator=gen, device=dev)              # so that both sides sample the same tokens
            nxt = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=cdf.size(-1) - 1)
            idx = torch.cat([idx, nxt], dim=1)
            if t + 1 < new_tokens:
                logits, _ = model(nxt, cache=cache)
        old_logits = torch.stack(step_logits, dim=1)                  # (N, T, V)
        old_logp_all = torch.log_softmax(old_logits.float() / temperature, dim=-1)
        completion = idx[:, P:, None]                                 # (N, T, 1)
        old_logp = old_logp_all.gather(-1, completion).squeeze(-1)
        with disable_lora(ref_model):                                 # the copy without its adapter
            ref_logits, _ = ref_model(idx[:, :-1], keep_last=idx.size(1) - 1)  # (N, P+T-1, V)
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


# ---------------------------------------------------------------------------------------------
# memory: predicted, measured, the row

def predicted_memory(n_params, N, T_prompt, T_new, V, n_layer, n_embd, bytes_per_el, straightforward,
                     group=8, weight_bytes=4, act_c=None, kv_dim=None, micro=None, grad_checkpoint=False):
    """Analytic peak memory of one GRPO step, in bytes above the resident policy weights ('step'), and
    the terms it is made of. bytes_per_el: logits, activations and KV cache (2 under bf16 autocast, 4
    in float32); log-softmax / logsumexp copies are float32 (4) either way; the weights are float32
    (weight_bytes) under autocast too. T = T_new completion positions, L = T_prompt + T_new - 1 all
    positions, S = T_prompt + T_new columns of the cache. kv_dim: the width of keys and values (grouped-query
    attention's fewer heads; n_embd by default); micro: rows per micro-batch of the two passes (N by default);
    grad_checkpoint: each block keeps only its input, and one block's insides live while it is recomputed."""
    b, f, T = bytes_per_el, 4, T_new
    L, S = T_prompt + T_new - 1, T_prompt + T_new
    ntv, nlv = N * T * V, N * L * V
    # activations saved for backward: n_layer * N * S * n_embd * c * b. c = 17 counted with
    # saved_tensors_hooks on this GPT with LoRA in float32 (LayerNorm inputs and outputs 4, q k v 3,
    # attention output and its contiguous copy 2, MLP hidden before and after GELU 4 + 4); under bf16
    # autocast the two LayerNorm inputs stay float32 (2 more units): c = 19 (derived, not counted)
    c = act_c or (17 if b == 4 else 19)
    act = n_layer * N * S * n_embd * c * b
    kv = 2 * n_layer * N * S * (kv_dim or n_embd) * b         # KV cache: 2 * n_layer * N * S * n_embd * b
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
    M = micro or N  # the two passes run one micro-batch of M rows at a time
    ntv = M * T * V
    act = (n_layer * M * S * n_embd * b + M * S * n_embd * c * b if grad_checkpoint  # block inputs + one block
           else n_layer * M * S * n_embd * c * b)
    reference = ntv * b                                       # keep_last logits; log-probs one row at a time
    # pass 2: SelectiveLogSoftmax saves the logits (b) and an (N, T) logsumexp, no float32 copy; its
    # backward builds the logits' gradient row by row and stacks it (briefly two N*T*V*b tensors)
    policy = act + ntv * b + 2 * ntv * b
    terms = dict(sampling=sampling, reference=reference, policy_backward=policy)
    return dict(terms, step=max(terms.values()))


def memory_sizes(cfg):
    """The memory size: on CUDA GPT-2 small (12 layers x 768, vocabulary 50,304), 8 prompts x 8
    completions x 32 + 256 tokens; on CPU 2 layers x 128 wide, 16 + 32 tokens, with the same vocabulary
    and 8x8 sequences (so that logits still dominate); the mem_* keys override either."""
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
    allocations); then one step of `variant` ('project' or 'straightforward').
    Returns the memory before that step and the step's peak, in bytes.
    CUDA: the allocator's counters (memory_allocated before, max_memory_allocated after a reset).
    CPU: there is no allocator counter, so this is a proxy, measured in a fresh process (memory_child):
    the current RSS before the step and the peak RSS after it -- VmHWM after resetting it through
    /proc/self/clear_refs, or else ru_maxrss (then one variant per process). RSS counts a page once it
    is written, and also the small freed blocks that malloc keeps for reuse."""
    dev = s["device"]
    cuda = "cuda" in dev
    model = lora_gpt(s["n_layer"], s["n_head"], s["n_embd"], s["vocab"], s["prompt_len"] + s["new_tokens"],
                     s["seed"], dev)
    model.config.grad_checkpoint = s.get("grad_checkpoint", False)  # (bench/predict.py's check; the project step)
    micro = {"micro_batch_size": s["micro"]} if s.get("micro") else {}
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
    loss, idx, mask = fn(model, opt, prompts, s["group"], s["new_tokens"], adv, amp, s["seed"], **micro)[:3]
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
    for v in variants:
        print("MEMORY " + json.dumps({"variant": v, **memory_variant(v, json.loads(sizes_json))}), flush=True)
        gc.collect()


def measure_memory(s):
    """memory_variant's result for 'project' and 'straightforward', by variant name. CUDA: in this
    process, one after the other. CPU: in a fresh process (memory_child), both variants in it if its
    peak RSS can be reset, else one process each."""
    variants = ("project", "straightforward")
    res = {}
    if "cuda" in s["device"]:
        for v in variants:
            res[v] = memory_variant(v, s)
            gc.collect(); torch.cuda.empty_cache()
        return res
    # MALLOC_MMAP_THRESHOLD_: glibc mmaps every block >= 1 MB and unmaps it on free, so RSS follows
    # the live tensors (by default it raises the threshold to 32 MB as blocks are freed, and keeps
    # freed blocks below it: 0.5-1 GB more RSS here, and a second variant reusing the first's)
    groups = [variants] if os.access("/proc/self/clear_refs", os.W_OK) else [(v,) for v in variants]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    procs = [subprocess.Popen([sys.executable, "-c",
                               f"from bench import memory; memory.memory_child({g!r}, {json.dumps(s)!r})"],
                              cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for g in groups]
    for g, p in zip(groups, procs):
        out, err = p.communicate()
        for line in out.splitlines():
            if line.startswith("MEMORY "):
                r = json.loads(line[len("MEMORY "):])
                res[r["variant"]] = r
        if p.returncode or any(v not in res for v in g):
            raise RuntimeError(f"memory child {g} failed (exit {p.returncode}): {err.strip()[-2000:]}")
    return res


def _mb(x):
    """Bytes as MB: no decimals from 100 MB on, one below."""
    x /= MB
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def bench_memory(cfg):
    """Peak memory of one GRPO step: the project's code vs straightforward_grpo_step, same inputs and seed,
    each above the setup and next to predicted_memory's figure."""
    s = memory_sizes(cfg)
    cuda = "cuda" in s["device"]
    res = measure_memory(s)
    N = s["n_prompts"] * s["group"]
    pred = {v: predicted_memory(res[v]["n_params"], N, s["prompt_len"], s["new_tokens"], s["vocab"], s["n_layer"],
                                s["n_embd"], 2 if cuda else 4, v == "straightforward", group=s["group"])["step"]
            for v in res}
    inc = {v: res[v]["peak"] - res[v]["before"] for v in res}
    ratio = inc["project"] / inc["straightforward"]
    p, q = res["project"], res["straightforward"]
    what = "CUDA max_memory_allocated" if cuda else "peak RSS (a CPU proxy, not CUDA memory) in a fresh process"
    detail = (f"{s['n_layer']} layers, {s['n_embd']} wide, vocab {s['vocab']}, {s['n_prompts']}x{s['group']} seqs, "
              f"{s['prompt_len']} prompt + {s['new_tokens']} new tokens, {'bf16 autocast' if cuda else 'float32'}, "
              f"micro-batch {N} (the whole batch, as the baseline), beta 0.04; "
              f"{what} above the setup: project {_mb(inc['project'])} MB (predicted {_mb(pred['project'])}) vs "
              f"straightforward {_mb(inc['straightforward'])} MB (predicted {_mb(pred['straightforward'])}); "
              f"absolute peak {p['peak'] / MB:,.0f} vs {q['peak'] / MB:,.0f} MB; "
              f"loss {p['loss']:.6f} vs {q['loss']:.6f}, same tokens: {p['tokens'] == q['tokens']}")
    return [("memory", detail, f"{ratio * 100:.0f} %", "<= 60 % of straightforward",
             "met" if ratio <= 0.6 else "MISSED")]


# ---------------------------------------------------------------------------------------------
# throughput

def bench_throughput(cfg):
    """A standard GRPO step (generation + policy_backward with beta > 0 + clip + AdamW) at the throughput
    size (6 layers x 384, a ~100-token vocabulary, 8 prompts x 8 completions x 64 tokens), per phase,
    warm-up then median."""
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
