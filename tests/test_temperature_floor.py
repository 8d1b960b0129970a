# A temperature so small that logits / temperature overflows is refused at start-up in one line
# naming `temperature` (checks/grpo_knobs.validate; the sample CLI too), never left to turn a run's
# steps into NaN, where the run would stop blaming the learning rate. The premise is computed: the
# GRPO log-probs of a tiny model at temperature 1e-30 give a non-finite gradient norm, at the floor
# a finite one.
# Run: python -m pytest -q tests/test_temperature_floor.py
import math

import pytest
import torch

import sample
import train_grpo
from configurator import UserError
from conftest import build_gpt
from grpo import completion_logprobs
from model import MIN_TEMPERATURE


@pytest.mark.parametrize("temperature", ["1e-30", "1e-45", "1e-05"])
def test_grpo_refuses_a_temperature_below_the_floor(tiny_setup, tmp_path, temperature):
    out = tmp_path / "run"
    with pytest.raises(UserError, match=f"'temperature' = {temperature} is not allowed") as e:
        train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={out}",
                         f"--temperature={temperature}"])
    assert "\n" not in str(e.value) and "learning_rate" not in str(e.value)
    assert not out.exists()  # refused before any file


@pytest.mark.parametrize("temperature", ["1e-30", "1e-45"])
def test_sample_refuses_a_temperature_below_the_floor(tiny_setup, temperature):
    with pytest.raises(UserError, match=f"'temperature' = {temperature} is not allowed"):
        sample.main([f"--ckpt={tiny_setup}", f"--temperature={temperature}"])


def grad_norm(temperature):
    """The LoRA-free model's gradient norm of the summed log-probs of tokens that are NOT the argmax
    (pass 2 never sees exactly pass 1's logits: a near-tie sampled one way is scored the other)."""
    m = build_gpt(seed=0).train()
    idx = torch.randint(1, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        top = m(idx, keep_last=10)[0].argmax(-1)          # (2, 10): the argmax after each position
    idx[:, 5:] = (top[:, 4:9] + 1) % 50                    # the completion: never the argmax
    logp, _ = completion_logprobs(m, idx, torch.zeros(2, dtype=torch.long), 5, temperature)
    logp.sum().backward()
    return torch.nn.utils.clip_grad_norm_(list(m.parameters()), 1.0).item()


def test_the_floor_keeps_gradients_finite_where_a_tiny_temperature_does_not():
    assert not math.isfinite(grad_norm(1e-30))
    assert math.isfinite(grad_norm(MIN_TEMPERATURE)) and math.isfinite(grad_norm(1.0))
