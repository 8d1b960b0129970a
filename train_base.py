"""
Supervised training of the small base GPT on the task, so that GRPO has a policy to improve.

    python train_base.py config/tiny_base.py            # ~3 min on a 2-core CPU
    python train_base.py config/tiny_base.py --init_from=resume

Loss: next-token cross-entropy on the solution tokens only (the question is given, not learned).
Prints one line per log_interval, evaluates greedy test accuracy every eval_interval, and writes
out_dir/ckpt.pt atomically (a crash mid-write never leaves half a checkpoint).
"""
import math
import os
import random
import time

import torch

from configurator import UserError, configure, cli_main
from model import GPT, GPTConfig, check_device, load_checkpoint, model_from_checkpoint, save_checkpoint

# -----------------------------------------------------------------------------
# default config values (override with a config file and/or --key=value)
out_dir = "out/base"
init_from = "scratch"       # 'scratch' or 'resume' (from out_dir/ckpt.pt)
seed = 1337
device = "cpu"              # 'cpu', 'cuda', 'cuda:1', 'mps'
# task: synthetic GSM8K-style problems (data/gsm_synth/prepare.py)
task_steps = 2              # operations per problem
task_max_operand = 20       # operands drawn from 1..task_max_operand
task_ops = "+-"             # any of '+-*/'
task_noise = 0.0            # fraction of training solutions that stop one step early (see prepare.py)
n_train = 20000
# model
n_layer = 4
n_head = 4
n_embd = 128
block_size = 96
dropout = 0.0
bias = False
# optimisation (AdamW, warmup then cosine decay to min_lr)
batch_size = 64
max_iters = 2000
learning_rate = 3e-3
min_lr = 3e-4
lr_decay_iters = 0          # cosine reaches min_lr here; 0 = max_iters (set it to stop early and resume later)
warmup_iters = 100
weight_decay = 0.1
beta1, beta2 = 0.9, 0.99
grad_clip = 1.0
# logging / evaluation
log_interval = 50
eval_interval = 500
eval_n = 200                # test problems scored greedily at each eval
max_new_tokens = 40
dtype = "bfloat16"          # autocast dtype on CUDA; CPU runs in float32
# -----------------------------------------------------------------------------
defaults = {k: v for k, v in dict(globals()).items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str))}


def load_task(cfg, verbose=True):
    """Prepare the task data if missing; return (data_dir, tokenizer)."""
    from data.gsm_synth.prepare import prepare, load_tokenizer
    data_dir = prepare(cfg["task_steps"], cfg["task_max_operand"], cfg["task_ops"], cfg["task_noise"],
                       n_train=cfg["n_train"], verbose=verbose)
    return data_dir, load_tokenizer(data_dir)


def get_lr(it, max_iters, learning_rate, min_lr, warmup_iters):
    """Linear warmup, then cosine decay from learning_rate to min_lr at max_iters."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = min(1.0, (it - warmup_iters) / max(1, max_iters - warmup_iters))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


@torch.no_grad()
def evaluate(model, enc, examples, max_new_tokens, k=1, temperature=1.0, batch=100, seed=0):
    """Greedy accuracy on `examples`; with k > 1 also pass@k (any of k samples correct)."""
    from data.gsm_synth.prepare import prompt_text
    from rewards import extract_answer
    from sample import generate, decode_completions
    greedy, passk = 0, 0
    for i in range(0, len(examples), batch):
        chunk = examples[i:i + batch]
        prompts = [enc.encode(prompt_text(e["question"])) for e in chunk]
        idx, _, mask = generate(model, prompts, max_new_tokens, enc.eot_token, temperature=0)
        texts = decode_completions(enc, idx, mask)
        greedy += sum(extract_answer(t) == e["answer"] for t, e in zip(texts, chunk))
        if k > 1:
            idx, _, mask = generate(model, prompts, max_new_tokens, enc.eot_token, num_samples=k,
                                    temperature=temperature, seed=seed + i)
            texts = decode_completions(enc, idx, mask)
            passk += sum(any(extract_answer(texts[j * k + s]) == e["answer"] for s in range(k))
                         for j, e in enumerate(chunk))
    n = max(1, len(examples))
    return {"accuracy": greedy / n, f"pass@{k}": passk / n} if k > 1 else {"accuracy": greedy / n}


def tokenize_examples(enc, examples):
    """(prompt ids, completion ids + EOT) per example."""
    from data.gsm_synth.prepare import prompt_text
    return [(enc.encode(prompt_text(e["question"])), enc.encode(e["solution"]) + [enc.eot_token])
            for e in examples]


def get_batch(pairs, batch_size, rng, device):
    """Right-padded (x, y) with y = -1 on prompt tokens and padding: only solutions are learned."""
    rows = [pairs[rng.randrange(len(pairs))] for _ in range(batch_size)]
    T = max(len(p) + len(c) for p, c in rows) - 1
    x = torch.zeros(batch_size, T, dtype=torch.long)
    y = torch.full((batch_size, T), -1, dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        seq = torch.tensor(p + c)
        x[i, :len(seq) - 1] = seq[:-1]
        y[i, len(p) - 1:len(seq) - 1] = seq[len(p):]
    return x.to(device), y.to(device)


def main(argv):
    cfg = configure(defaults, argv)
    amp = check_device(cfg["device"], cfg["dtype"])  # bf16 autocast on CUDA, a no-op on CPU
    from data.gsm_synth.prepare import load_split
    torch.manual_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])
    data_dir, enc = load_task(cfg)
    train_pairs = tokenize_examples(enc, load_split(data_dir, "train"))
    test = load_split(data_dir, "test")[:cfg["eval_n"]]
    longest = max(len(p) + len(c) for p, c in train_pairs)
    if longest > cfg["block_size"]:
        raise UserError(f"training sequences reach {longest} tokens but block_size={cfg['block_size']}")
    device = cfg["device"]
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    model_args = dict(block_size=cfg["block_size"], vocab_size=enc.n_vocab, n_layer=cfg["n_layer"],
                      n_head=cfg["n_head"], n_embd=cfg["n_embd"], dropout=cfg["dropout"], bias=cfg["bias"])
    iter_num, elapsed_before = 0, 0.0
    if cfg["init_from"] == "resume":
        ckpt = load_checkpoint(ckpt_path)
        model = model_from_checkpoint(ckpt, ckpt_path)
        iter_num, elapsed_before = ckpt["iter_num"], ckpt.get("train_seconds", 0.0)
        torch.set_rng_state(ckpt["rng"]["torch"])
        rng.setstate(ckpt["rng"]["python"])
        print(f"resuming from {ckpt_path} at iter {iter_num}")
    elif cfg["init_from"] == "scratch":
        model = GPT(GPTConfig(**model_args))
    else:
        raise UserError(f"init_from must be 'scratch' or 'resume', got {cfg['init_from']!r}")
    model.to(device)
    print(f"GPT with {model.num_params() / 1e6:.2f}M parameters, vocab {enc.n_vocab}")
    decay = [p for p in model.parameters() if p.dim() >= 2]   # no weight decay on gains and biases
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg["learning_rate"], betas=(cfg["beta1"], cfg["beta2"]))
    if cfg["init_from"] == "resume":
        optimizer.load_state_dict(ckpt["optimizer"])
        del ckpt

    def checkpoint(metrics):
        save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "model_args": model_args, "iter_num": iter_num, "config": cfg,
                         "data_dir": data_dir, "train_seconds": elapsed_before + time.time() - t_start,
                         "metrics": metrics,
                         "rng": {"torch": torch.get_rng_state(), "python": rng.getstate()}}, ckpt_path)

    t_start = t_log = time.time()
    metrics = {}
    while iter_num < cfg["max_iters"]:
        lr = get_lr(iter_num, cfg["lr_decay_iters"] or cfg["max_iters"], cfg["learning_rate"], cfg["min_lr"],
                    cfg["warmup_iters"])
        for g in optimizer.param_groups:
            g["lr"] = lr
        x, y = get_batch(train_pairs, cfg["batch_size"], rng, device)
        model.train()
        with amp:
            _, loss = model(x, targets=y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num % cfg["log_interval"] == 0:
            dt = (time.time() - t_log) / cfg["log_interval"]
            t_log = time.time()
            print(f"iter {iter_num:5d} | loss {loss.item():.4f} | lr {lr:.2e} | {dt * 1000:.0f} ms/iter"
                  f" | {elapsed_before + time.time() - t_start:.0f}s")
        if iter_num % cfg["eval_interval"] == 0 or iter_num == cfg["max_iters"]:
            with amp:
                metrics = evaluate(model, enc, test, cfg["max_new_tokens"])
            print(f"eval  {iter_num:5d} | test accuracy {metrics['accuracy']:.3f} (greedy, {len(test)} problems)")
            checkpoint(metrics)
    total = elapsed_before + time.time() - t_start
    print(f"done: {iter_num} iters in {total:.0f}s, test accuracy {metrics.get('accuracy', float('nan')):.3f}"
          f", checkpoint {ckpt_path}")
    return metrics


if __name__ == "__main__":
    cli_main(main)
