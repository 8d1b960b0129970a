# train_base.py under bf16 sizes the evaluation's KV cache in the dtype the evaluation allocates it
# in (autocast's bf16: 2 bytes an element, not the float32 weights' 4): with exactly as much memory
# as that cache takes, the run is not refused. Reference: the caches the evaluation really allocated
# (GPT.new_cache, recorded). Run: python -m pytest -q tests/test_base_eval_cache_dtype.py
import pytest
import torch

import train_base as tb
from configurator import UserError
from checks import base_knobs
from data.datadir import load_tokenizer
from data.gsm_synth.prepare import prepare
from model import GPT

# 100 test problems: the evaluation's cache (100 rows x 128 positions) outweighs the tiny model's
# weights and a training batch's logits, so the memory it takes is what decides the refusal
ARGS = ["--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=128", "--batch_size=4",
        "--eval_n=100", "--eval_interval=2", "--log_interval=2", "--max_new_tokens=64",
        "--warmup_iters=1", "--max_iters=2", "--dtype=bfloat16"]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = prepare(steps=1, max_operand=5, ops="+", n_train=200, n_val=10, n_test=100, num_merges=20,
                verbose=False, root=str(tmp_path_factory.mktemp("d")))
    return d, load_tokenizer(d)


def test_a_bf16_base_run_sizes_the_evaluation_cache_in_bf16(task, tmp_path, monkeypatch):
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: task)
    caches, real = [], GPT.new_cache

    def new_cache(self, *args, **kwargs):
        cache = real(self, *args, **kwargs)
        caches.append((cache.k.nbytes + cache.v.nbytes, cache.k.dtype))
        return cache
    monkeypatch.setattr(GPT, "new_cache", new_cache)
    tb.main([f"--out_dir={tmp_path / 'a'}", *ARGS])
    need, dtype = caches[-1]  # the last evaluation's own (the check allocated one before training)
    assert dtype == torch.bfloat16
    monkeypatch.setattr(base_knobs, "memory_of", lambda device: need)  # exactly what it takes
    tb.main([f"--out_dir={tmp_path / 'b'}", *ARGS])
    assert (tmp_path / "b" / "ckpt.pt").exists()
    monkeypatch.setattr(base_knobs, "memory_of", lambda device: need - 1)  # the check is not vacuous
    with pytest.raises(UserError, match="cannot allocate the evaluation's KV cache"):
        tb.main([f"--out_dir={tmp_path / 'c'}", *ARGS])
