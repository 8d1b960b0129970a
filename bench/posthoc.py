"""
Post-hoc attribution (attribute.find_critical_samples) next to Captum's TracInCP (pytorch/captum,
captum/influence/_core/tracincp.py) on the same checkpoints, rollouts and losses, for bench/run.py:

  posthoc  posthoc_prompts x posthoc_group rollouts sampled from the task model, posthoc_checkpoints
           LoRA adapters saved as train_grpo.py saves them ('lora', 'lr'), one test answer per
           posthoc_tests (a validation question and its reference solution; loss = its NLL). Ours:
           mode 'memory_efficient', weight w_t = eta_t (plain TracInCP). Captum: TracInCP with
           layers= every lora_A / lora_B module, a checkpoint loader that loads the adapter and returns
           its learning rate, a per-example loss with the project's gradient, batch size 1 (its
           fastest setting), its rows summed over the test answers. Time, max relative difference of
           the scores, Spearman rank correlation.
           Then the same at posthoc_wide (layers, heads, width; the throughput size 6 x 384 by default):
           a random-weight GPT of that shape on the task's tokenizer with LoRA r 8 (lora_B nonzero),
           whose rollouts run to the full 40 tokens, where batching matters more than per-call overhead.
Captum is an optional benchmark dependency (pip install captum): without it the row says so.
"""
import importlib.util
import os
import tempfile
import warnings

import torch
import torch.nn as nn

from analysis import attribute
import tracin
from bench.memory import lora_gpt
from bench.step import task_setup, timed
from grpo import completion_logprobs
from lora import load_lora_state_dict, lora_state_dict
from runs.checkpoint import load_checkpoint, save_checkpoint
from data.prompts import encode_prompt, encode_text
from model import generate, uniforms


class MeanLogProb(nn.Module):
    """What Captum calls as model(*inputs): each row's mean log pi over its completion tokens, (n,)."""

    def __init__(self, gpt, temperature=1.0):
        super().__init__()
        self.gpt, self.temperature = gpt, temperature

    def forward(self, idx, pad_left, mask):
        logp, _ = completion_logprobs(self.gpt, idx, pad_left, mask.size(1), self.temperature)  # (n, T)
        return (logp * mask).sum(1) / mask.sum(1).clamp(min=1)


def per_example_loss(mean_logp, advantages):
    """-A_i * mean_t log pi(y_t): the gradient of tracin.sample_losses' row i (its GRPO loss at ratio 1;
    A = 1 for a test answer: its NLL). Per example (no reduction), as Captum's batch-size-1 path needs."""
    return -advantages * mean_logp


def load_adapter(wrapper, path):
    """Captum's checkpoints_load_func: the checkpoint's adapter into the model; returns its learning rate."""
    ck = load_checkpoint(path)
    load_lora_state_dict(wrapper.gpt, ck["lora"])
    return float(ck["lr"])


def captum_scores(model, paths, train_batch, test_batch):
    """(n_train,) Captum TracInCP influence of every training row on the test rows, summed over them."""
    from captum.influence import TracInCP
    wrapper = MeanLogProb(model).eval()
    layers = [f"gpt.{n}" for n, m in model.named_modules() if n.endswith((".lora_A", ".lora_B"))]
    train = torch.utils.data.TensorDataset(*train_batch)  # (idx, pad_left, mask, advantage): the last is the label
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its notes on unset reductions and progress bars
        cp = TracInCP(wrapper, train, paths, checkpoints_load_func=load_adapter, layers=layers,
                      loss_fn=per_example_loss, batch_size=1, sample_wise_grads_per_batch=False)
        return cp.influence(tuple(test_batch)).sum(0).double()  # (n_test, n_train) -> (n_train,)


def posthoc_inputs(cfg, tmp, shape=None):
    """Model, tokenizer, what it is, checkpoint paths, training rollouts (sampled, random nonzero
    advantages) and test answers (validation questions with their reference solutions). shape: (layers,
    heads, width) of a random-weight GPT on the task's tokenizer in place of the task model."""
    n_ck, G = cfg["posthoc_checkpoints"], cfg["posthoc_group"]
    model, enc, what, tb, vb = task_setup(cfg, cfg["posthoc_prompts"], cfg["posthoc_tests"])
    if shape:
        n_layer, n_head, n_embd = shape
        model = lora_gpt(n_layer, n_head, n_embd, enc.n_vocab, model.config.block_size, cfg["seed"], cfg["device"])
        what = f"random weights, {n_layer} layers x {n_embd}"
    g = torch.Generator().manual_seed(cfg["seed"])
    paths = []
    for t in range(n_ck):  # a trajectory: each adapter a small random step from the one before
        with torch.no_grad():
            for n, p in model.named_parameters():
                if ".lora_" in n:
                    p.add_(torch.randn(p.shape, generator=g).to(p) * 0.02)
        paths.append(os.path.join(tmp, f"ckpt_{t:06d}.pt"))
        save_checkpoint({"lora": lora_state_dict(model), "lr": 2e-3 / (t + 1)}, paths[-1])
    u = uniforms(40, len(tb) * G, cfg["seed"], cfg["device"])
    idx, _, mask = generate(model.eval(), [encode_prompt(enc, e["question"]) for e in tb], 40, enc.eot_token,
                            num_samples=G, u=u)
    T, adv = mask.size(1), torch.randn(idx.size(0), generator=g)
    train = [{"prompt": tb[i // G]["question"], "completion_tokens": idx[i, -T:][:int(mask[i].sum())].tolist(),
              "completion_mask": [1] * int(mask[i].sum()), "advantage": adv[i].item()} for i in range(idx.size(0))]
    test = [{"prompt": e["question"], "completion_tokens": encode_text(enc, e["solution"]) + [enc.eot_token],
             "advantage": 1.0} for e in vb]
    for s in test:
        s["completion_mask"] = [1] * len(s["completion_tokens"])
    return model, enc, what, paths, train, test


def spearman(a, b):
    ra, rb = (x.argsort().argsort().double() for x in (a, b))
    return torch.corrcoef(torch.stack([ra, rb]))[0, 1].item()


def bench_posthoc(cfg):
    """find_critical_samples vs Captum TracInCP: same checkpoints, rollouts, test answers and losses; on
    the task model, then on a random GPT of shape posthoc_wide."""
    if importlib.util.find_spec("captum") is None:  # optional: only this row needs it
        return [("posthoc vs Captum", "skipped: captum is not installed (pip install captum)", "—", ">= 20x", "n/a")]
    return [posthoc_row(cfg, None)] + ([posthoc_row(cfg, tuple(cfg["posthoc_wide"]))] if cfg["posthoc_wide"] else [])


def posthoc_row(cfg, shape):
    dev, reps = cfg["device"], cfg["repeats"]
    with tempfile.TemporaryDirectory() as tmp:
        model, enc, what, paths, train, test = posthoc_inputs(cfg, tmp, shape)
        t_ours, res = timed(lambda: attribute.find_critical_samples(model, paths, train, test, enc), dev, reps)
        ours = torch.tensor([e["tracin_score"] for e in res["scores"]], dtype=torch.float64)
        tb, sb = (tracin.rollout_batch(enc, s, dev) for s in (train, test))
        t_captum, ref = timed(lambda: captum_scores(model, paths, tb, sb), dev, reps)
    err = ((ours - ref.cpu()).abs().max() / ref.abs().max()).item()
    ratio = t_captum / t_ours
    name = "posthoc vs Captum" + (f", {shape[0]}x{shape[2]}" if shape else "")
    return (name, f"{what}; {len(train)} rollouts x {len(paths)} checkpoints x {len(test)} test "
             f"answer(s): find_critical_samples {t_ours:.2f} s, Captum TracInCP {t_captum:.2f} s; max rel diff "
             f"{err:.1e}, Spearman {spearman(ours, ref.cpu()):.4f}", f"{ratio:.1f}x", ">= 20x, rel diff <= 1e-4",
             "met" if ratio >= 20 and err <= 1e-4 else "MISSED")
