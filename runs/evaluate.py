"""
Evaluation and the learning-rate schedule, for both training scripts: greedy test accuracy (and pass@k)
of a model on a task's test problems, and warmup then cosine decay. Where it plugs in: train_base.py's
and train_grpo.py's loops call get_lr every iteration and evaluate every eval_interval; train_grpo.py
through eval_line (its console line and log keys); nothing here runs inside a step.
"""
import math

import torch

from configurator import UserError
from data.prompts import decode_completions, encode_prompt, stop_tokens
from data.tasks import TASKS
from model import NonFiniteLogits, Sampling, generate, uniforms
from rewards import REWARD_FUNCS
from scale import distributed

# test problems generated at once by evaluate (its KV cache's rows)
EVAL_BATCH = 100


def get_lr(it, max_iters, learning_rate, min_lr, warmup_iters):
    """Linear warmup, then cosine decay from learning_rate to min_lr
    at max_iters."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = min(1.0, (it - warmup_iters) / max(1, max_iters - warmup_iters))
    cosine = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + cosine * (learning_rate - min_lr)


@torch.no_grad()
def evaluate(model, enc, examples, max_new_tokens, k=1, temperature=1.0,
             batch=EVAL_BATCH, seed=0, task="arith"):
    """Greedy accuracy on `examples`; with k > 1 also pass@k (any of k
    samples correct), correct as the task's correctness reward says
    (tasks.TASKS).
    Under torchrun every rank must call it: each scores a contiguous run of
    whole chunks of `batch` problems and the counts are summed. Whole
    chunks, because a chunk's pass@k draws depend on all its rows (one
    generator, seeded seed + the chunk's start), so they stay those of one
    process."""
    if not examples:  # an accuracy over no problem would be NaN
        raise UserError("no test problems to evaluate: eval_n must be >= 1 "
                        "and the test split must not be empty")
    greedy, passk, failed = 0, 0, None
    correct = REWARD_FUNCS[TASKS[task]["correct"]]
    starts = range(0, len(examples), batch)
    stops = stop_tokens(enc)
    argmax = Sampling(temperature=0, vocab_size=enc.n_vocab)
    drawn = Sampling(temperature=temperature, vocab_size=enc.n_vocab)  # pass@k's samples
    device = next(model.parameters()).device
    try:
        for i in starts[distributed.split(len(starts))]:
            chunk = examples[i:i + batch]
            prompts = [encode_prompt(enc, e["question"]) for e in chunk]
            idx, _, mask = generate(model, prompts, max_new_tokens, stops, sampling=argmax)
            texts = decode_completions(enc, idx, mask)
            greedy += sum(correct(t, e["answer"]) == 1.0
                          for t, e in zip(texts, chunk))
            if k > 1:
                u = uniforms(max_new_tokens, len(prompts) * k, seed + i, device)
                idx, _, mask = generate(model, prompts, max_new_tokens, stops, num_samples=k,
                                        sampling=drawn, u=u)
                texts = decode_completions(enc, idx, mask)

                def solved(j, e):  # any of the problem's k samples
                    return any(correct(texts[j * k + s], e["answer"]) == 1.0
                               for s in range(k))
                passk += sum(solved(j, e) for j, e in enumerate(chunk))
    # other ranks must still reach the sum below, and fail with it
    except NonFiniteLogits as e:
        failed = e
    counts = [greedy, passk, int(failed is not None)]
    greedy, passk, n_failed = distributed.sum_floats(counts)
    if n_failed:
        raise failed or NonFiniteLogits("non-finite logits in another "
                                        "process's share of the evaluation")
    n = len(examples)
    if k > 1:
        return {"accuracy": greedy / n, f"pass@{k}": passk / n}
    return {"accuracy": greedy / n}


def eval_line(run, cfg, it):
    """train_grpo.py's evaluation at iteration `it` (run: runs/state.Run): the policy's test accuracy
    and pass@eval_k in the run's precision, one console line, and its log.jsonl keys ('test/accuracy',
    ...); {} when the weights give NaN/Inf logits (no accuracy rather than a NaN one). Each rank scores
    its share of the test problems (evaluate sums them)."""
    k, test = cfg["eval_k"], run.test
    try:
        with run.amp:
            r = evaluate(run.model, run.enc, test, cfg["max_new_tokens"], k=k, seed=cfg["seed"], task=cfg["task"])
    except NonFiniteLogits as e:
        print(f"warning: evaluation at iter {it} skipped: {e}")
        return {}
    passk = f" | pass@{k} {r[f'pass@{k}']:.3f}" if k > 1 else ""
    distributed.print0(f"eval  {it:4d} | test accuracy {r['accuracy']:.3f}{passk} ({len(test)} problems)")
    return {f"test/{k}": v for k, v in r.items()}
