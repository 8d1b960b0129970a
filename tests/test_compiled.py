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
#       (a recompile is an error in those tests);
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
ROWS, NEW = 2 * len(PROMPTS), 12                     # num_samples=2; 5 + 12 tokens: the 32-column bucket


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
        cache = model.new_cache(ROWS, decode.cache_len(idx.size(1) + NEW) if decode else idx.size(1) + NEW, pad_left)
        out = [model(idx, cache=cache)[0][:, -1]]
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
            # (4 + 16 and 9 + 12 columns: the 32-column bucket of 5 + 12, as cache_len rounds them)
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
