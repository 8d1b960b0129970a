# The compiled decode step (scale/compiled.py) against the eager one.
# Run: python -m pytest -q tests/test_compiled.py      (inductor compiles C++: each compile takes seconds,
# so each family's model is built and compiled once per module and every test reuses its graphs)
#
#   greedy tokens: exactly the eager tokens (gpt2 and llama layouts; prompts of different lengths, so
#       padding; a stop token some rows reach; LoRA folded in);
#   sampled tokens with the same uniforms u: the same tokens; the logits of every step within 1e-4 of the
#       eager ones (the compiled kernels sum in another order: the difference is float rounding); under bf16
#       autocast within bf16 rounding, not bit for bit;
#   one graph per (rows, cache-length bucket): other prompts, other uniforms and other LoRA weights reuse it
#       (a recompile is an error in those tests); the static cache it reads holds what the ordinary cache
#       holds; the buckets; under CUDA graphs' mode (here on CPU, where inductor runs it without graphs)
#       sampling reads LoRA unfolded and gives the same tokens;
#   compile=None (auto): eager on a CPU, on a GPU only where the predicted saving exceeds the capture;
#   the wiring: train_grpo.py with compile=True samples what compile=False samples; bad input is one line.
import copy
import shutil

import pytest
import torch

from configurator import UserError
from conftest import TINY
from lora import apply_lora, folded_for_sampling, lora_parameters
from model import GPT, GPTConfig
from model import GREEDY, Sampling, generate, pad_prompts
from scale import compiled

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                                reason="inductor needs a C++ compiler on CPU (CI has g++)")

FAMILIES = {"gpt2": {}, "llama": dict(arch="llama", n_kv_head=1, n_inner=48, rope_theta=500.0, norm_eps=1e-6)}
TARGETS = ("c_attn", "c_proj", "c_fc", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]  # lengths 5, 2, 3: rows 1 and 2 are left-padded
ROWS, NEW = 2 * len(PROMPTS), 12                     # num_samples=2; 5 + 12 tokens: the 24-column bucket


def lora_gpt(family):
    """A tiny GPT of that family with scaled weights (peaked logits: argmax is not a near-tie) and a LoRA
    adapter whose B is not zero (so that folding it in changes the tokens)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, **FAMILIES[family]}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    apply_lora(model, 4, 8, 0.0, TARGETS)
    with torch.no_grad():
        for p in lora_parameters(model):
            if p.size(1) == 4:  # lora_B
                p.normal_(0, 0.3)
    return model.eval()


@pytest.fixture(scope="module", params=list(FAMILIES))
def model(request):
    """One model per family, compiled at its first use in this module; reset to the same weights per test.
    Past the recompile limit torch.compile would quietly run eager Python: here that is an error."""
    m = lora_gpt(request.param)
    m.initial = {k: v.clone() for k, v in m.state_dict().items()}
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield m
    torch._dynamo.reset()  # the graphs of this model are freed


@pytest.fixture
def fresh(model):
    """The model with its initial weights, its compiled step counting its calls (model.decode_steps)."""
    model.load_state_dict(model.initial)
    step, model.decode_steps = compiled.compiled_step(model), []
    compiled.COMPILED[model][None] = lambda *a: model.decode_steps.append(1) or step(*a)
    yield model
    compiled.COMPILED[model][None] = step


def both(model, **kw):
    """(eager, compiled) outputs of generate(model, PROMPTS, NEW, ...), LoRA folded in as GRPO samples."""
    with folded_for_sampling(model):
        eager = generate(model, PROMPTS, NEW, num_samples=2, **kw)
        return eager, generate(model, PROMPTS, NEW, num_samples=2, decode=compiled.CompiledDecode(model, "cpu"),
                               **kw)


def test_greedy_tokens_are_the_eager_tokens(fresh):
    eager, comp = both(fresh, eot_id=(), sampling=GREEDY)
    assert all(torch.equal(a, b) for a, b in zip(eager, comp))
    assert len(fresh.decode_steps) == NEW - 1  # every step after the prefill ran compiled
    assert eager[1].tolist() == [0, 0, 3, 3, 2, 2]  # padding is really exercised
    # a stop token that only some rows reach, at different steps: rows end, the rest go on, as eagerly
    stop = int(eager[0][0, 5 + 3])  # the 4th new token of row 0
    eager, comp = both(fresh, eot_id=stop, sampling=GREEDY)
    assert all(torch.equal(a, b) for a, b in zip(eager, comp))
    assert 0 < int((eager[2] == 0).any(1).sum()) < ROWS  # some rows stopped early, not all


def test_the_adapter_is_read_at_every_call_not_baked_into_the_graph(fresh):
    """Another fold (new LoRA weights, new folded tensors) gives that adapter's eager tokens, from the same graph."""
    before = both(fresh, eot_id=(), sampling=GREEDY)[1]
    with torch.no_grad():
        for p in lora_parameters(fresh):
            if p.size(1) == 4:
                p.normal_(0, 0.3)
    with torch._dynamo.config.patch(error_on_recompile=True):
        eager, comp = both(fresh, eot_id=(), sampling=GREEDY)
    assert torch.equal(eager[0], comp[0]) and not torch.equal(before[0], comp[0])


def test_sampled_tokens_are_the_eager_tokens_for_the_same_uniforms(fresh):
    u = torch.rand(NEW, ROWS, generator=torch.Generator().manual_seed(1))
    with torch._dynamo.config.patch(error_on_recompile=True):  # other uniforms: the same graph
        eager, comp = both(fresh, eot_id=(), sampling=Sampling(top_k=20), u=u)
    assert all(torch.equal(a, b) for a, b in zip(eager, comp))
    greedy = both(fresh, eot_id=(), sampling=GREEDY)[0]
    assert not torch.equal(eager[0], greedy[0])  # sampling, not a greedy run in disguise


def decode_steps(model, with_compile):
    """Prefill PROMPTS (each twice: generate's rows, so its graph serves), then feed NEW - 1 given tokens one
    column at a time: every step's logits (ROWS, NEW, V)."""
    idx, pad_left = pad_prompts([p for p in PROMPTS for _ in range(2)], 0, "cpu")
    feed = torch.randint(1, 50, (ROWS, NEW), generator=torch.Generator().manual_seed(2))
    decode = compiled.CompiledDecode(model, "cpu") if with_compile else None
    with torch.no_grad(), folded_for_sampling(model):
        cache = model.new_cache(ROWS, idx.size(1) + NEW, pad_left)
        out = [model(idx, cache=cache)[0][:, -1]]
        cache = decode.static_cache(cache) if decode else cache
        step = decode or (lambda tok, c: model(tok, cache=c)[0])
        out += [step(feed[:, t, None], cache)[:, -1] for t in range(NEW - 1)]
    return torch.stack(out, 1).float()


def test_each_step_gives_the_eager_logits_up_to_rounding(fresh):
    """The bound behind the token tests: every decode step's logits, eager against compiled, differ by float
    rounding only (a sampled token differs only where u falls that close to a step of the cumulative distribution)."""
    eager, comp = decode_steps(fresh, False), decode_steps(fresh, True)
    torch.testing.assert_close(comp, eager, rtol=1e-4, atol=1e-4)
    assert eager.abs().max() > 1.0 and len(fresh.decode_steps) == NEW - 1  # real logits, from the compiled step
    assert "forward" not in fresh.__dict__ and "new_cache" not in fresh.__dict__  # the model is never changed


def test_one_graph_serves_other_prompt_lengths_in_the_bucket(fresh):
    decode = compiled.CompiledDecode(fresh, "cpu")
    with folded_for_sampling(fresh):
        generate(fresh, PROMPTS, NEW, eot_id=(), num_samples=2, sampling=GREEDY, decode=decode)  # compiled here
        with torch._dynamo.config.patch(error_on_recompile=True):
            for prompts, new in (([[1, 2, 3, 4], [5], [6, 7, 8]], NEW + 4), ([list(range(1, 10)), [5], [6, 7]], NEW)):
                generate(fresh, prompts, new, eot_id=(), num_samples=2, sampling=GREEDY, decode=decode)
            # (4 + 16 and 9 + 12 columns: the 24-column bucket of 5 + 12, as compiled.bucket rounds them)
    assert list(decode.caches) == [(ROWS, 24, torch.float32)]  # one static cache, kept
    assert len(fresh.decode_steps) == 3 * (NEW - 1) + 4


def test_bf16_autocast_keeps_to_the_eager_logits(fresh):
    """Under bf16 autocast (train_grpo's dtype='bfloat16') the compiled step's logits are the eager ones within
    bf16 rounding (measured: up to 0.033 on logits up to 1.5: the same roundings in another order of operations),
    not bit for bit: sampled tokens may then differ where u falls that close to a step (docs/performance.md)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager, comp = decode_steps(fresh, False), decode_steps(fresh, True)
    torch.testing.assert_close(comp, eager, rtol=2e-2, atol=5e-2)
    assert len(fresh.decode_steps) == NEW - 1  # every step after the prefill ran compiled


def test_a_copy_made_after_compiling_compiles_its_own_step(fresh):
    """A deep copy of a compiled model (its weights changed here) must decode with its own weights, as its
    eager forward does, not with the original's graph."""
    both(fresh, eot_id=(), sampling=GREEDY)                         # the original's step compiled
    twin = copy.deepcopy(fresh)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(-1.0)
    eager, compiled_ = both(twin, eot_id=(), sampling=GREEDY)
    assert not torch.equal(eager[0], both(fresh, eot_id=(), sampling=GREEDY)[0][0])   # the copy decodes otherwise
    assert torch.equal(eager[0], compiled_[0]) and compiled.compiled_step(twin) is not compiled.compiled_step(fresh)


def test_bad_setups_are_one_line_errors(monkeypatch):
    with pytest.raises(UserError, match="compile=True runs on 'cpu' or 'cuda'"):
        compiled.check_compile("mps")
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="needs a C\\+\\+ compiler"):
        compiled.check_compile("cpu")
    monkeypatch.delattr(compiled.torch, "compile")
    with pytest.raises(UserError, match="needs torch >= 2.0"):
        compiled.check_compile("cpu")


def test_train_grpo_with_compile_samples_what_it_samples_without(tiny_setup, tmp_path, monkeypatch):
    """The knob end to end: two iterations of train_grpo.py, compile=True and False, write the same rollouts
    (the same tokens: the same rewards, advantages and LoRA updates), the one through the compiled step."""
    import json
    import train_grpo
    calls, real = [], compiled.CompiledDecode.__call__
    monkeypatch.setattr(compiled.CompiledDecode, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    runs = {}
    for flag in (False, True):
        out = tmp_path / f"compile_{flag}"
        train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={out}", "--batch_size=2", "--group_size=4",
                         "--micro_batch_size=8", "--max_new_tokens=8", "--eval_n=2", "--eval_k=1", "--max_iters=2",
                         "--eval_interval=100", f"--compile={flag}"])
        runs[flag] = [json.loads(line)["completion_tokens"] for line in open(out / "rollouts.jsonl")]
        assert (len(calls) > 0) == flag  # compile=False never calls the compiled step
    assert runs[True] == runs[False] and len(runs[True]) == 2
    # every decode step of both iterations' sampling ran compiled (evaluation samples eagerly)
    assert len(calls) == sum(len(r[0]) - 1 for r in runs[True])
    with pytest.raises(UserError, match="compile=True runs on 'cpu' or 'cuda', not 'mps': set compile=False"):
        train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'mps'}", "--compile=True", "--device=mps"])


def test_the_static_cache_holds_what_the_ordinary_cache_holds(model):
    """After the prefill and every decode step, eagerly: the static cache's first pos columns are the ordinary
    cache's (within float rounding: its attention reads every column), the rest zeros, pos the same count;
    and the logits agree. The bucket is wider than the run, so unwritten columns are really there."""
    idx, pad_left = pad_prompts([p for p in PROMPTS for _ in range(2)], 0, "cpu")
    feed = torch.randint(1, 50, (ROWS, NEW), generator=torch.Generator().manual_seed(3))
    decode = compiled.CompiledDecode(model, "cpu")
    with torch.no_grad():
        cache = model.new_cache(ROWS, idx.size(1) + NEW, pad_left)
        model(idx, cache=cache)
        static = decode.static_cache(cache)
        assert static.max_len == 24 and static.k[0].size(2) == 24 and int(static.pos) == cache.pos == 5
        for t in range(NEW):
            a = model(feed[:, t, None], cache=cache)[0]
            b = model(feed[:, t, None], cache=static)[0]  # the forward the compiled step runs, eagerly
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
            assert int(static.pos) == cache.pos
            for layer in range(model.config.n_layer):
                for ours, theirs in ((static.k[layer], cache.k[layer]), (static.v[layer], cache.v[layer])):
                    torch.testing.assert_close(ours[:, :, :cache.pos], theirs[:, :, :cache.pos], rtol=1e-5, atol=1e-5)
                    assert not ours[:, :, cache.pos:].any()
        assert cache.k.abs().max() > 0.1
        # the next generate call of this bucket (3 + 18 columns: 24) reuses the same tensors (the graph's
        # addresses): its prefill in front, the columns the last call wrote after it cleared
        ptr = static.k[0].data_ptr()
        idx, pad_left = pad_prompts([[1, 2, 3], [4]] * 3, 0, "cpu")
        short = model.new_cache(ROWS, idx.size(1) + 18, pad_left)
        model(idx, cache=short)
        again = decode.static_cache(short)
        assert again is static and again.k[0].data_ptr() == ptr and int(again.pos) == short.pos == 3
        assert torch.equal(again.k[1][:, :, :3], short.k[1][:, :, :3]) and torch.equal(again.pad_left, pad_left)
        assert not again.k[1][:, :, 3:].any() and not again.v[0][:, :, 3:].any()


def test_buckets():
    """compiled.bucket: covers n, within block_size, under a third of it unused, few buckets for a run's lengths."""
    sizes = [compiled.bucket(n, 4096) for n in range(1, 4097)]
    assert all(s >= n and s <= 4096 for n, s in enumerate(sizes, 1))
    assert all(n > s * 2 / 3 for n, s in enumerate(sizes, 1) if s > 16)  # under a third unused
    assert sizes == sorted(sizes) and set(sizes) <= {16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                                                     1536, 2048, 3072, 4096}
    # GSM8K-like prompts of 100-250 tokens + 256 new ones: two graphs
    assert {compiled.bucket(p + 256, 32768) for p in range(100, 251)} == {384, 512}
    assert compiled.bucket(100, 90) == 90  # never past block_size


def test_auto_compiles_on_a_gpu_only_where_it_pays():
    """compile=None (auto): eager on a CPU, with nothing said; on a GPU compiled when steps x tokens x layers x
    the saving per layer and token exceeds the capture, in one line either way; True / False as given."""
    assert compiled.choose(True, "cpu", 3, 8, 4) == (True, None) and compiled.choose(False, "cuda", 10**6, 256, 28) == (False, None)
    assert compiled.choose(None, "cpu", 10**6, 256, 28) == (False, None)
    smoke, why = compiled.choose(None, "cuda", 3, 256, 28)  # a 3-step smoke run of the 1.5B config
    assert not smoke and "\n" not in why and "eager" in why and "--compile=True" in why
    full, why = compiled.choose(None, "cuda:1", 500, 256, 28)  # config/gsm8k_qwen15b.py
    assert full and "\n" not in why and "compiled" in why and "500 steps x 256 tokens x 28 layers" in why
    # the rule itself: saving against capture, the layers on both sides
    for steps in (1, 50, 100, 1000):
        on, _ = compiled.choose(None, "cuda", steps, 64, 6)
        saving = steps * 64 * 6 * compiled.SAVED_PER_LAYER_TOKEN
        assert on == (saving > compiled.GRAPHS * 6 * compiled.CAPTURE_PER_LAYER)


def test_under_cuda_graphs_mode_sampling_reads_lora_unfolded(fresh, monkeypatch):
    """grpo.sample_rollouts with a CUDA-graphs decode step (mode 'reduce-overhead'; on a CPU inductor runs it
    without graphs) never folds LoRA (a folded copy would be a new graph input every step) and samples the
    tokens eager, folded sampling gives."""
    import cfg_calls
    import grpo
    from grpo import Prompts
    folds = []
    real = grpo.folded_for_sampling
    monkeypatch.setattr(grpo, "folded_for_sampling", lambda m: folds.append(1) or real(m))
    enc = type("Enc", (), {"n_vocab": 60})()
    monkeypatch.setattr(grpo, "stop_tokens", lambda enc: (0,))
    cfg = dict(max_new_tokens=NEW, group_size=2, temperature=1.0, top_k=20, top_p=1.0)
    prompts = Prompts(PROMPTS, ["1"] * 3, (), (), generator=torch.Generator().manual_seed(4))
    eager = cfg_calls.sample_rollouts(fresh, enc, [prompts], cfg, None)
    assert folds == [1]
    prompts = Prompts(PROMPTS, ["1"] * 3, (), (), generator=torch.Generator().manual_seed(4))
    graphs, calls = compiled.CompiledDecode(fresh, "cpu", "reduce-overhead"), []
    step = graphs.step
    graphs.step = lambda *a: calls.append(1) or step(*a)  # counted
    assert graphs.graphs
    comp = cfg_calls.sample_rollouts(fresh, enc, [prompts], cfg, None, graphs)
    assert folds == [1] and len(fresh.decode_steps) == 0  # not folded; its own graph, not the default one
    assert len(calls) == comp[2].size(1) - 1  # every decode step through it
    assert all(torch.equal(a, b) for a, b in zip(eager, comp)) and eager[2].size(1) > 1


@pytest.mark.parametrize("value", ["1", "0", "fast", "'True'", "None"])
def test_compile_takes_true_false_or_auto(tiny_setup, tmp_path, value):
    """--compile: True, False or auto (the default); 1, 0 (equal to True and False, not them), another word,
    or a quoted 'True' are one line naming the knob, before any work ('None' is auto, the default's value)."""
    import train_grpo
    argv = [f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'run'}", f"--compile={value}", "--max_iters=0"]
    if value == "None":
        assert train_grpo.main(argv)["compile"] is None
        return
    with pytest.raises(UserError, match="config key 'compile'.*must be True, False or 'auto'") as e:
        train_grpo.main(argv)
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_auto_on_a_cpu_samples_eagerly(tiny_setup, tmp_path, monkeypatch, capsys):
    import train_grpo
    monkeypatch.setattr(compiled.CompiledDecode, "__init__", lambda *a: pytest.fail("compiled on a CPU"))
    cfg = train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'run'}", "--compile=auto",
                           "--max_iters=1", "--eval_n=2", "--eval_k=1", "--batch_size=2", "--group_size=2"])
    assert cfg["compile"] == "auto" and "compile=auto" not in capsys.readouterr().out  # nothing said on a CPU
