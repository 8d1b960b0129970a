# runs/base.py: an adapter is bound to its base's function (weights, configuration, tokenizer), not
# to the longest context the base is configured for. block_size (Hugging Face:
# max_position_embeddings) may change under an adapter; RoPE's theta, the norm's epsilon, the
# weights may not. Reference: the logits of the two bases, computed: equal where the change is
# accepted, different where it is refused.
# Run: python -m pytest -q tests/test_base_context_length.py
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from configurator import UserError
from model import GPT, GPTConfig
from pretrained.hf import from_pretrained
from runs.checkpoint import base_fingerprint, tensors_fingerprint
from runs.base import base_identity, check_same_base

LLAMA = dict(arch="llama", block_size=64, vocab_size=50, n_layer=2, n_head=4, n_kv_head=2,
             n_embd=32, n_inner=48, rope_theta=500.0, norm_eps=1e-6)
ENC = SimpleNamespace(_mergeable_ranks={b"a": 0, b"b": 1}, _special_tokens={"<|endoftext|>": 2},
                      _pat_str=r"\S+", eot_token=2, stop_tokens=(2,), chat=None, chat_template=None)


def gpt(**changes):
    torch.manual_seed(0)
    weights = GPT(GPTConfig(**LLAMA)).state_dict()
    model = GPT(GPTConfig(**{**LLAMA, **changes}))
    model.load_state_dict(weights)
    return model.eval()


def identity(model):
    return base_identity(tensors_fingerprint(model.state_dict().items()), model, ENC)


def adapter_ckpt(model):
    ident = identity(model)
    return {"base_fingerprint": ident["tensors"], "base_identity": ident}


def logits(model):
    idx = torch.randint(1, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(idx, keep_last=20)[0]


@pytest.mark.parametrize("block_size", [32, 128, 4096])
def test_another_context_length_is_the_same_base(block_size):
    saved, now = gpt(), gpt(block_size=block_size)
    assert torch.equal(logits(saved), logits(now))  # the same function where both are defined
    check_same_base(adapter_ckpt(saved), "run/ckpt.pt", identity(now), "base")
    check_same_base(adapter_ckpt(now), "run/ckpt.pt", identity(saved), "base")
    for knob in (dict(dropout=0.1), dict(grad_checkpoint=True)):  # a run's knobs, not the function
        now = gpt(block_size=block_size, **knob)
        check_same_base(adapter_ckpt(saved), "run/ckpt.pt", identity(now), "base")


@pytest.mark.parametrize("change, named", [
    (dict(rope_theta=10000.0), "rope_theta"), (dict(norm_eps=1e-3), "norm_eps"),
    (dict(rope_theta=10000.0, block_size=128), "rope_theta")])
def test_a_change_of_function_is_still_refused(change, named):
    saved, now = gpt(), gpt(**change)
    assert not torch.allclose(logits(saved), logits(now))
    with pytest.raises(UserError, match=named) as e:
        check_same_base(adapter_ckpt(saved), "run/ckpt.pt", identity(now), "base")
    assert "block_size" not in str(e.value)


def test_other_weights_with_another_context_length_are_refused():
    saved, now = gpt(), gpt(block_size=128)
    with torch.no_grad():
        now.transformer.h[0].mlp.up_proj.weight[0, 0] += 1e-3
    with pytest.raises(UserError, match="its weights"):
        check_same_base(adapter_ckpt(saved), "run/ckpt.pt", identity(now), "base")


def test_a_hugging_face_base_with_another_max_position_embeddings(tmp_path):
    pytest.importorskip("transformers")
    from hf_dirs import make_dir, write_config
    path = str(tmp_path / "qwen")
    make_dir(path, "qwen2", positions=256)
    saved = from_pretrained(path)
    ckpt = {"base_fingerprint": base_fingerprint(path, saved)}
    ckpt["base_identity"] = base_identity(ckpt["base_fingerprint"], saved, ENC)
    write_config(path, max_position_embeddings=512)
    now = from_pretrained(path)
    assert now.config.block_size == 512
    assert dataclasses.replace(now.config, block_size=256) == saved.config
    check_same_base(ckpt, "run/ckpt.pt", base_identity(base_fingerprint(path, now), now, ENC), path)
    write_config(path, rms_norm_eps=1e-2)
    moved = from_pretrained(path)
    with pytest.raises(UserError, match="norm_eps"):
        found = base_identity(base_fingerprint(path, moved), moved, ENC)
        check_same_base(ckpt, "run/ckpt.pt", found, path)
