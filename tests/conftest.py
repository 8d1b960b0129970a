# Shared fixtures for the tests in this folder. Run everything with: python -m pytest -q tests
# - puts the repository root on sys.path so `import model`, `import lora`, ... work from anywhere;
# - `tiny_gpt`: a small random GPT (eval mode, fixed seed) -- fast on CPU;
# - `sharp_gpt` / `make_gpt`: the same kind of model with the tied embedding (x10) and the block
#   matrices (x10) scaled up, so that random-init logits are far from uniform and greedy (argmax)
#   decisions are clear-cut, i.e. not flipped by ~1e-6 float differences between two mathematically
#   equal computations. Scaling only the tied embedding makes the model copy its last input token
#   forever (embedding . itself dominates), which would not exercise the attention/KV cache at all;
#   scaling the blocks too makes the continuation depend on the whole context.
# - `tiny_setup`: a random 1-layer base checkpoint on a tiny task, for whole train_grpo.py runs;
#   `chars_reward`: a "chars" reward (completion length) that varies even for that model.
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest
import torch

from model import GPT, GPTConfig

# The models here are tiny: with several threads, OpenMP synchronisation dominates (30-70 ms per
# forward on a busy 2-core box vs ~2 ms on one thread). One thread keeps the suite fast and stable.
torch.set_num_threads(1)

# dtype 'auto' means bf16 on CPUs with AMX or AVX512-BF16: the scripts' runs stay float32 in every test
# on every machine (module fixtures' runs included), unless a test asks for bf16 (test_bf16.py)
import train_base  # noqa: E402
import train_grpo  # noqa: E402
from bench.scripts import GRPO_DEFAULTS  # noqa: E402  (the bench reads the same knobs)
train_grpo.defaults["dtype"] = train_base.defaults["dtype"] = GRPO_DEFAULTS["dtype"] = "float32"

TINY = dict(block_size=64, vocab_size=50, n_layer=2, n_head=2, n_embd=32)


def build_gpt(seed=0, emb_scale=1.0, block_scale=1.0, **overrides):
    """A GPT(GPTConfig(**TINY, **overrides)) in eval mode, built under torch.manual_seed(seed).
    emb_scale multiplies the tied wte/lm_head weight (and wpe, so positions matter too);
    block_scale multiplies every weight matrix inside the transformer blocks."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides}))
    with torch.no_grad():
        model.lm_head.weight.mul_(emb_scale)  # tied: this is also transformer.wte.weight
        model.transformer.wpe.weight.mul_(emb_scale)
        for p in model.transformer.h.parameters():
            if p.dim() == 2:
                p.mul_(block_scale)
    return model.eval()


@pytest.fixture
def tiny_gpt():
    return build_gpt(seed=0)


@pytest.fixture
def sharp_gpt():
    return build_gpt(seed=1, emb_scale=10.0, block_scale=10.0)


@pytest.fixture
def make_gpt():
    """Factory fixture: make_gpt(seed=..., emb_scale=..., n_layer=..., ...)."""
    return build_gpt


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """Path of a random 1-layer base checkpoint on a tiny task (for whole train_grpo.py runs)."""
    return tiny_base(tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_setup_two_steps(tmp_path_factory):
    """tiny_setup's base on two-step problems: a planted answer (the first equation's result) is
    then never the right one, as it is for one-step problems."""
    return tiny_base(tmp_path_factory, steps=2)


def tiny_base(tmp_path_factory, steps=1, block_size=128):
    from data.datadir import load_tokenizer
    from data.gsm_synth.prepare import prepare
    from runs.checkpoint import save_checkpoint
    root = tmp_path_factory.mktemp("data")
    data_dir = prepare(steps=steps, max_operand=5, ops="+", n_train=300, n_val=20, n_test=20, num_merges=20,
                       verbose=False, root=str(root))
    enc = load_tokenizer(data_dir)
    torch.manual_seed(0)
    args = dict(block_size=block_size, vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=32, dropout=0.0, bias=False)
    model = GPT(GPTConfig(**args))
    path = str(tmp_path_factory.mktemp("base") / "ckpt.pt")
    save_checkpoint({"model": model.state_dict(), "model_args": args, "data_dir": data_dir, "iter_num": 0,
                     "config": {}, "train_seconds": 0.0, "metrics": {}}, path)
    return path


@pytest.fixture
def chars_reward(monkeypatch):
    """A reward that varies even for an untrained model (text length), so groups have nonzero
    advantages and a train_grpo.py run really updates the adapter (use: "chars" in reward_funcs)."""
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
