# Tests for the bench package (bench/run.py, step.py, posthoc.py, memory.py). Run: python -m pytest tests/test_bench.py -q
# Reference: the bench's own second paths: the full-recompute generation must give the KV
# cache's tokens, the per-sample autograd loop must give the hooks' inner products, the TracIn step
# with the summed validation gradient must keep the rollouts the full-matrix path keeps, Captum's
# TracInCP (when installed) must give find_critical_samples' scores, and the
# straightforward GRPO step (full log_softmax, deepcopy reference) must give the loss and gradients
# of grpo.completion_logprobs + grpo.grpo_loss on the same tokens. predicted_memory is checked
# against the formulas worked out by hand for tiny sizes.
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from bench import run as bench
from bench import memory as bench_memory
from bench import posthoc as bench_posthoc
import rewards
from configurator import UserError
from grpo import Divisors, LossKnobs, completion_logprobs, grpo_loss
from lora import disable_lora, lora_parameters
from model import GREEDY, generate


def test_quick_bench_rows(capsys, tmp_path):
    funcs = dict(rewards.REWARD_FUNCS)
    rows = bench.main(["--quick", f"--base_ckpt={tmp_path / 'none.pt'}", f"--data_root={tmp_path}"])
    captum = importlib.util.find_spec("captum") is not None  # an optional benchmark dependency
    hf = importlib.util.find_spec("transformers") is not None  # a test and benchmark reference
    posthoc = ["posthoc vs Captum"] + (["posthoc vs Captum, 1x32"] if captum else [])  # the task model, then wide
    assert [r[0] for r in rows] == ["sampling", "step cost, TracIn pg", "step cost, TracIn nll", "rewards, task",
                                    "rewards, slow", "influence T=8", *posthoc, "memory", "throughput",
                                    "half precision 1x32", "matmul limit, 1 x 32 float32", "matmul limit, 1 x 32 bf16",
                                    "generation profile, 1 x 32 float32", "generation profile, 1 x 32 bf16",
                                    *(["sampling vs transformers generate, 1 x 32 float32",
                                       "sampling vs transformers generate, 1 x 32 bf16"] if hf else
                                      ["sampling vs transformers generate"]),
                                    "compiled decode step, 1 x 32 float32", "compiled decode step, 1 x 32 bf16"]
    c32, c16 = rows.pop(-2), rows.pop()  # the compiled decode step: the eager tokens, one graph per dtype
    assert "tokens differ from eager in 0 of 12 rows" in c32[1] and "1 graph(s) compiled (steps [0])" in c32[1]
    assert "1 graph(s) compiled (steps [0])" in c16[1] and c16[4] in ("met", "MISSED")
    if hf:  # the same greedy tokens as transformers' generate on the same weights in float32, and a ratio
        gen32, gen16 = rows.pop(-2), rows.pop()
        assert "identical tokens in 4 of 4 rows" in gen32[1] and float(gen32[2].rstrip("x")) > 0
        assert gen16[4] in ("met", "MISSED") and "transformers" in gen16[1]
    else:
        assert rows.pop()[1].startswith("transformers is not installed")
    for r in (rows.pop(-2), rows.pop()):  # generation's operator time: the matmuls' share and the rest by name
        share = int(re.search(r"matmuls (\d+)%;", r[1])[1])
        assert 0 < share <= 100 and r[2] == f"matmuls {share}%" and "aten::" in r[1]
        assert float(re.search(r"; (\d+) operator calls per token", r[1])[1]) >= 10   # a block is dozens of operators
    for r in (rows.pop(-2), rows.pop()):  # every phase against its limit, a rate measured here; the target is 6 x 384's
        assert "matmul rate" in r[1] and len(re.findall(r"vs limit [0-9.]+ s \(([0-9.]+)x\)", r[1])) == 3
        assert r[4] == "n/a (target at 6 x 384)"
    half = rows.pop()  # float32 vs a bf16-stored base, one tiny shape: no target, the numbers are compared
    cos = float(re.search(r"LoRA-gradient cosine ([0-9.]+)", half[1]).group(1))
    l32, l16 = (float(x) for x in re.search(r"loss ([0-9.e+-]+) vs ([0-9.e+-]+)", half[1]).groups())
    assert cos >= 0.99 and abs(l16 - l32) <= 1e-2 * abs(l32) and half[4].startswith("n/a")
    for r in rows[1:3]:  # random weights: every completion scores 0, no group informs, nothing to judge
        assert "random weights" in r[1] and float(r[2].split("x")[0]) > 0
        assert "same kept set as the matrix path: True" in r[1]
        assert r[4] == "invalid: no informative group (every advantage 0)"
    assert "beyond the floor" in rows[2][2] and "floor = standard + validation forward and backward" in rows[2][1]
    pg_floor = float(re.search(r"their backward = ([0-9.]+) s", rows[1][1]).group(1))
    gen = [float(x) for x in re.findall(r"generation ([0-9.]+) s", rows[1][1])[:2]]  # standard, TracIn pg
    val, std = (float(re.search(pat, rows[1][1]).group(1)) for pat in (r"val gradient ([0-9.]+) s", r"total ([0-9.]+) s"))
    assert abs(pg_floor - (std + max(gen[1] - gen[0], 0) + val)) <= 0.02  # the floor is the sum of its parts (rounded)
    for r in rows[3:5]:  # background_rewards off / on, every completion scored
        assert "reward cache off" in r[1] and float(r[2].rstrip("x")) > 0 and r[4] == "n/a"
    assert "2 ms sleep per completion" in rows[4][1]
    assert rewards.REWARD_FUNCS == funcs  # the slow reward was registered only while its row ran
    assert "identical greedy tokens: True" in rows[0][1]
    err = float(re.search(r"hooks max rel err vs loop ([0-9.e+-]+)", rows[5][1]).group(1))
    assert err <= 1e-5
    if captum:
        for r in rows[6:8]:
            diff = float(re.search(r"max rel diff ([0-9.e+-]+)", r[1]).group(1))
            assert diff <= 1e-4 and "Spearman 1.0000" in r[1] and "4 rollouts x 2 checkpoints" in r[1]
        assert "random weights, 1 layers x 32" in rows[7][1]
    else:
        assert rows[6][1].startswith("skipped: captum is not installed")
    assert all(r[4] in ("met", "MISSED") for r in rows if r[0] not in ("throughput", "rewards, task", "rewards, slow")
               and not r[1].startswith("skipped") and not r[0].startswith("step cost"))
    assert rows[-1][4] == "n/a (H100 target)"  # the throughput target is an H100's; this is the CPU
    mem = rows[-2][1]
    assert "peak RSS (a CPU proxy, not CUDA memory)" in mem and "same tokens: True" in mem
    losses = re.search(r"loss ([0-9.e+-]+) vs ([0-9.e+-]+)", mem).groups()
    assert abs(float(losses[0]) - float(losses[1])) <= 1e-5
    assert "completions/s" in rows[-1][1] and float(rows[-1][2].split("x")[0]) > 0
    assert "| sampling |" in capsys.readouterr().out


@pytest.mark.parametrize("how", [["-m", "bench"], ["bench/run.py"]])
def test_bench_runs_as_module_and_as_file(how, tmp_path):
    """Both ways of running it find the project from its root; --rows runs only the rows named."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, *how, "--quick", "--rows=sampling,influence"], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    names = [line.split("|")[1].strip() for line in r.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert names == ["row", "sampling", "influence T=8"]


def test_posthoc_row_without_captum(monkeypatch):
    """captum missing: one row that says so, and no work (find_spec sees None in sys.modules)."""
    monkeypatch.setitem(sys.modules, "captum", None)
    monkeypatch.setattr(bench_posthoc, "posthoc_inputs", lambda *a: pytest.fail("work started"))
    (row,) = bench_posthoc.bench_posthoc(dict(bench.defaults))
    assert row[0] == "posthoc vs Captum" and row[1] == "skipped: captum is not installed (pip install captum)"


def test_full_recompute_matches_kv_cache():
    model = bench.bench_model("cpu", 48)
    prompts = torch.randint(1, 394, (3, 8), generator=torch.Generator().manual_seed(1))
    idx, _, _ = generate(model, prompts.tolist(), 12, eot_id=-1, sampling=GREEDY)
    assert torch.equal(idx, bench.full_recompute_greedy(model, prompts, 12))


@pytest.mark.parametrize("eot_id", [-1, 0])
def test_straightforward_step_matches_project_loss_and_gradients(eot_id):
    """Same tokens, same loss and LoRA gradients through an independent path: grpo's
    completion_logprobs (keep_last, row-wise logsumexp) and grpo_loss (old = logp.detach())."""
    model = bench_memory.lora_gpt(2, 2, 32, 16, 24, seed=3, device="cpu")  # lora_B != 0: policy != reference
    prompts, adv = bench_memory.step_inputs(2, 3, 6, 16, seed=4)
    amp = torch.autocast("cuda", enabled=False)
    opt = torch.optim.AdamW(lora_parameters(model), lr=0.0)         # lr 0: the weights stay as they are
    loss, idx, mask = bench_memory.straightforward_grpo_step(model, opt, prompts, 3, 10, adv, amp, seed=5,
                                                             eot_id=eot_id, grad_clip=float("inf"))
    got = [p.grad.clone() for p in lora_parameters(model)]
    if eot_id == 0:
        assert 0 < mask.sum() < mask.numel()  # some completions end early: the mask matters
    T, pad = mask.size(1), torch.zeros(idx.size(0), dtype=torch.long)
    with torch.no_grad(), disable_lora(model):
        ref, _ = completion_logprobs(model, idx, pad, T, 1.0)
    model.zero_grad(set_to_none=True)
    logp, _ = completion_logprobs(model, idx, pad, T, 1.0)
    assert (logp - ref).abs().max() > 1e-3  # the KL term is not zero
    whole = Divisors(num_seqs=mask.size(0), num_tokens=mask.sum().clamp(min=1).item())
    expected, _ = grpo_loss(logp, logp.detach(), ref, adv, mask, LossKnobs(beta=0.04), whole)
    expected.backward()
    assert abs(loss - expected.item()) <= 1e-5
    for g, p in zip(got, lora_parameters(model)):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-7)


def test_predicted_memory_by_hand():
    # n_params 10, N 2, prompt 3 + 4 new tokens, V 5, 1 layer, 2 wide, group 2, float32 weights:
    # T = 4, L = 3 + 4 - 1 = 6, S = 7; N*T*V = 40, N*L*V = 60
    # bf16 (b = 2, activations c = 19): act = 1*2*7*2*19*2 = 1064, KV = 2*1*2*7*2*2 = 112
    sf = bench_memory.predicted_memory(10, 2, 3, 4, 5, 1, 2, 2, True, group=2)
    # ref copy 10*4 + KV 112 + sampling logits 2*40*2 + old log_softmax 40*4 + ref 60*(2+4)
    # + policy 60*(2+4) + backward 2*60*4 + act 1064
    assert sf["step"] == 40 + 112 + 160 + 160 + 360 + 360 + 480 + 1064 == 2736
    pr = bench_memory.predicted_memory(10, 2, 3, 4, 5, 1, 2, 2, False, group=2)
    # sampling 112*(1 + 1/2) + 3*2*5*4 = 288; reference 40*2 = 80;
    # policy 1064 + saved logits 40*2 (no float32 copy) + backward rows and their stack 2*40*2 = 1304
    assert (pr["sampling"], pr["reference"], pr["policy_backward"], pr["step"]) == (288, 80, 1304, 1304)
    # float32 (b = 4, c = 17): act = 1*2*7*2*17*4 = 1904, saved 40*4, backward 2*40*4
    assert bench_memory.predicted_memory(10, 2, 3, 4, 5, 1, 2, 4, False, group=2)["step"] == 1904 + 160 + 320


def test_quick_sizes_are_bench_knobs():
    """--quick overrides only knobs that exist (a misspelt key would silently leave a full size)."""
    assert set(bench.QUICK) <= set(bench.defaults)


def test_step_cost_verdicts_only_on_an_informative_batch():
    """A step whose groups all scored alike, or that kept nothing, cannot show what TracIn costs: its row
    says invalid and why, whatever the ratio; an informative one is judged against the target."""
    from bench import step as bench_step
    s = dict.fromkeys(bench_step.STEP_PHASES, 1.0)
    fast = dict.fromkeys(bench_step.STEP_PHASES, 1.05)
    m = {"time/grad_capture_val": 0.1, "time/influence": 0.1}
    row = lambda why, same=True: bench_step.step_cost_row("nll", "x", s, fast, m, "w", same, 3, 8, why)[4]  # noqa: E731
    assert bench_step.degenerate({"frac_reward_zero_std": 1.0}, 5) == "no informative group (every advantage 0)"
    assert bench_step.degenerate({"frac_reward_zero_std": 0.5}, 0) == "kept nothing"
    assert bench_step.degenerate({"frac_reward_zero_std": 0.5}, 5) is None
    assert row("kept nothing") == "invalid: kept nothing"
    assert row(None) == "met" and row(None, same=False) == "MISSED"


@pytest.fixture
def no_rows(monkeypatch):
    """Every row replaced by a spy: the configs the rows were called with (no row does any work)."""
    calls = []
    for name in bench.ROWS:
        monkeypatch.setitem(bench.ROWS, name, lambda cfg, name=name: calls.append((name, cfg)) or [])
    return calls


@pytest.mark.parametrize("rows", ["sampling,,influence", ",", "sampling,nope"])
def test_rows_with_an_empty_or_unknown_name_are_refused(no_rows, rows):
    with pytest.raises(UserError, match=r"config key 'rows' = .* unknown row '(nope)?'"):
        bench.main(["--quick", f"--rows={rows}"])
    assert no_rows == []


def test_quick_keeps_the_knobs_given(no_rows):
    """--quick sets the smoke sizes, except where a knob is given: --quick --n_seq=3 samples 3 sequences."""
    bench.main(["--quick", "--rows=sampling", "--n_seq=3", "--posthoc_wide=(2,2,64)"])
    ((name, cfg),) = no_rows
    assert (name, cfg["n_seq"], cfg["posthoc_wide"], cfg["new_tokens"]) == ("sampling", 3, (2, 2, 64), 16)


def test_a_missing_base_outside_the_project_root_is_refused_before_any_row(no_rows, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "train_missing_base", lambda *a: pytest.fail("a base trained outside the project"))
    with pytest.raises(UserError, match=f"base_ckpt out/base/ckpt.pt not found from {tmp_path}: the row\\(s\\) "
                                              "step_cost need it, and it is trained only from the project root"):
        bench.main(["--rows=sampling,step_cost", "--n_seq=1"])
    assert no_rows == [] and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc, a directory that takes no file")
def test_a_full_run_in_a_directory_that_takes_no_file_is_refused_before_any_row(no_rows, monkeypatch):
    monkeypatch.chdir("/proc")
    with pytest.raises(UserError, match="cannot write bench_cpu.md in /proc"):
        bench.main([])
    assert no_rows == []


@pytest.mark.parametrize("arg,message", [
    ("--timed=0", "config key 'timed' = 0 is not allowed: must be >= 1"),
    ("--warmup=-1", "config key 'warmup' = -1 is not allowed: must be >= 0"),
    ("--dtype=fp16", "config key 'dtype' = 'fp16' is not allowed: must be one of 'float32', 'autocast', 'bfloat16'"),
    ("--device=tpu", "unknown device 'tpu'"), ("--timed", "overrides are written --key=value"),
    ("--compile=fast", "config key 'compile' = 'fast' is not allowed: must be one of '', 'default'")])
def test_trl_peer_bad_arguments_are_one_line_before_any_work(monkeypatch, capsys, arg, message):
    from bench import trl_peer
    from configurator import cli_main
    monkeypatch.setattr(trl_peer, "run", lambda cfg: pytest.fail("work started"))
    with pytest.raises(SystemExit) as e:
        cli_main(trl_peer.main, [arg])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and err.startswith("error: ") and message in err and err.count("\n") == 1


def test_trl_peer_without_cuda_says_so(monkeypatch):
    from bench import trl_peer
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(trl_peer, "run", lambda cfg: pytest.fail("work started"))
    with pytest.raises(UserError, match="device='cuda' but torch.cuda.is_available"):
        trl_peer.main(["--device=cuda"])


def test_the_bench_reads_the_knobs_a_run_gets_without_importing_the_scripts():
    """bench/scripts.script_knobs: each training script's knobs block read as data is its `defaults`
    (dtype aside: conftest.py pins it to float32 in both)."""
    import train_base
    import train_grpo
    from bench.scripts import GRPO_DEFAULTS, script_knobs
    assert GRPO_DEFAULTS == train_grpo.defaults
    for script, defaults in (("train_grpo.py", train_grpo.defaults), ("train_base.py", train_base.defaults)):
        assert {**script_knobs(script), "dtype": "float32"} == defaults


@pytest.mark.parametrize("mode", ["standard", "pg", "nll"])
def test_the_bench_step_is_train_grpos_step(tiny_setup, mode, monkeypatch, chars_reward):
    """bench/step.grpo_step makes train_grpo.grpo_step's calls: from the same weights and seed, the same
    rollouts, selection, statistics and updated LoRA weights."""
    import copy
    import grpo
    import tracin
    import train_grpo
    import cfg_calls
    from bench.scripts import knob_records
    from bench.step import grpo_step
    from data.prompts import encode_prompt
    from data.tasks import TASKS
    from test_train_grpo import tiny_model_and_data
    m, enc, val = tiny_model_and_data(tiny_setup)
    funcs = (("correctness", "format", "chars"), (1.0, 0.5, 1.0))
    cfg = {**train_grpo.defaults, "group_size": 4, "max_new_tokens": 8, "micro_batch_size": 8,
           "tracin": mode != "standard", "tracin_val_loss": "nll" if mode == "nll" else "pg",
           "reward_funcs": funcs[0], "reward_weights": funcs[1]}
    monkeypatch.setitem(TASKS, "arith", {**TASKS["arith"], "rewards": funcs[0], "weights": funcs[1]})
    v = val[2:5]
    v = tracin.reference_solutions(enc, v, "cpu") if mode == "nll" else \
        grpo.Prompts([encode_prompt(enc, e["question"]) for e in v], [e["answer"] for e in v], *funcs)
    batch = grpo.Prompts([encode_prompt(enc, e["question"]) for e in val[:2]], [e["answer"] for e in val[:2]], *funcs)
    out = []
    def bench_step(model, opt, enc, batch, cfg, generator, amp, v):
        return grpo_step(model, opt, enc, batch, *knob_records(cfg), generator, amp, v)
    for step, model in ((cfg_calls.grpo_step, m), (bench_step, copy.deepcopy(m))):
        opt = torch.optim.AdamW(lora_parameters(model), lr=1e-2)
        amp = torch.autocast("cpu", enabled=False)
        rollouts, result = step(model, opt, enc, batch, cfg, torch.Generator().manual_seed(0), amp, v)
        out.append((rollouts, result, [p.detach().clone() for p in lora_parameters(model)]))
    (r1, s1, w1), (r2, s2, w2) = out
    assert torch.equal(r1.idx, r2.idx) and torch.equal(r1.advantages, r2.advantages)
    assert (r1.selected is None) == (r2.selected is None) and (r1.selected is None or torch.equal(r1.selected, r2.selected))
    assert (s1.stats, s1.grad_norm, s1.skip_reason, s1.extra) == (s2.stats, s2.grad_norm, s2.skip_reason, s2.extra)
    assert all(torch.equal(a, b) for a, b in zip(w1, w2)) and set(s1.times) == set(s2.times)
