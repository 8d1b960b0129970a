# bench/step_limit.py, the decode step and policy pass of a run against their limits (bench/gpu.sh runs it
# on a GPU). Reference for its FLOP count: torch's FlopCounterMode over the model's own forward and
# backward on a padded batch, attention through SDPA's math backend (so that its matmuls are counted),
# the frozen base's weights taking no gradient, as in the policy pass. Then the command on a CPU run.
# Run: python -m pytest -q tests/test_step_limit.py
import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from bench import step_limit
from configurator import UserError
from model import GPT, GPTConfig, pad_prompts

FAMILIES = {"gpt2": {}, "llama-gqa": dict(arch="llama", n_kv_head=2, n_inner=80)}


def counted(model, idx, pad_left, T, backward=True):
    """FlopCounterMode's total for the model's forward (and backward), SDPA through its math backend."""
    with FlopCounterMode(display=False) as flops, sdpa_kernel(SDPBackend.MATH):
        with torch.set_grad_enabled(backward):
            logits, _ = model(idx, pad_left=pad_left, keep_last=T)
            if backward:
                logits.sum().backward()
    return flops.get_total_flops()


@pytest.mark.parametrize("family", FAMILIES)
def test_flops_are_what_torch_counts(family):
    cfg = GPTConfig(block_size=64, vocab_size=97, n_layer=2, n_head=4, n_embd=32, tie_head=False,
                    **FAMILIES[family])
    model = GPT(cfg).train()
    for p in model.parameters():  # frozen, as the base is: only input gradients flow
        p.requires_grad_(False)
    model.transformer.h[0].ln_1.weight.requires_grad_(True)  # ... back through every block
    idx, pad_left = pad_prompts([list(range(1, 11)), [3, 4, 5], [5] * 7], 0, "cpu")
    T = 4
    assert step_limit.policy_flops(cfg, 3, idx.size(1), T) == counted(model, idx, pad_left, T, False) > 0
    assert step_limit.pass_flops(cfg, 3, idx.size(1), T, False) == counted(model, idx, pad_left, T)
    assert model.transformer.h[0].ln_1.weight.grad is not None  # the backward really ran through


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_adds_the_blocks_forward(family):
    """With LoRA (r=1) on every projection, as the policy pass trains it: gradient checkpointing adds the
    blocks' forward once more, within LoRA's share (left out of the count)."""
    from lora import apply_lora
    idx, pad_left = pad_prompts([list(range(1, 11)), [3, 4, 5], [5] * 7], 0, "cpu")
    T, total = 4, {}
    for checkpointed in (False, True):
        cfg = GPTConfig(block_size=64, vocab_size=97, n_layer=2, n_head=4, n_embd=64, tie_head=False,
                        grad_checkpoint=checkpointed, **FAMILIES[family])
        torch.manual_seed(0)
        model = GPT(cfg)
        for p in model.parameters():
            p.requires_grad_(False)
        apply_lora(model, 1, 2, 0.0, ("c_attn", "c_proj", "c_fc", "q_proj", "k_proj", "v_proj", "o_proj",
                                      "gate_proj", "up_proj", "down_proj"))
        total[checkpointed] = counted(model.train(), idx, pad_left, T)
    ours = step_limit.pass_flops(cfg, 3, 10, T, True) - step_limit.pass_flops(cfg, 3, 10, T, False)
    assert abs(total[True] - total[False] - ours) < 0.05 * ours


def test_the_command_on_a_cpu_run(tiny_setup, tmp_path, capsys):
    import train_grpo
    run = tmp_path / "run"
    train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={run}", "--batch_size=2", "--group_size=4",
                     "--max_new_tokens=8", "--eval_n=2", "--eval_k=1", "--max_iters=2", "--eval_interval=100"])
    capsys.readouterr()
    step_limit.main([str(run), "--device=cpu"])
    out = capsys.readouterr().out.splitlines()
    table = [line.split("|") for line in out if line[:4].strip().isdigit()]
    rolls = [json.loads(line) for line in open(run / "rollouts.jsonl")]
    assert [int(r[0]) for r in table] == [1, 2]
    assert [int(r[3]) for r in table] == [len(r["completion_tokens"][0]) for r in rolls]  # decode steps
    assert "GB/s" in out[0] and "TFLOP/s" in "\n".join(out)
    with pytest.raises(UserError, match="not a train_grpo.py run directory"):
        step_limit.main([str(tmp_path), "--device=cpu"])
    with pytest.raises(UserError, match="usage"):
        step_limit.main([str(run), "--devise=cpu"])
