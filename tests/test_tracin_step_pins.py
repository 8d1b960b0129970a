# What a TracIn step promises, seen from outside (whole train_grpo.py runs: log.jsonl, rollouts.jsonl,
# checkpoints), each pinned by a test that fails when the promise breaks:
# - a step that keeps no rollout moves nothing: the adapter AND AdamW's state (its moments, its step
#   count) are those of the checkpoint before (AdamW stepping on the zero gradient would move the
#   weights through its momentum and weight decay while "no update this step" is printed);
# - with tracin_selection='topk', `selected` and the logged count, rate and defect precision describe
#   the rows trained on (the top fraction by influence), not the rows of positive influence;
# - under bf16 every pass with a graph (the rollouts' capture and the validation backward) computes in
#   the run's precision: a global forward hook sees each LoRA matmul's output dtype;
# - time/policy and time/reference count the training rows' passes too: a virtual clock advances
#   10 s per scoring forward (no KV cache), so each phase's seconds count its passes.
# The validation batch ('pg') is scored by the task's own rewards: the 'chars' reward added to the
# task (as test_distributed.task_pays_chars does) gives it nonzero advantages; without it (a random
# model never answers right) G = 0, every influence is 0 and no rollout is kept.
# Run: python -m pytest -q tests/test_tracin_step_pins.py
import json
import time

import pytest
import torch

from data.tasks import TASKS
from model import GPT
from runs.checkpoint import load_checkpoint
from test_distributed import task_pays_chars
from test_train_grpo import run

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


def lines(path):
    return [json.loads(line) for line in open(path)]


@pytest.fixture
def val_pays_chars(monkeypatch, chars_reward):
    """The task's own rewards (the validation batch's) include 'chars'; undone after the test."""
    monkeypatch.setitem(TASKS, "arith", dict(TASKS["arith"]))
    task_pays_chars(TASKS)


def tensors(state):
    """Every tensor of a (nested) state dict, flattened by path."""
    if isinstance(state, torch.Tensor):
        return {"": state}
    if isinstance(state, dict):
        state = state.items()
    elif isinstance(state, (list, tuple)):
        state = enumerate(state)
    else:
        return {"": torch.tensor(state)} if isinstance(state, (int, float)) else {}
    return {f"{k}/{p}": t for k, v in state for p, t in tensors(v).items()}


def test_a_tracin_step_that_keeps_no_rollout_moves_neither_adapter_nor_adamw(tiny_setup, tmp_path,
                                                                           val_pays_chars, capsys):
    out = tmp_path / "run"
    args = ("--tracin=True", "--tracin_val_batch_size=1", "--weight_decay=0.1")
    run(tiny_setup, out, "--max_iters=2", *args)  # steps that keep rollouts: AdamW has moments
    TASKS["arith"] = {**TASKS["arith"], "rewards": ("correctness", "format"), "weights": (1.0, 0.5)}
    run(tiny_setup, out, "--max_iters=3", "--init_from=resume", *args)  # G = 0: nothing kept
    log = lines(out / "log.jsonl")
    assert [l["n_selected"] > 0 for l in log if "n_selected" in l] == [True, True, False]
    assert "no update this step" in capsys.readouterr().out
    before, after = (load_checkpoint(str(out / f"ckpt_00000{i}.pt")) for i in (2, 3))
    assert after["iter_num"] == 3
    for k, t in before["lora"].items():
        assert torch.equal(after["lora"][k], t), k
    moments, moved = tensors(before["optimizer"]["state"]), tensors(after["optimizer"]["state"])
    assert moments and any(t.abs().sum() > 0 for k, t in moments.items() if "exp_avg" in k)
    assert moved.keys() == moments.keys() and all(torch.equal(moved[k], t) for k, t in moments.items())


def test_topk_selected_and_logged_selection_describe_the_rows_trained_on(tiny_setup_two_steps,
                                                                         tmp_path, val_pays_chars):
    """Two-step problems: a planted answer is never the right one, so defective prompts exist."""
    out, frac = tmp_path / "run", 0.25
    run(tiny_setup_two_steps, out, "--max_iters=3", "--tracin=True", "--tracin_val_batch_size=2",
        "--tracin_selection=topk", f"--tracin_topk_frac={frac}", "--tracin_ranking=dot", "--defect_frac=0.5")
    records, steps = lines(out / "rollouts.jsonl"), lines(out / "log.jsonl")[1:]
    assert len(records) == len(steps) == 3
    positives_differ = precision_differs = False
    for r, s in zip(records, steps):
        n, chosen = len(r["selected"]), [i for i, keep in enumerate(r["selected"]) if keep]
        k = max(1, round(frac * n))
        assert len(chosen) == k == s["n_selected"] and s["selection_rate"] == pytest.approx(k / n)
        rest = [r["influence"][i] for i in range(n) if i not in chosen]
        assert min(r["influence"][i] for i in chosen) >= max(rest)  # the top k by influence
        positives_differ |= sum(x > 0 for x in r["influence"]) != k
        group = n // len(r["prompts"])
        clean = [not r["defective"][i // group] for i in range(n)]
        assert s["defect/selection_precision"] == pytest.approx(sum(clean[i] for i in chosen) / k)
        positive = [i for i in range(n) if r["influence"][i] > 0]
        clean_positive, clean_chosen = sum(clean[i] for i in positive), sum(clean[i] for i in chosen)
        precision_differs |= clean_positive * k != clean_chosen * len(positive)  # ratios, crossed
    # the positive rule would have kept other rows, and reported another precision: the test can tell
    assert positives_differ and precision_differs


R = 8  # the LoRA rank: no other matrix of the tiny base (n_embd 32, vocab 277) has a side of 8


def test_bf16_tracin_computes_the_validation_backward_in_the_runs_precision(tiny_setup, tmp_path,
                                                                           val_pays_chars):
    seen = []  # the output dtype of every LoRA matmul (lora_A: r x d, lora_B: d x r) with a graph

    def hook(module, inputs, output):
        lora = isinstance(module, torch.nn.Linear) and R in module.weight.shape
        if lora and torch.is_grad_enabled():
            seen.append(output.dtype)
    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        run(tiny_setup, tmp_path / "run", "--max_iters=1", "--tracin=True", "--dtype=bfloat16",
            "--tracin_val_batch_size=2", "--micro_batch_size=8", f"--lora_r={R}")
    finally:
        handle.remove()
    # lora_A and lora_B of every adapted layer, once for the training rows, once for the validation's
    layers = sum(".lora_A" in k for k in load_checkpoint(str(tmp_path / "run" / "ckpt.pt"))["lora"])
    assert len(seen) == 2 * 2 * layers, len(seen)
    assert set(seen) == {torch.bfloat16}, seen


def test_tracin_phase_times_count_the_training_rows_passes(tiny_setup, tmp_path, val_pays_chars,
                                                           monkeypatch):
    clock, passes = [0.0], {"policy": 0, "reference": 0}
    real_forward, real_time = GPT.forward, time.time

    def forward(self, idx, *a, cache=None, **kw):  # a scoring pass (sampling reads a KV cache)
        if cache is None:
            passes["policy" if torch.is_grad_enabled() else "reference"] += 1
            clock[0] += 10.0
        return real_forward(self, idx, *a, cache=cache, **kw)
    monkeypatch.setattr(GPT, "forward", forward)
    monkeypatch.setattr(time, "time", lambda: real_time() + clock[0])
    run(tiny_setup, tmp_path / "run", "--max_iters=1", "--tracin=True", "--tracin_val_batch_size=2",
        "--beta=0.04", "--micro_batch_size=4")
    step = lines(tmp_path / "run" / "log.jsonl")[-1]
    # 8 training rows in micro-batches of 4: 2 reference and 2 policy passes, then the validation's
    assert passes["reference"] == 2 and passes["policy"] >= 3, passes
    for phase, n in passes.items():  # each pass's 10 s, within the real seconds of a tiny step
        assert 10.0 * n <= step[f"time/{phase}"] < 10.0 * n + 9.0, (phase, step)
