"""
A GRPO run's decode step and policy pass against their limits, step by step, from its run directory
(bench/gpu.sh runs it on the 1.5B-shaped steps):

  decode step   the step's generation seconds over its decode steps (the completion columns it sampled),
                against reading every weight and the KV cache once per step at the memory bandwidth
                measured here (a device-to-device copy): a decode step of a few rows is bound by that read;
  policy pass   its seconds against its matmul FLOPs at the matmul rate measured here on the pass's own
                shape, in the run's dtype. FLOPs of a forward (policy_flops, checked against torch's
                FlopCounterMode in tests/test_step_limit.py): 2 x tokens x the linear weights of every
                block, the attention's 4 x width x sequence per token and layer (SDPA computes every score
                of a padded batch), the head's 2 x width x vocabulary on the completion tokens; the pass
                runs it twice (the forward, the frozen weights' input gradients, attention's backward
                counted twice) and the blocks once more with grad_checkpoint (recomputed). LoRA's few
                FLOPs are left out; the first step includes what compiles or captures.

    python -m bench.step_limit RUN_DIR [--device=cuda]
"""
import json
import os

import torch

from bench.step import timed
from configurator import UserError, cli_main
from data.prompts import encode_prompt
from runs.checkpoint import load_checkpoint
from runs.loading import load_policy


def policy_flops(config, rows, seq, completion):
    """Matmul FLOPs of one forward of `rows` sequences of `seq` tokens (model.GPTConfig `config`),
    logits taken on the last `completion` positions (keep_last)."""
    c = config
    C, hd = c.n_embd, c.n_embd // c.n_head
    kv = (c.n_kv_head or c.n_head) * hd
    inner = c.n_inner or 4 * C
    mlp = (3 if c.arch == "llama" else 2) * C * inner  # SwiGLU: gate, up, down; GELU: fc, proj
    linear = C * C + 2 * C * kv + C * C + mlp             # q, k, v, o and the MLP, per token
    blocks = c.n_layer * rows * seq * (2 * linear + 4 * C * seq)
    return blocks + 2 * rows * completion * C * c.vocab_size


def pass_flops(config, rows, seq, completion, grad_checkpoint):
    """The policy pass with its backward: forward, input gradients (attention's backward twice its
    forward), the blocks' forward once more under gradient checkpointing (the head is no block)."""
    fwd = policy_flops(config, rows, seq, completion)
    attention = config.n_layer * rows * seq * 4 * config.n_embd * seq
    blocks = fwd - 2 * rows * completion * config.n_embd * config.vocab_size
    return fwd + (fwd + attention) + (blocks if grad_checkpoint else 0)


def matmul_rate(width, inner, tokens, dtype, device):
    """FLOP/s of a (tokens, width) @ (width, inner) matmul in dtype, the pass's largest shape."""
    a = torch.randn(tokens, width, device=device, dtype=dtype)
    b = torch.randn(width, inner, device=device, dtype=dtype)
    return 2 * tokens * width * inner / timed(lambda: a @ b, device, 5)[0]


def bandwidth(device, mb=1024):
    """Bytes/s read plus written by a device-to-device copy of `mb` MB."""
    a = torch.empty(mb * 2 ** 20, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    return 2 * a.numel() / timed(lambda: b.copy_(a), device, 5)[0]


def step_rows(run):
    """[(log line, rollouts line)] of every step of the run that sampled."""
    with open(os.path.join(run, "log.jsonl")) as f:
        logs = {r["iter"]: r for r in map(json.loads, f) if "loss" in r}
    with open(os.path.join(run, "rollouts.jsonl")) as f:
        rolls = {r["iter"]: r for r in map(json.loads, f)}
    return [(logs[i], rolls[i]) for i in sorted(logs) if i in rolls]


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    device = next((a.split("=", 1)[1] for a in argv if a.startswith("--device=")), "cuda")
    if len(args) != 1 or any(a.startswith("--") and not a.startswith("--device=") for a in argv):
        raise UserError("usage: python -m bench.step_limit RUN_DIR [--device=cuda]")
    run = args[0]
    if not os.path.isfile(os.path.join(run, "log.jsonl")) or not os.path.isfile(os.path.join(run, "ckpt.pt")):
        raise UserError(f"{run} is not a train_grpo.py run directory (no log.jsonl and ckpt.pt): give one")
    cfg = load_checkpoint(os.path.join(run, "ckpt.pt"))["config"]
    model, enc, _ = load_policy(os.path.join(run, "ckpt.pt"), device)
    c = model.config
    dtype = torch.bfloat16 if cfg["dtype"] == "bfloat16" else torch.float32
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = (c.n_kv_head or c.n_head) * (c.n_embd // c.n_head)
    del model
    rows = step_rows(run)
    if not rows:
        raise UserError(f"{run} logged no step that sampled: run a few steps first")
    mb = cfg["micro_batch_size"]
    per_second = bandwidth(device)
    print(f"{device}: copy bandwidth {per_second / 1e9:.0f} GB/s; weights {weight_bytes / 1e9:.2f} GB")
    print("step | total s | generation s | decode steps | ms a decode step (limit) | policy s (limit) | peak MB")
    rate = None
    for log, roll in rows:
        n = len(roll["completion_tokens"])
        T = len(roll["completion_tokens"][0])
        group = n // len(roll["prompts"])
        P = max(len(encode_prompt(enc, q)) for q in roll["prompts"])
        seq = P + T - 1  # the pass's columns (idx[:, :-1])
        if rate is None:  # measured once, on the first step's shape
            rate = matmul_rate(c.n_embd, c.n_inner or 4 * c.n_embd, min(n, mb) * seq, dtype, device)
            print(f"matmul rate {rate / 1e12:.1f} TFLOP/s ({dtype}, {min(n, mb) * seq} x {c.n_embd} @ "
                  f"{c.n_embd} x {c.n_inner or 4 * c.n_embd}); {group} samples a prompt")
        flops = pass_flops(c, n, seq, T, cfg["grad_checkpoint"])
        cache = 2 * c.n_layer * n * kv * (P + T) * (2 if dtype == torch.bfloat16 else 4)
        decode_limit = (weight_bytes + cache) / per_second
        gen, pol = log["time/generation"], log["time/policy"]
        print(f"{log['iter']:4d} | {log['step_seconds']:7.2f} | {gen:12.2f} | {T:12d} | "
              f"{gen / T * 1e3:8.2f} ({decode_limit * 1e3:.2f}, {gen / T / decode_limit:.1f}x) | "
              f"{pol:.2f} ({flops / rate:.2f}, {pol / (flops / rate):.1f}x) | {log['mem_max_alloc_mb']:.0f}")


if __name__ == "__main__":
    cli_main(main)
