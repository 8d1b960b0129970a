# pretrained/hfconfig.py and pretrained/hf.py on two config.json fields, against what transformers
# itself reads from the same file: the head size (hidden_size / num_attention_heads) that RoPE needs
# even (rotate_half pairs the first half of a head with the second), and the dtype written under the
# older key torch_dtype (transformers 4's name; 5 writes dtype).
# Run: python -m pytest -q tests/test_hf_config_fields.py
import json

import pytest
import torch

from configurator import UserError
from pretrained.hf import from_pretrained
from pretrained.hf import hf_dtype
from pretrained.hfconfig import config_dtype, hf_config_args

QWEN = dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
            max_position_embeddings=128)


def write(path, **fields):
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(fields))
    return str(path)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("hidden, heads", [(12, 4), (60, 4), (20, 4)])
def test_an_odd_head_size_is_refused(tmp_path, family, hidden, heads):
    fields = {**QWEN, "model_type": family, "hidden_size": hidden, "num_attention_heads": heads,
              "num_key_value_heads": heads}
    assert (hidden // heads) % 2 == 1 and hidden % heads == 0  # a whole but odd head size
    with pytest.raises(UserError, match="num_attention_heads") as e:
        hf_config_args(fields, "m")
    assert "\n" not in str(e.value) and "even" in str(e.value)
    path = write(tmp_path / "odd", **fields)
    with pytest.raises(UserError, match="num_attention_heads"):  # before any weight is looked for
        from_pretrained(path)


def test_an_even_head_size_is_taken():
    args = hf_config_args({**QWEN, "hidden_size": 40, "num_attention_heads": 4}, "m")
    assert args["n_embd"] // args["n_head"] == 10


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float64", "float32"])
def test_the_older_torch_dtype_key_is_read(tmp_path, name):
    want = getattr(torch, name)
    assert config_dtype({**QWEN, "torch_dtype": name}, "m") == want
    assert config_dtype({**QWEN, "dtype": name}, "m") == want
    assert hf_dtype(write(tmp_path / name, **QWEN, torch_dtype=name)) == want
    assert config_dtype(QWEN, "m") == torch.float32  # unsaid: float32, as transformers assumes


def test_torch_dtype_as_transformers_reads_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = write(tmp_path / "m", **QWEN, torch_dtype="bfloat16")
    theirs = transformers.AutoConfig.from_pretrained(path)
    theirs = getattr(theirs, "dtype", None) or theirs.torch_dtype
    assert hf_dtype(path) == theirs == torch.bfloat16


def test_a_quantized_torch_dtype_is_refused():
    with pytest.raises(UserError, match="torch_dtype"):
        config_dtype({**QWEN, "torch_dtype": "int8"}, "m")
