# GPU checks: the same independent references as the CPU tests, on CUDA (bf16 autocast where the
# scripts use it). Skipped without a GPU, so CI (CPU only) skips the whole file; on a GPU machine:
#   python -m pytest -q tests/test_cuda.py
import json

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("chars_reward")]  # conftest: a reward that varies for a random model

from bench import run as bench
import grpo
from runs.checkpoint import load_checkpoint
from model import GREEDY, generate
from analysis import attribute
from test_distributed import task_pays_chars  # the 'pg' validation reward varies for a random model
from test_train_grpo import run  # the CPU tests' small train_grpo.py run (tiny_setup: conftest)


def test_kv_cache_matches_full_recompute_on_cuda():
    """Greedy tokens of the KV-cache generation equal a full recompute of the prefix per token."""
    model = bench.bench_model("cuda", 48)
    prompts = torch.randint(1, 394, (3, 8), generator=torch.Generator().manual_seed(1))
    idx, _, _ = generate(model, prompts.tolist(), 12, eot_id=-1, sampling=GREEDY)
    assert torch.equal(idx.cpu(), bench.full_recompute_greedy(model, prompts.cuda(), 12).cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_log_softmax_on_cuda(dtype):
    x = torch.randn(4, 16, 1000, device="cuda").to(dtype).requires_grad_()
    tok = torch.randint(0, 1000, (4, 16), device="cuda")
    g = torch.randn(4, 16, device="cuda")
    want = F.log_softmax(x.double() / 0.7, -1).gather(-1, tok[..., None]).squeeze(-1)
    (gw,) = torch.autograd.grad((want * g.double()).sum(), x)
    got = grpo.selective_log_softmax(x, tok, 0.7)
    (gg,) = torch.autograd.grad((got * g).sum(), x)
    assert torch.allclose(got.double(), want, atol=1e-4)
    assert torch.allclose(gg.double(), gw.double(), atol=1e-6 if dtype == torch.float32 else 1e-2)


def test_quick_bench_on_cuda(tmp_path):
    """Every bench row on CUDA at smoke size: the hooks agree with the per-sample loop, the KV cache
    with the full recompute, and the memory row reads CUDA allocator peaks."""
    rows = bench.main(["--quick=True", "--device=cuda", f"--base_ckpt={tmp_path / 'none.pt'}",
                       f"--data_root={tmp_path}"])
    names = [r[0] for r in rows]
    assert "identical greedy tokens: True" in rows[names.index("sampling")][1]
    infl = rows[names.index("influence T=8")][1]
    assert float(infl.split("hooks max rel err vs loop ")[1].split()[0]) <= 1e-5
    assert "CUDA" in rows[names.index("memory")][1] or "cuda" in rows[names.index("memory")][1].lower()
    assert rows[names.index("throughput")][4] in ("met", "MISSED")


def test_a_part_of_the_rollouts_takes_each_field_where_it_lives():
    """The advantages stay on the CPU, the tokens go to the GPU: a bool mask on either device takes
    the rows the same mask takes on the CPU (TracIn's informative validation rows, its kept set)."""
    g = torch.Generator().manual_seed(0)
    idx, mask = torch.randint(0, 9, (6, 5), generator=g), torch.ones(6, 3)
    pad = torch.zeros(6, dtype=torch.long)
    adv = torch.tensor([0.0, 1.0, -1.0, 0.0, 0.5, -0.5])
    want = grpo.Rollouts(idx, pad, mask, adv).part(adv != 0)
    for rows in (adv != 0, (adv != 0).cuda()):
        got = grpo.Rollouts(idx.cuda(), pad.cuda(), mask.cuda(), adv).part(rows)
        assert got.advantages.device.type == "cpu" and got.idx.is_cuda
        for a, b in ((got.idx, want.idx), (got.mask, want.mask), (got.advantages, want.advantages)):
            assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize("extra", [[], ["--tracin=True", "--tracin_val_loss=nll", "--beta=0.0"],
                                   ["--tracin=True", "--tracin_val_loss=pg", "--beta=0.0"]])
def test_grpo_runs_on_cuda_bf16(tiny_setup, tmp_path, extra, monkeypatch):
    """Three GRPO steps on CUDA under bf16 autocast: finite losses, the adapter changes, memory logged."""
    from data.tasks import TASKS
    monkeypatch.setitem(TASKS, "arith", dict(TASKS["arith"]))
    task_pays_chars(TASKS)
    out = tmp_path / "run"
    # bf16 named: conftest makes float32 every test's default dtype
    run(tiny_setup, out, "--device=cuda", "--dtype=bfloat16", "--max_iters=3", *extra)
    steps = [json.loads(l) for l in open(out / "log.jsonl")][1:]
    assert not any(s["skipped"] for s in steps) and steps[-1]["mem_max_alloc_mb"] > 0
    lora = load_checkpoint(str(out / "ckpt.pt"))["lora"]
    assert any(v.abs().sum() > 0 for k, v in lora.items() if "lora_B" in k)  # B started at zero


def test_resume_a_cpu_run_on_cuda(tiny_setup, tmp_path, capsys):
    """Generator states differ in size between CPU and CUDA: the resumed run warns and reseeds."""
    out = tmp_path / "run"
    run(tiny_setup, out, "--device=cpu", "--max_iters=1")
    run(tiny_setup, out, "--device=cuda", "--max_iters=2", "--init_from=resume")
    assert "run saved on cpu, resumed on cuda" in capsys.readouterr().out
    assert [json.loads(l)["iter"] for l in open(out / "rollouts.jsonl")] == [1, 2]


def test_posthoc_attribution_on_cuda_equals_cpu(tmp_path):
    """find_critical_samples with the model on CUDA (float32): the same scores as on the CPU."""
    from test_tracin import ByteEnc, make_model, posthoc_setup
    m = make_model()
    paths, _, train, test = posthoc_setup(tmp_path, m)
    kw = dict(mode="memory_efficient", normalize=True, self_influence=True)
    want = attribute.find_critical_samples(m, paths, train, test, ByteEnc(), **kw)["scores"]
    got = attribute.find_critical_samples(m.cuda(), paths, train, test, ByteEnc(), **kw)["scores"]
    for key in ("tracin_score", "cosine_score", "self_influence"):
        assert torch.allclose(torch.tensor([e[key] for e in got]), torch.tensor([e[key] for e in want]),
                              rtol=1e-4, atol=1e-8), key


def test_captured_decode_step_on_cuda_gives_the_eager_tokens_from_one_graph():
    """CUDA graphs (mode 'reduce-overhead', compile=True / auto on a GPU): greedy float32 tokens equal the
    eager ones on a grouped-query model with LoRA read unfolded, padding in the batch; no cudagraph was
    skipped (a mutated input that is not a static address skips it); two more calls of other prompt lengths
    in the bucket (24 columns) capture nothing new (one static cache, its addresses kept); the NaN path still raises."""
    from conftest import TINY
    from lora import apply_lora, folded_for_sampling, lora_parameters
    from model import GPT, GPTConfig, NonFiniteLogits
    from scale import compiled
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TINY, "arch": "llama", "n_head": 4, "n_kv_head": 2, "n_inner": 48})).cuda().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    apply_lora(model, 4, 8, 0.0, ("q_proj", "v_proj", "down_proj"))
    with torch.no_grad():
        for p in lora_parameters(model):
            if p.size(1) == 4:
                p.normal_(0, 0.3)
    decode = compiled.CompiledDecode(model, "cuda")
    assert decode.graphs
    counters = torch._dynamo.utils.counters
    counters.clear()
    for prompts in ([[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]], [[1, 2, 3, 4, 5, 6], [4], [5, 6]], [[9] * 8, [2], [3, 4]]):
        with folded_for_sampling(model):
            eager = generate(model, prompts, 12, (), num_samples=2, sampling=GREEDY)
        with grpo.lora_for_sampling(model, decode):  # as grpo.sample_rollouts: not folded here
            comp = generate(model, prompts, 12, (), num_samples=2, sampling=GREEDY, decode=decode)
        assert all(torch.equal(a, b) for a, b in zip(eager, comp))
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert len(decode.caches) == 1 and counters["stats"]["unique_graphs"] == 1
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLogits):
        generate(model, [[3, 4, 5, 6, 7]], 12, (), num_samples=6, sampling=GREEDY, decode=decode)
