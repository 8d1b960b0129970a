# Tests for model.py (GPT forward, KV cache, left padding, keep_last, targets/loss, gradient
# checkpointing, checkpoint I/O). Hermetic: tiny random models on CPU, temporary files only.
# Run with: python -m pytest tests/test_model.py -q
#
# Independent references used:
#   - KV cache / greedy decoding: an uncached full-recompute loop (model(idx) on the whole growing
#     sequence, argmax of the last logits) -- no cache, no padding, no mask, the fused causal kernel;
#   - cached / padded logits: the plain full forward of the same (unpadded) row;
#   - keep_last: the full-sequence logits of the targets path;
#   - loss: cross-entropy written out by hand (log_softmax + gather + mean over targets != -1);
#   - gradient checkpointing: the same model (same weights) without checkpointing;
#   - checkpoint I/O: the original model's state dict and logits; error cases: the UserError type
#     and a one-line message.
import os
from dataclasses import asdict

import pytest
import torch

from scale import device as device_module
import model as model_module
from configurator import UserError
from model import GPT, GPTConfig
from runs.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from model import GREEDY, generate

PROMPTS = [[7], [5, 17, 3], [8, 1, 44, 23, 9, 30, 2, 11, 7, 12], [13, 26, 39, 4, 0, 41]]


@torch.no_grad()
def greedy_reference(model, prompt, n):
    """Uncached greedy decoding: recompute the whole sequence at every step.
    Also returns the smallest top1-top2 logit gap seen, to check the test is not on a knife edge."""
    idx = torch.tensor([prompt])
    min_gap = float("inf")
    for _ in range(n):
        logits, _ = model(idx)                  # (1, 1, V): last position, no cache, no padding
        top2 = logits[0, -1].topk(2).values
        min_gap = min(min_gap, (top2[0] - top2[1]).item())
        idx = torch.cat([idx, logits[0, -1].argmax().view(1, 1)], dim=1)
    return idx[0, len(prompt):].tolist(), min_gap


def unused_token(vocab_size, *token_lists):
    used = {t for toks in token_lists for t in toks}
    return min(set(range(vocab_size)) - used)


def make_ckpt(model, **extra):
    return {"model": model.state_dict(), "model_args": asdict(model.config), **extra}


# ------------------------------------------------------------------------------------------
# KV cache: greedy generation == uncached recompute

@pytest.mark.parametrize("seed, n_layer", [(1, 2), (0, 3)])
def test_kv_cache_greedy_equals_full_recompute(make_gpt, seed, n_layer):
    model = make_gpt(seed=seed, emb_scale=10.0, block_scale=10.0, n_layer=n_layer)
    n_new = 30
    refs = []
    for p in PROMPTS:
        ref, gap = greedy_reference(model, p, n_new)
        assert gap > 1e-4, "test setup: greedy decisions are too close to ties"
        refs.append(ref)
    assert len({t for r in refs for t in r}) > 5, "test setup: decoding is degenerate"
    eot = unused_token(model.config.vocab_size, *refs, *PROMPTS)
    # each prompt alone
    for p, ref in zip(PROMPTS, refs):
        idx, pad_left, mask = generate(model, [p], n_new, eot, sampling=GREEDY)
        assert idx.shape == (1, len(p) + n_new)
        assert idx[0, :len(p)].tolist() == p
        assert idx[0, len(p):].tolist() == ref
        assert mask.tolist() == [[1] * n_new]
        assert pad_left.tolist() == [0]
    # all prompts in one left-padded batch
    idx, pad_left, mask = generate(model, PROMPTS, n_new, eot, sampling=GREEDY)
    assert idx[:, -n_new:].tolist() == refs


# ------------------------------------------------------------------------------------------
# cached logits == full forward logits

# "flat": random init, near-uniform attention; "sharp": scaled weights, peaked attention (a cache
# that returns slightly wrong keys barely moves near-uniform attention, but moves peaked attention)
MODELS = {"flat": dict(seed=0), "sharp": dict(seed=1, emb_scale=10.0, block_scale=10.0)}


@pytest.mark.parametrize("kind", MODELS)
def test_cached_logits_match_full_forward_no_padding(make_gpt, kind):
    tiny_gpt = make_gpt(**MODELS[kind])
    torch.manual_seed(1)
    B, T, P = 3, 12, 5
    idx = torch.randint(0, 50, (B, T))
    with torch.no_grad():
        full, _ = tiny_gpt(idx, keep_last=T)                             # (B, T, V)
        cache = tiny_gpt.new_cache(B, T)
        pre, _ = tiny_gpt(idx[:, :P], cache=cache, keep_last=P)          # prefill
        torch.testing.assert_close(pre, full[:, :P], atol=1e-5, rtol=0)
        assert cache.pos == P
        for t in range(P, T):
            step, _ = tiny_gpt(idx[:, t:t + 1], cache=cache)
            assert step.shape == (B, 1, 50)
            torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=0)
        assert cache.pos == T


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("pad_id", [0, 49])
def test_cached_logits_with_left_padding_match_each_row_alone(make_gpt, pad_id, kind):
    tiny_gpt = make_gpt(**MODELS[kind])
    torch.manual_seed(2)
    lengths = [12, 7, 3, 1]
    rows = [torch.randint(0, 50, (n,)) for n in lengths]
    T, P = max(lengths), 6
    idx = torch.full((len(rows), T), pad_id, dtype=torch.long)
    for b, r in enumerate(rows):
        idx[b, T - len(r):] = r
    pad_left = torch.tensor([T - n for n in lengths])
    with torch.no_grad():
        alone = [tiny_gpt(r[None], keep_last=len(r))[0][0] for r in rows]   # (n, V) each
        # (a) padded full forward, no cache
        padded, _ = tiny_gpt(idx, pad_left=pad_left, keep_last=T)
        # (b) padded prefill + one column at a time through the cache
        cache = tiny_gpt.new_cache(len(rows), T, pad_left)
        steps = [tiny_gpt(idx[:, :P], cache=cache, keep_last=P)[0]]
        for t in range(P, T):
            steps.append(tiny_gpt(idx[:, t:t + 1], cache=cache)[0])
        cached = torch.cat(steps, dim=1)
    for b, n in enumerate(lengths):
        real = slice(T - n, T)
        assert torch.isfinite(padded[b]).all() and torch.isfinite(cached[b]).all()
        torch.testing.assert_close(padded[b, real], alone[b], atol=1e-5, rtol=0)
        torch.testing.assert_close(cached[b, real], alone[b], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------
# keep_last and the targets path

@pytest.mark.parametrize("k", [1, 3, 10])
def test_keep_last_returns_last_k_positions(tiny_gpt, k):
    torch.manual_seed(3)
    idx = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        full, _ = tiny_gpt(idx, targets=idx)                     # targets path: all T positions
        last, loss = tiny_gpt(idx, keep_last=k)
    assert loss is None
    assert last.shape == (2, k, 50)
    torch.testing.assert_close(last, full[:, -k:], atol=1e-6, rtol=0)


def test_default_keep_last_is_one(tiny_gpt):
    idx = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, _ = tiny_gpt(idx, targets=idx)
        last, _ = tiny_gpt(idx)
    assert last.shape == (2, 1, 50)
    torch.testing.assert_close(last[:, 0], full[:, -1], atol=1e-6, rtol=0)


def test_loss_equals_hand_written_cross_entropy_with_ignore_index(tiny_gpt):
    g = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 50, (3, 8), generator=g)
    targets = torch.randint(0, 50, (3, 8), generator=g)
    targets[0, :5] = -1
    targets[2, 3] = -1
    with torch.no_grad():
        logits, loss = tiny_gpt(idx, targets=targets)
    assert logits.shape == (3, 8, 50)
    logp = logits.double().log_softmax(-1)
    keep = targets != -1
    nll = -logp[keep].gather(-1, targets[keep][:, None]).squeeze(-1)
    expected = nll.sum() / keep.sum()
    assert loss.ndim == 0
    assert abs(loss.item() - expected.item()) < 1e-5
    # and not the mean over all positions (the ignored ones would count as 0 or crash)
    assert abs(loss.item() - (nll.sum() / targets.numel()).item()) > 1e-3


# ------------------------------------------------------------------------------------------
# gradient checkpointing

@pytest.mark.parametrize("padded", [False, True])
def test_grad_checkpoint_same_loss_and_grads(make_gpt, monkeypatch, padded):
    plain = make_gpt(seed=5, dropout=0.0).train()
    ckpt = make_gpt(seed=5, dropout=0.0, grad_checkpoint=True).train()
    ckpt.load_state_dict(plain.state_dict())
    calls = []
    real_checkpoint = model_module.activation_checkpoint

    def counting_checkpoint(*args, **kwargs):
        calls.append(1)
        return real_checkpoint(*args, **kwargs)

    monkeypatch.setattr(model_module, "activation_checkpoint", counting_checkpoint)
    g = torch.Generator().manual_seed(6)
    idx = torch.randint(0, 50, (3, 12), generator=g)
    targets = torch.randint(0, 50, (3, 12), generator=g)
    pad_left = torch.tensor([0, 4, 9]) if padded else None
    if padded:
        targets[1, :4] = -1
        targets[2, :9] = -1
    _, loss_plain = plain(idx, targets=targets, pad_left=pad_left)
    loss_plain.backward()
    assert calls == []
    _, loss_ckpt = ckpt(idx, targets=targets, pad_left=pad_left)
    loss_ckpt.backward()
    assert len(calls) == ckpt.config.n_layer          # checkpointing really was used
    torch.testing.assert_close(loss_ckpt, loss_plain, atol=1e-6, rtol=0)
    grads_plain = dict(plain.named_parameters())
    for name, p in ckpt.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads_plain[name].grad, atol=1e-6, rtol=1e-5, msg=name)


# ------------------------------------------------------------------------------------------
# context length

def test_sequence_longer_than_block_size_raises(tiny_gpt):
    with pytest.raises(AssertionError, match="block_size"):
        tiny_gpt(torch.zeros(1, 65, dtype=torch.long))
    tiny_gpt(torch.zeros(1, 64, dtype=torch.long))            # exactly block_size is fine
    cache = tiny_gpt.new_cache(1, 70)
    with torch.no_grad():
        tiny_gpt(torch.zeros(1, 60, dtype=torch.long), cache=cache)
        with pytest.raises(AssertionError, match="block_size"):
            tiny_gpt(torch.zeros(1, 5, dtype=torch.long), cache=cache)   # 60 cached + 5 > 64


# ------------------------------------------------------------------------------------------
# checkpoint I/O

def test_checkpoint_round_trip(tiny_gpt, tmp_path):
    path = str(tmp_path / "sub" / "ckpt.pt")                  # directory does not exist yet
    save_checkpoint(make_ckpt(tiny_gpt, iter_num=7, data_dir="somewhere"), path)
    loaded = load_checkpoint(path)
    assert loaded["iter_num"] == 7 and loaded["data_dir"] == "somewhere"
    model2 = model_from_checkpoint(loaded, path).eval()
    assert model2.config == tiny_gpt.config
    sd1, sd2 = tiny_gpt.state_dict(), model2.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        assert torch.equal(sd1[k], sd2[k]), k
    assert model2.lm_head.weight is model2.transformer.wte.weight   # still tied after loading
    idx = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(tiny_gpt(idx, keep_last=10)[0], model2(idx, keep_last=10)[0])


def test_model_from_checkpoint_strips_compile_prefix(tiny_gpt):
    ckpt = make_ckpt(tiny_gpt)
    ckpt["model"] = {"_orig_mod." + k: v for k, v in ckpt["model"].items()}
    model2 = model_from_checkpoint(ckpt)
    assert torch.equal(model2.lm_head.weight, tiny_gpt.lm_head.weight)


def test_save_checkpoint_leaves_no_tmp_file(tiny_gpt, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(make_ckpt(tiny_gpt), path)
    save_checkpoint(make_ckpt(tiny_gpt, iter_num=2), path)    # overwrite an existing checkpoint
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
    assert load_checkpoint(path)["iter_num"] == 2


def assert_one_line_user_error(excinfo):
    msg = str(excinfo.value)
    assert excinfo.type is UserError
    assert msg and "\n" not in msg, msg


def test_load_checkpoint_missing_file(tmp_path):
    path = str(tmp_path / "nope.pt")
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(path)
    assert_one_line_user_error(excinfo)
    assert "nope.pt" in str(excinfo.value)


def _random_bytes(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return bytes(torch.randint(0, 256, (n,), generator=g).tolist())


def _truncated_checkpoint(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(1000)}, good)
    data = good.read_bytes()
    return data[:len(data) // 2]


@pytest.mark.parametrize("kind", [
    "random", "text", "truncated",
    "empty", "one_byte",
])
def test_load_checkpoint_corrupt_file(tmp_path, kind):
    data = {"random": _random_bytes(1000), "text": b"hello\nworld\n", "empty": b"", "one_byte": b"(",
            "truncated": _truncated_checkpoint(tmp_path) if kind == "truncated" else b""}[kind]
    path = tmp_path / "bad.pt"
    path.write_bytes(data)
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(str(path))
    assert_one_line_user_error(excinfo)
    assert "bad.pt" in str(excinfo.value)


@pytest.mark.parametrize("mismatch", ["model_args", "override", "n_layer"])
def test_model_from_checkpoint_other_architecture(tiny_gpt, mismatch):
    if mismatch == "model_args":        # weights of an n_embd=32 model, model_args claim n_embd=48
        ckpt = make_ckpt(tiny_gpt)
        ckpt["model_args"] = {**ckpt["model_args"], "n_embd": 48}
        kwargs = {}
    elif mismatch == "override":         # the caller asks for another width
        ckpt, kwargs = make_ckpt(tiny_gpt), {"n_embd": 16}
    else:                                # weights of a 3-layer model, model_args say 2
        torch.manual_seed(0)
        other = GPT(GPTConfig(**{**asdict(tiny_gpt.config), "n_layer": 3}))
        ckpt, kwargs = make_ckpt(other), {}
        ckpt["model_args"] = asdict(tiny_gpt.config)
    with pytest.raises(UserError) as excinfo:
        model_from_checkpoint(ckpt, "other.pt", **kwargs)
    assert_one_line_user_error(excinfo)
    assert "other.pt" in str(excinfo.value)


def test_model_from_checkpoint_not_a_base_checkpoint():
    with pytest.raises(UserError) as excinfo:
        model_from_checkpoint({"lora": {}}, "grpo.pt")
    assert_one_line_user_error(excinfo)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_check_device_without_cuda_says_what_to_do(device):
    with pytest.raises(UserError, match="--device=cpu"):
        device_module.check_device(device)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_check_device_makes_an_indexed_gpu_current(device, monkeypatch):
    """Plain 'cuda' leaves the current GPU as it is: torch.cuda.set_device refuses a name without an
    index (its own rule, torch._utils._get_device_index, stands in for the GPU here)."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    index_of = torch._utils._get_device_index  # what set_device runs first: it raises on 'cuda'
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.append(index_of(d)))
    dtype, _ = device_module.check_device(device, "float32")
    assert dtype == "float32" and current == ([] if device == "cuda" else [int(device[-1])])


@pytest.mark.parametrize("dtype", ["float16", "bf16", "int8"])
def test_check_device_refuses_dtypes_without_a_loss_scaler(dtype):
    with pytest.raises(UserError, match="bfloat16"):
        device_module.check_device("cpu", dtype)
    dtype, amp = device_module.check_device("cpu", "float32")
    with amp:  # float32: no autocast anywhere
        assert dtype == "float32" and not torch.is_autocast_enabled("cuda") and not torch.is_autocast_enabled("cpu")
    dtype, amp = device_module.check_device("cpu", "bfloat16")
    with amp:  # bfloat16 is honoured on the CPU too
        assert dtype == "bfloat16" and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_auto_dtype_follows_the_hardware(monkeypatch, capsys):
    for fast, want in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(device_module, "bf16_is_fast", lambda device: (fast, "the reason"))
        assert device_module.check_device("cpu", "auto")[0] == want
        assert f"dtype auto: {want} (the reason)" in capsys.readouterr().out
    monkeypatch.undo()
    fast, why = device_module.bf16_is_fast("cpu")  # against the CPU's own flags
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    assert fast == ("amx_bf16" in flags or "avx512_bf16" in flags) and why


def test_scripts_check_the_device_before_any_work(tmp_path):
    """--device=cuda on a machine without CUDA (or --dtype=float16) fails at once with the UserError,
    before data, base model or output directory are touched."""
    import train_grpo
    out = tmp_path / "run"
    with pytest.raises(UserError, match="dtype"):
        train_grpo.main([f"--out_dir={out}", "--dtype=float16"])
    assert not out.exists()
