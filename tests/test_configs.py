# Tests for config/*.py: every shipped config loads into the script it is for.
# Run with: python -m pytest tests/test_configs.py -q
import glob
import os

import pytest

import train_base
import train_grpo
from configurator import configure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "config", "*.py"))))
def test_shipped_configs_are_valid(path):
    """Every config file's keys exist in the script it is for, with the right types; a GRPO config's
    base_config is a valid train_base config too (what train_grpo.train_missing_base will run)."""
    script = train_base if os.path.basename(path).endswith("_base.py") else train_grpo
    cfg = configure(script.defaults, [path])
    if script is train_grpo and not cfg["base_ckpt"].endswith(".pt"):  # a Hugging Face directory: its own task
        assert cfg["task"] != "arith" and cfg["lora_targets"] == ("q_proj", "k_proj", "v_proj", "o_proj",
                                                                  "gate_proj", "up_proj", "down_proj")
    elif script is train_grpo:
        base_path = os.path.join(ROOT, cfg["base_config"])
        assert configure(train_base.defaults, [base_path])["out_dir"] == os.path.dirname(cfg["base_ckpt"])
    if script is train_grpo:
        assert cfg["batch_size"] * cfg["group_size"] % cfg["micro_batch_size"] == 0
