# A compiled decode step that fails to compile or capture falls back to eager (scale/compiled.py).
# Run: python -m pytest -q tests/test_compile_fallback.py
# The failures are forced: torch.compile is given a backend that runs dynamo's traced graph as it is (no
# inductor, no C++ compiler, seconds) and raises where told, at a compile (the first token, a new bucket)
# or at a call of the graph (a capture failing mid-generation, after its kernels wrote the cache).
#
#   a failure at the first token, at a new bucket, or mid-generation: that step and every later one
#       eager, the tokens compile=False samples, one warning line naming the cause and --compile=False;
#   a KeyboardInterrupt, NaN logits or a wrong argument is raised, not swallowed; a RuntimeError the eager
#       step raises too is that step's error, raised, with no warning;
#   the graphs stop one short of dynamo's recompile limit: a kept longer cache serves a shorter length,
#       a length none holds samples eagerly, said once, the tokens eager's;
#   the memory check counts the static cache beside the prefill cache wherever compile may be on;
#   the user's path: train_grpo.py config/tiny_grpo.py --compile=True writes compile=False's rollouts.
import json
import shutil

import pytest
import torch

from conftest import build_gpt
from model import GREEDY, NonFiniteLogits, Sampling, generate
from scale import compiled

PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]  # padded rows; 5 + 12 tokens: the 24-column bucket
NEW = 12
WARNING = "warning: the compiled decode step failed"


class Backend:
    """A dynamo backend: the traced graph run as it is; compile number `fail_compile`, or the graphs' call
    number `fail_call` (after the graph ran: the cache already written), raises `error`."""

    def __init__(self, fail_compile=None, fail_call=None, error=None):
        self.fail_compile, self.fail_call, self.compiles, self.calls = fail_compile, fail_call, 0, 0
        self.error = error or RuntimeError("triton: no working CUDA driver (forced)")

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        if self.compiles == self.fail_compile:
            raise self.error

        def run(*args):
            self.calls += 1
            out = gm.forward(*args)
            if self.calls == self.fail_call:
                raise self.error
            return out
        return run


@pytest.fixture
def backend(monkeypatch):
    """torch.compile as compiled_step calls it, with a Backend (set its fields) in inductor's place."""
    torch._dynamo.reset()  # no graph of another test is reused
    real, chosen = torch.compile, Backend()
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: real(fn, backend=chosen, **kw))
    yield chosen
    torch._dynamo.reset()


def sample(model, decode=None, prompts=PROMPTS, new=NEW, seed=0):
    """Sampled tokens (top-k, the same uniforms for eager and compiled) and mask of generate."""
    u = torch.rand(new, 2 * len(prompts), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        idx, _, mask = generate(model, prompts, new, eot_id=(), num_samples=2, sampling=Sampling(top_k=20),
                                u=u, decode=decode)
    return idx, mask


def same_as_eager(model, decode, prompts=PROMPTS, new=NEW, seed=0):
    """generate through decode samples exactly what the eager forward samples."""
    comp, eager = sample(model, decode, prompts, new, seed), sample(model, None, prompts, new, seed)
    return all(torch.equal(a, b) for a, b in zip(comp, eager))


def warnings(capsys):
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]


def test_a_compile_failing_at_the_first_token_samples_eagerly(backend, capsys):
    model = build_gpt(seed=1, emb_scale=10.0, block_scale=10.0)
    backend.fail_compile = 1
    decode = compiled.CompiledDecode(model, "cpu")
    assert same_as_eager(model, decode)
    said = warnings(capsys)
    assert said == [f"{WARNING} (RuntimeError: triton: no working CUDA driver (forced)); sampling eagerly "
                    "from here on (--compile=False skips compiling)"]
    # every later generation eager too, with nothing more said, no new graph tried, no static cache held
    longer = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [4]]
    assert same_as_eager(model, decode, longer, 20)
    assert warnings(capsys) == [] and backend.compiles == 1 and decode.failed and not decode.caches


def test_a_compile_failing_at_a_new_bucket_samples_eagerly_from_there(backend, capsys):
    model = build_gpt(seed=1, emb_scale=10.0, block_scale=10.0)
    backend.fail_compile = 2  # the first bucket compiles, the second fails
    decode = compiled.CompiledDecode(model, "cpu")
    assert same_as_eager(model, decode)
    assert backend.calls == NEW - 1 and warnings(capsys) == []  # every decode step through the graph
    longer = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [4]]  # 10 + 20 tokens: the 32-column bucket
    assert same_as_eager(model, decode, longer, 20)
    assert len(warnings(capsys)) == 1 and decode.failed
    # back at the first bucket: eager, its graph no longer called
    assert same_as_eager(model, decode, seed=5)
    assert backend.calls == NEW - 1 and warnings(capsys) == []


@pytest.mark.parametrize("at", [1, 4])
def test_a_capture_failing_mid_generation_goes_on_from_the_same_cache(backend, capsys, at):
    """The graph's call number `at` wrote its column and advanced the static cache's pos, then failed (a
    capture failing late): eager goes on from the columns written before it, as compile=False samples."""
    model = build_gpt(seed=1, emb_scale=10.0, block_scale=10.0)
    backend.fail_call = at
    decode = compiled.CompiledDecode(model, "cpu")
    assert same_as_eager(model, decode) and backend.calls == at
    assert len(warnings(capsys)) == 1 and decode.failed
    with torch.no_grad():
        greedy = [generate(model, PROMPTS, NEW, (), 2, GREEDY, decode=d)[0] for d in (decode, None)]
    assert torch.equal(*greedy)
    assert backend.calls == at and warnings(capsys) == []


@pytest.mark.parametrize("error", [KeyboardInterrupt(), NonFiniteLogits("NaN/Inf logits"),
                                   ValueError("a wrong argument"), TypeError("a wrong argument")])
def test_what_is_not_a_compile_failure_is_raised(backend, capsys, error):
    model = build_gpt(seed=1)
    backend.fail_call, backend.error = 2, error
    decode = compiled.CompiledDecode(model, "cpu")
    with pytest.raises(type(error)) as raised:
        sample(model, decode)
    assert raised.value is error and warnings(capsys) == [] and not decode.failed


def test_an_error_of_the_step_itself_is_raised_by_the_eager_step_without_a_warning(backend, capsys):
    """A RuntimeError from the compiled call is tried eagerly: an error of the step (here float token ids,
    which the embedding refuses: dynamo's tracing fails first, TorchRuntimeError) is raised there, the
    compiled one as its context, and nothing is blamed."""
    model = build_gpt(seed=1)
    decode = compiled.CompiledDecode(model, "cpu")
    with torch.no_grad():
        cache = model.new_cache(2, 20)
        model(torch.ones(2, 3, dtype=torch.long), cache=cache)
        static = decode.static_cache(cache)
        with pytest.raises(RuntimeError) as raised:
            decode(torch.ones(2, 1), static)
    assert "BackendCompilerFailed" not in type(raised.value).__name__
    assert isinstance(raised.value.__context__, torch._dynamo.exc.TorchRuntimeError)
    assert warnings(capsys) == [] and not decode.failed


def test_the_graphs_stop_one_short_of_the_recompile_limit(backend, capsys):
    """recompile_limit 3 (a run's lengths over many buckets, in small): two graphs; a shorter length is served
    by a kept longer cache, a longer one samples eagerly, said once; no compile fails, no warning."""
    model = build_gpt(seed=1, emb_scale=10.0, block_scale=10.0)
    decode = compiled.CompiledDecode(model, "cpu")
    lengths = [([list(range(1, 9)), [4]], 12),    # 20 columns: bucket 24, a graph
               ([list(range(1, 15)), [4]], 14),   # 28: bucket 32, a graph (the last below the limit)
               ([[1, 2], [3]], 12),               # 14: bucket 16, none: the 24-column cache serves
               ([list(range(1, 25)), [4]], 16),   # 40: bucket 48, none holds it: eager
               ([list(range(1, 30)), [4]], 20)]   # 49: bucket 64: eager, nothing more said
    with torch._dynamo.config.patch(recompile_limit=3, fail_on_recompile_limit_hit=True):
        assert all(same_as_eager(model, decode, prompts, new, n) for n, (prompts, new) in enumerate(lengths))
    assert backend.compiles == 2 and [k[1] for k in decode.caches] == [24, 32] and not decode.failed
    assert backend.calls == 11 + 13 + 11  # the first three generations through the graphs
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("note:")] == [
        "note: the compiled decode step keeps 2 graphs, one short of dynamo's recompile limit: a length "
        "no graph holds (40 tokens here) samples eagerly (torch._dynamo.config.recompile_limit raises "
        "the limit)"]
    assert not [line for line in out if line.startswith("warning:")]


@pytest.mark.parametrize("knob, device, static", [(True, "cpu", 24), (None, "cuda", 24), (None, "cpu", 0),
                                                  (False, "cuda", 0)])
def test_the_memory_check_counts_the_static_cache_where_compile_may_be_on(monkeypatch, knob, device, static):
    """compile=True, or auto on a GPU: the training rollouts' prefill cache (10 + 8 columns) and beside it
    the static cache of that length's bucket (24 columns); evaluation (eager) needs the prefill cache only."""
    import train_grpo
    from checks import grpo_knobs
    seen = []
    monkeypatch.setattr(grpo_knobs, "check_kv_cache", lambda m, rows, length, device, what, fix: seen.append(
        (rows, length, "static" in what, "compile=False" in fix)))
    cfg = {**train_grpo.defaults, "compile": knob, "device": device, "batch_size": 4, "group_size": 4,
           "max_new_tokens": 8, "eval_n": 2, "eval_k": 4, "tracin": False}
    grpo_knobs.check_sampling_cache(cfg, build_gpt(), 10, 64)
    assert seen == [(16, 18 + static, bool(static), bool(static))]
    # evaluation's rows x columns, when larger, are the ones checked (its cache is the larger then)
    seen.clear()
    grpo_knobs.check_sampling_cache({**cfg, "eval_n": 64, "eval_k": 8}, build_gpt(), 10, 64)
    assert seen == [(64 * 8, 18, False, False)]


def test_a_static_cache_that_does_not_fit_is_refused_naming_compile(monkeypatch):
    """The prefill cache fits (16 rows x 18 columns x 2 layers x 32 wide, keys and values: 144 KiB in float32)
    and the static one beside it (24 columns more) does not: compile=True is refused in one line that names
    the static cache and compile=False; compile=False passes."""
    import train_grpo
    from checks import base_knobs, grpo_knobs
    from configurator import UserError
    monkeypatch.setattr(base_knobs, "memory_of", lambda device: 200_000)
    cfg = {**train_grpo.defaults, "compile": True, "device": "cpu", "batch_size": 4, "group_size": 4,
           "max_new_tokens": 8, "eval_n": 2, "eval_k": 4, "tracin": False}
    with pytest.raises(UserError, match="sampling's \\+ the compiled step's static KV cache \\(16 rows x 42 "
                                        "positions.*or set compile=False$"):
        grpo_knobs.check_sampling_cache(cfg, build_gpt(), 10, 64)
    grpo_knobs.check_sampling_cache({**cfg, "compile": False}, build_gpt(), 10, 64)


@pytest.mark.skipif(not shutil.which("g++"), reason="compile=True on CPU checks for a C++ compiler first")
@pytest.mark.parametrize("fail", ["fail_compile", "fail_call"])
def test_train_grpo_with_a_failing_compile_samples_what_compile_false_samples(tiny_setup, chars_reward,
                                                                            tmp_path, backend, capsys, fail):
    """The user's path: config/tiny_grpo.py with --compile=True, the compile failing at the first token, or
    a capture failing in the first iteration's sampling: the run finishes with compile=False's rollouts (the
    second iteration's sampled after a real update: a reward that varies) and says so in one line."""
    import train_grpo
    argv = ["config/tiny_grpo.py", f"--base_ckpt={tiny_setup}", "--batch_size=2", "--group_size=4",
            "--micro_batch_size=8", "--max_new_tokens=8", "--eval_n=2", "--eval_k=1", "--max_iters=2",
            "--eval_interval=100", "--reward_funcs=('correctness','chars')", "--reward_weights=(1.0,1.0)"]
    runs = {}
    for flag in (False, True):
        setattr(backend, fail, 1 if fail == "fail_compile" else 3)
        out = tmp_path / f"compile_{flag}"
        train_grpo.main(argv + [f"--out_dir={out}", f"--compile={flag}"])
        runs[flag] = [json.loads(line)["completion_tokens"] for line in open(out / "rollouts.jsonl")]
        first = json.loads(open(out / "log.jsonl").readlines()[1])  # iteration 1 (line 0: evaluation)
        assert first["frac_reward_zero_std"] < 1  # a real update before the second sampling
    said = warnings(capsys)
    assert runs[True] == runs[False] and len(runs[True]) == 2
    assert len(said) == 1 and "--compile=False" in said[0] and "RuntimeError" in said[0], said
    assert backend.compiles == 1 and backend.calls == (0 if fail == "fail_compile" else 3)
