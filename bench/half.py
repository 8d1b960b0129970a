"""
The `half precision` rows of bench/run.py: one standard GRPO step in float32 against the same step with
the frozen base stored in bfloat16 under bf16 autocast (what train_grpo.py does with dtype='bfloat16'),
side by side in one process, per phase, at three shapes: the tiny GPT (4 x 128), 6 layers x 384 (the
throughput size) and GPT-2 small (12 x 768, vocabulary 50,304). Then, on the SAME rollouts (sampled
once in float32), the loss and the LoRA gradient of both, to show what bf16 costs in accuracy.
"""
import copy
import statistics
import time

import torch

import grpo
from runs.metrics import PhaseTimer
from bench.scripts import GRPO_DEFAULTS, knob_records
from bench.memory import lora_gpt, project_grpo_step, step_inputs
from lora import lora_parameters
from scale.device import bf16_is_fast
from model import generate, uniforms


def halved(model):
    """A copy whose frozen (non-LoRA) weights are stored in bf16; LoRA stays float32."""
    h = copy.deepcopy(model)
    for n, p in h.named_parameters():
        if ".lora_" not in n:
            p.data = p.data.to(torch.bfloat16)
    return h


def same_rollouts(m32, m16, prompts, group, new_tokens, adv, dev, seed):
    """(loss f32, loss bf16, cosine of the LoRA gradients, relative norm of their difference) of one
    policy_backward each on the same float32-sampled batch."""
    with torch.no_grad():
        u = uniforms(new_tokens, prompts.size(0) * group, seed, dev)
        idx, pad_left, mask = generate(m32, prompts.tolist(), new_tokens, eot_id=-1, num_samples=group, u=u)
    batch = grpo.Rollouts(idx=idx, pad_left=pad_left, mask=mask, advantages=adv.to(dev))
    c = {**GRPO_DEFAULTS, "device": dev, "beta": 0.04, "micro_batch_size": idx.size(0)}
    out = []
    for m, amp in ((m32, torch.autocast(torch.device(dev).type, enabled=False)),
                   (m16, torch.autocast(torch.device(dev).type, dtype=torch.bfloat16))):
        m.zero_grad(set_to_none=True)
        timer = PhaseTimer()
        step, _ = knob_records(c)
        with_ref = grpo.with_reference(m, batch, step, timer=timer, amp=amp)  # pass 3 in this precision
        loss = sum(grpo.policy_backward(m, with_ref, step, timer=timer, amp=amp)["losses"])
        out.append((loss, torch.cat([p.grad.flatten() for p in lora_parameters(m)])))
        m.zero_grad(set_to_none=True)
    (l32, g32), (l16, g16) = out
    cos = torch.nn.functional.cosine_similarity(g32, g16, dim=0).item()
    return l32, l16, cos, ((g16 - g32).norm() / g32.norm()).item()


def bench_half(cfg):
    dev, cuda = cfg["device"], "cuda" in cfg["device"]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    B, G, P, T = cfg["thr_prompts"], cfg["thr_group"], cfg["thr_prompt_len"], cfg["thr_new_tokens"]
    fast, why = bf16_is_fast(dev)
    rows = []
    for (n_layer, n_head, n_embd, vocab), target in zip(cfg["half_shapes"], (None, 2.0, 3.0)):
        m32 = lora_gpt(n_layer, n_head, n_embd, vocab, P + T, cfg["seed"], dev)
        m16 = halved(m32)
        prompts, adv = step_inputs(B, G, P, vocab, cfg["seed"])
        l32, l16, cos, rel = same_rollouts(m32, m16, prompts, G, T, adv, dev, cfg["seed"])
        variants = {"float32": (m32, torch.autocast(torch.device(dev).type, enabled=False)),
                    "bf16": (m16, torch.autocast(torch.device(dev).type, dtype=torch.bfloat16))}
        opts = {k: torch.optim.AdamW(lora_parameters(m), lr=1e-4) for k, (m, _) in variants.items()}
        runs = {k: [] for k in variants}
        for r in range(cfg["half_repeats"] + 1):  # the first round is a warm-up; variants interleaved
            for k, (m, amp) in variants.items():
                sync(); t0 = time.perf_counter()
                _, _, _, times = project_grpo_step(m, opts[k], prompts, G, T, adv, amp, cfg["seed"] + r, beta=0.04,
                                                   micro_batch_size=B * G)
                sync(); times["step"] = time.perf_counter() - t0
                if r:
                    runs[k].append(times)
        med = {k: {p: statistics.median(t[p] for t in runs[k]) for p in runs[k][0]} for k in runs}
        a, b = med["float32"], med["bf16"]
        ratio = a["step"] / b["step"]
        phases = ", ".join(f"{p} {a[p]:.3f} / {b[p]:.3f} s" for p in ("generation", "reference", "policy", "optimizer"))
        detail = (f"{n_layer} layers x {n_embd}, vocab {vocab}, {B}x{G} seqs x {T} new tokens, LoRA r 8, beta 0.04, "
                  f"median of {cfg['half_repeats']}: step float32 {a['step']:.3f} s vs bf16 {b['step']:.3f} s "
                  f"({phases}, float32 / bf16); same rollouts: loss {l32:.6f} vs {l16:.6f}, LoRA-gradient cosine "
                  f"{cos:.5f}, relative difference {rel:.2e}; {why}")
        verdict = "n/a (no target)" if target is None else ("met" if ratio >= target else "MISSED")
        rows.append((f"half precision {n_layer}x{n_embd}", detail, f"{ratio:.2f}x",
                     "-" if target is None else f">= {target:.0f}x on an AMX CPU", verdict))
        del m32, m16, variants, opts
    if not fast:
        rows = [(r[0], r[1], r[2], r[3], f"n/a ({why})") for r in rows]
    return rows
