# Tests for train_grpo.py. Run: python -m pytest tests/test_train_grpo.py -q
# References: the GRPO formulas written out by hand with Python loops (advantages, loss per
# loss_type, clipping), an independent full-forward log_softmax path (REINFORCE gradient,
# reference log-probs), and whole runs of main() on a tiny task (resume, NaN skip, only LoRA trains).
import contextlib
import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

import cfg_calls
import grpo
import runs.loading
import tracin
import train_grpo as tg
from configurator import UserError
from data.datadir import load_split, load_tokenizer
from data.gsm_synth.prepare import prompt_text
from data.tasks import TASKS
from lora import apply_lora, disable_lora, lora_parameters
from model import GPT, GPTConfig
from runs.checkpoint import save_checkpoint, load_checkpoint
from rewards import compute_rewards
from runs.metrics import step_log
from data.prompts import decode_completions, encode_prompt
from model import generate, uniforms

# every run here uses a reward that varies even for an untrained model (conftest.chars_reward)
pytestmark = pytest.mark.usefixtures("chars_reward")


# ---------------------------------------------------------------------------- advantages
def test_group_advantages_match_formula():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.9, 0.1, 0.4])
    adv, n_zero = grpo.compute_group_advantages(r, 4, "group")
    for g in range(3):
        xs = r[4 * g:4 * g + 4].tolist()
        m = sum(xs) / 4
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / 3)  # unbiased, as torch.std
        for k in range(4):
            want = 0.0 if sd < 1e-6 else (xs[k] - m) / sd
            assert adv[4 * g + k].item() == pytest.approx(want, abs=1e-6)
    assert n_zero == 1
    assert torch.isfinite(adv).all() and (adv[4:8] == 0).all()


def test_group_advantages_batch_and_none():
    r = torch.tensor([1.0, 0.0, 3.0, 3.0, 2.0, 6.0])
    centered = torch.tensor([0.5, -0.5, 0.0, 0.0, -2.0, 2.0])
    adv, n_zero = grpo.compute_group_advantages(r, 2, "none")
    assert torch.allclose(adv, centered) and n_zero == 1
    adv, _ = grpo.compute_group_advantages(r, 2, "batch")
    assert torch.allclose(adv, centered / r.std())


def test_group_advantages_errors():
    """group_size >= 2 and scale_rewards are checked at config time (checks/grpo_knobs.py)."""
    with pytest.raises(RuntimeError):  # 4 rewards do not split into groups of 3
        grpo.compute_group_advantages(torch.zeros(4), 3)


# ---------------------------------------------------------------------------- loss
def hand_loss(logp, old, ref, adv, mask, beta, el, eh, loss_type, max_len, level="token", bias_kl=False):
    """The GRPO objective with plain Python loops over sequences and tokens (one micro-batch, so
    bnpo and dapo agree here)."""
    n, T = len(logp), len(logp[0])
    seq_terms, total, ntok = [], 0.0, 0
    for i in range(n):
        s, cnt = 0.0, 0
        toks = [t for t in range(T) if mask[i][t]]
        seq_log_ratio = sum(logp[i][t] - old[i][t] for t in toks) / max(len(toks), 1)  # GSPO
        for t in toks:
            rho = math.exp(logp[i][t] - old[i][t] if level == "token" else seq_log_ratio)
            rho_c = min(max(rho, 1 - el), 1 + eh)
            term = -min(rho * adv[i], rho_c * adv[i])
            if beta:
                d = ref[i][t] - logp[i][t]
                term += beta * (math.exp(d) - d - 1) * (rho if bias_kl else 1.0)
            s += term
            cnt += 1
        seq_terms.append(s / max(cnt, 1))
        total += s
        ntok += cnt
    return {"grpo": sum(seq_terms) / n, "bnpo": total / max(ntok, 1), "dapo": total / max(ntok, 1),
            "dr_grpo": total / (n * max_len)}[loss_type]


def whole(mask):
    """grpo_loss's divisors when `mask` (n, T) is the whole batch, in one micro-batch."""
    return grpo.Divisors(num_seqs=mask.size(0), num_tokens=mask.sum().clamp(min=1).item())


@pytest.mark.parametrize("level, bias_kl", [("token", False), ("sequence", False), ("token", True),
                                            ("sequence", True)])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_sequence_ratio_and_kl_bias_correction_match_hand_formula(loss_type, level, bias_kl):
    torch.manual_seed(2)
    n, T = 4, 5
    old = torch.randn(n, T).double()
    shift = torch.tensor([[0.5], [-0.5], [0.1], [0.4]]).double()  # row 0 above 1 + eps (A > 0), row 1 below 1 - eps (A < 0)
    logp = (old + shift + 0.3 * torch.randn(n, T).double()).requires_grad_(True)
    ref, adv = torch.randn(n, T).double(), torch.tensor([1.0, -1.0, 0.5, -2.0]).double()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    knobs = grpo.LossKnobs(beta=0.1, loss_type=loss_type, importance_sampling_level=level,
                           use_bias_correction_kl=bias_kl, max_len=8)
    loss, st = grpo.grpo_loss(logp, old, ref, adv, mask, knobs, whole(mask))
    L, O, R, A, M = logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist()
    f = lambda L_: hand_loss(L_, O, R, A, M, 0.1, 0.2, 0.2, loss_type, 8, level, bias_kl)
    assert loss.item() == pytest.approx(f(L), rel=1e-9)
    g, = torch.autograd.grad(loss, logp)
    for i, t in [(0, 0), (0, 3), (1, 2), (2, 1), (3, 0)]:
        Lp, Lm = copy.deepcopy(L), copy.deepcopy(L)
        Lp[i][t] += 1e-6
        Lm[i][t] -= 1e-6
        assert g[i, t].item() == pytest.approx((f(Lp) - f(Lm)) / 2e-6, abs=1e-7)
    assert st["clipped_low"] > 0 and st["clipped_high"] > 0  # both sides of the clip act here


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_grpo_loss_matches_hand_formula(loss_type, beta):
    torch.manual_seed(0)
    n, T = 4, 5
    old = torch.randn(n, T).double()
    # ratios well outside [0.8, 1.2] on both sides, and inside, for both signs of A
    logp = (old + torch.tensor([[0.5, -0.5, 0.05, 0.3, -0.4]] * n).double()).requires_grad_(True)
    ref = torch.randn(n, T).double()
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0]).double()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    knobs = grpo.LossKnobs(beta=beta, loss_type=loss_type, max_len=8)
    loss, st = grpo.grpo_loss(logp, old, ref if beta else None, adv, mask, knobs, whole(mask))
    L, O, R, A, M = logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist()
    want = hand_loss(L, O, R, A, M, beta, 0.2, 0.2, loss_type, 8)
    assert loss.item() == pytest.approx(want, rel=1e-9)
    # gradient: central differences of the hand formula
    g, = torch.autograd.grad(loss, logp)
    eps = 1e-6
    for i, t in [(0, 0), (0, 1), (1, 2), (2, 3), (3, 0), (1, 4)]:
        Lp = copy.deepcopy(L); Lp[i][t] += eps
        Lm = copy.deepcopy(L); Lm[i][t] -= eps
        fd = (hand_loss(Lp, O, R, A, M, beta, 0.2, 0.2, loss_type, 8)
              - hand_loss(Lm, O, R, A, M, beta, 0.2, 0.2, loss_type, 8)) / (2 * eps)
        assert g[i, t].item() == pytest.approx(fd, abs=1e-7)
    # clipped tokens: rho = e^0.5 > 1.2 with A > 0, rho = e^-0.5 or e^-0.4 < 0.8 with A < 0
    want_clip = sum(1 for i in range(n) for t in range(T) if M[i][t] and (
        (math.exp(L[i][t] - O[i][t]) > 1.2 and A[i] > 0) or (math.exp(L[i][t] - O[i][t]) < 0.8 and A[i] < 0)))
    assert want_clip >= 2 and st["clipped_tokens"] == want_clip


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
def test_micro_batches_add_up(loss_type):
    """Micro-batches of 4 that do not cover the batch of 6 evenly (4 + 2): grpo, dapo and dr_grpo add
    up to the whole batch's loss; bnpo (TRL) is the mean over micro-batches of each one's token mean."""
    torch.manual_seed(1)
    logp, ref = torch.randn(6, 7), torch.randn(6, 7)
    adv = torch.randn(6)
    mask = (torch.rand(6, 7) > 0.3).long()
    parts = [slice(0, 4), slice(4, 6)]
    knobs = grpo.LossKnobs(beta=0.04, loss_type=loss_type, max_len=7)
    divisors = grpo.Divisors(num_seqs=6, num_tokens=mask.sum().item(), num_micro_batches=2)
    got = sum(grpo.grpo_loss(logp[s], logp[s], ref[s], adv[s], mask[s], knobs, divisors)[0] for s in parts)
    if loss_type == "bnpo":
        dapo = grpo.LossKnobs(beta=0.04, loss_type="dapo")
        want = sum(grpo.grpo_loss(logp[s], logp[s], ref[s], adv[s], mask[s], dapo, whole(mask[s]))[0]
                   for s in parts) / 2
    else:
        want, _ = grpo.grpo_loss(logp, logp, ref, adv, mask, knobs, whole(mask))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_bad_loss_type():
    """A programming error here: the knob is refused at config time (test_run_safety)."""
    with pytest.raises(AssertionError, match="loss_type"):
        knobs, mask = grpo.LossKnobs(beta=0.0, loss_type="x"), torch.ones(1, 2)
        grpo.grpo_loss(torch.zeros(1, 2), torch.zeros(1, 2), None, torch.zeros(1), mask, knobs, whole(mask))


# ---------------------------------------------------------------------------- log-probs
@pytest.fixture
def lora_gpt():
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=64, vocab_size=50, n_layer=2, n_head=2, n_embd=32))
    base = copy.deepcopy(m)
    apply_lora(m, r=4, alpha=8, targets=("c_attn", "c_proj", "c_fc"))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return m, base


def rollouts(m, n_prompts=3, G=2, seed=0):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]][:n_prompts]
    return generate(m, prompts, 10, eot_id=0, num_samples=G, u=uniforms(10, len(prompts) * G, seed, "cpu"))


def reference_logprobs(m, idx, pad_left, T, temperature=1.0):
    logits, _ = m(idx[:, :-1], targets=torch.zeros_like(idx[:, :-1]), pad_left=pad_left)  # full logits
    lp = F.log_softmax(logits / temperature, dim=-1)
    return lp[:, -T:].gather(-1, idx[:, -T:, None]).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selective_log_softmax(dtype, temperature):
    """Values and gradients against the full float64 log_softmax (the formula on paper)."""
    x = torch.randn(3, 4, 11).to(dtype).requires_grad_()
    tok = torch.randint(0, 11, (3, 4))
    g = torch.randn(3, 4)
    want = F.log_softmax(x.double() / temperature, -1).gather(-1, tok[..., None]).squeeze(-1)
    (gx_want,) = torch.autograd.grad((want * g.double()).sum(), x)
    got = grpo.selective_log_softmax(x, tok, temperature)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, atol=1e-5)
    (gx,) = torch.autograd.grad((got * g).sum(), x)
    assert gx.dtype == dtype
    assert torch.allclose(gx.double(), gx_want.double(), atol=1e-6 if dtype == torch.float32 else 1e-2)


def test_selective_log_softmax_gradcheck():
    x = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    tok = torch.randint(0, 7, (2, 3))
    assert torch.autograd.gradcheck(lambda x: grpo.selective_log_softmax(x, tok, 0.8), (x,))


def test_selective_log_softmax_saves_no_float32_copy():
    """With bf16 logits (N, T, V), backward keeps the bf16 logits and (N, T) statistics only: no
    float32 tensor of N*T*V elements. Autograd's own row-wise logsumexp over row.float() would keep
    one, N*T*V*4 bytes (checked too, so the test can tell the two apart)."""
    N, T, V = 4, 5, 64
    x = torch.randn(N, T, V).bfloat16().requires_grad_()
    tok = torch.randint(0, V, (N, T))

    def saved(fn):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append((t.dtype, t.numel())) or t, lambda t: t):
            fn()
        return kept
    plain = lambda: torch.stack([torch.logsumexp(r.float(), -1) for r in x]) * 1.0
    assert sum(n for d, n in saved(plain) if d == torch.float32 and n == V * T) == N * T * V
    ours = saved(lambda: grpo.selective_log_softmax(x, tok, 0.7))
    assert not any(d == torch.float32 and n >= T * V for d, n in ours)
    assert (torch.bfloat16, N * T * V) in ours


def test_completion_logprobs_temperature(lora_gpt):
    m, _ = lora_gpt
    idx, pl, mask = rollouts(m)
    T = mask.size(1)
    got, _ = grpo.completion_logprobs(m, idx, pl, T, 0.5)
    assert torch.allclose(got, reference_logprobs(m, idx, pl, T, 0.5), atol=1e-5)


def test_reference_logprobs_equal_base_model(lora_gpt):
    m, base = lora_gpt
    idx, pl, mask = rollouts(m)
    T = mask.size(1)
    with torch.no_grad(), disable_lora(m):
        ref, _ = grpo.completion_logprobs(m, idx, pl, T, 1.0)
    with torch.no_grad():
        want, _ = grpo.completion_logprobs(base, idx, pl, T, 1.0)
        pol, _ = grpo.completion_logprobs(m, idx, pl, T, 1.0)
    assert torch.equal(ref, want)
    assert not torch.allclose(pol, want)  # the adapter is active outside the context


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_beta0_gradient_is_reinforce(lora_gpt, loss_type):
    m, _ = lora_gpt
    idx, pl, mask = rollouts(m)
    N, T = mask.shape
    adv = torch.randn(N)
    params = lora_parameters(m)
    logp, _ = grpo.completion_logprobs(m, idx, pl, T, 1.0)
    knobs = grpo.LossKnobs(beta=0.0, loss_type=loss_type, max_len=T)
    loss, _ = grpo.grpo_loss(logp, logp.detach(), None, adv, mask, knobs, whole(mask))
    g = torch.autograd.grad(loss, params)
    lp = reference_logprobs(m, idx, pl, T) * mask
    if loss_type == "grpo":  # -(1/N) sum_i A_i (1/|o_i|) sum_t log pi
        ref_obj = -(adv * lp.sum(1) / mask.sum(1).clamp(min=1)).sum() / N
    else:                    # -(1/(N*T)) sum_i A_i sum_t log pi
        ref_obj = -(adv * lp.sum(1)).sum() / (N * T)
    g_ref = torch.autograd.grad(ref_obj, params)
    for a, b in zip(g, g_ref):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    assert any(a.abs().max() > 1e-4 for a in g)


# ---------------------------------------------------------------------------- whole runs
def run(base, out, *extra):
    return tg.main([f"--base_ckpt={base}", f"--out_dir={out}", "--batch_size=2", "--group_size=4",
                    "--micro_batch_size=4", "--max_new_tokens=8", "--eval_n=4", "--eval_k=2",
                    "--ckpt_interval=1", "--eval_interval=100", "--learning_rate=0.01", "--warmup_iters=1", "--lr_decay_iters=4",
                    "--reward_funcs=('correctness','format','chars')", "--reward_weights=(1.0,0.5,1.0)", *extra])


def test_two_iterations_change_only_lora(tiny_setup, tmp_path):
    out = tmp_path / "run"
    run(tiny_setup, out, "--max_iters=2")
    base_sd = load_checkpoint(tiny_setup)["model"]
    ck = load_checkpoint(str(out / "ckpt_000002.pt"))
    assert ck["iter_num"] == 2 and ck["base_ckpt"] == tiny_setup
    assert set(ck["lora"]) and all(".lora_" in k for k in ck["lora"])
    assert any(v.abs().sum() > 0 for k, v in ck["lora"].items() if "lora_B" in k)  # B left zero
    assert torch.equal(load_checkpoint(tiny_setup)["model"]["lm_head.weight"], base_sd["lm_head.weight"])
    for i in range(3):
        assert (out / f"ckpt_{i:06d}.pt").exists()
    logs = [json.loads(l) for l in open(out / "log.jsonl")]
    step = logs[-1]
    for k in ["reward", "reward_std", "rewards/correctness", "rewards/format", "rewards/chars", "accuracy",
              "frac_reward_zero_std", "kl", "entropy", "completions/mean_length", "clip_ratio", "lr",
              "time/generation", "time/reward", "time/policy", "time/reference", "time/optimizer",
              "mem_alloc_mb", "mem_reserved_mb", "mem_max_alloc_mb", "test/accuracy", "test/pass@2"]:
        assert k in step, k
    rolls = [json.loads(l) for l in open(out / "rollouts.jsonl")]
    assert [r["iter"] for r in rolls] == [1, 2]
    assert len(rolls[0]["completion_tokens"]) == 8 and len(rolls[0]["advantages"]) == 8


def test_resume_is_exact(tiny_setup, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    run(tiny_setup, a, "--max_iters=4")
    run(tiny_setup, b, "--max_iters=2")
    run(tiny_setup, b, "--max_iters=4", "--init_from=resume")
    la, lb = load_checkpoint(str(a / "ckpt.pt"))["lora"], load_checkpoint(str(b / "ckpt.pt"))["lora"]
    assert all(torch.equal(la[k], lb[k]) for k in la)
    l2 = load_checkpoint(str(a / "ckpt_000002.pt"))["lora"]
    assert not all(torch.equal(la[k], l2[k]) for k in la)  # steps 3-4 did change the weights
    assert [json.loads(l)["iter"] for l in open(b / "rollouts.jsonl")] == [1, 2, 3, 4]


def test_resume_on_another_device_type_reseeds(tiny_setup, tmp_path, capsys):
    """A CUDA generator's state (16 bytes) does not fit a CPU generator (5056 bytes): a run saved on
    one device type resumes on the other with a warning and a new sampling seed, instead of crashing."""
    out = tmp_path / "run"
    run(tiny_setup, out, "--max_iters=2")
    ck = load_checkpoint(str(out / "ckpt.pt"))
    with pytest.raises(RuntimeError):  # what set_state would do with the foreign state
        torch.Generator().set_state(torch.zeros(16, dtype=torch.uint8))
    ck["rng"] = {**ck["rng"], "generator": torch.zeros(16, dtype=torch.uint8), "device": "cuda"}
    save_checkpoint(ck, str(out / "ckpt.pt"))
    run(tiny_setup, out, "--max_iters=3", "--init_from=resume")
    assert "run saved on cuda, resumed on cpu" in capsys.readouterr().out
    assert [json.loads(l)["iter"] for l in open(out / "rollouts.jsonl")] == [1, 2, 3]
    assert load_checkpoint(str(out / "ckpt.pt"))["rng"]["device"] == "cpu"


def test_nan_loss_skips_step(tiny_setup, tmp_path, monkeypatch):
    real = grpo.grpo_loss

    def nan_loss(*a, **k):
        loss, st = real(*a, **k)
        return loss * float("nan"), st
    monkeypatch.setattr(grpo, "grpo_loss", nan_loss)
    out = tmp_path / "nan"
    # its one step that could learn skipped: the run does not end as a success
    with pytest.raises(UserError, match=r"^1 of the 1 steps that could learn skipped \(non-finite .*diverged"):
        run(tiny_setup, out, "--max_iters=1")
    ck0, ck1 = load_checkpoint(str(out / "ckpt_000000.pt")), load_checkpoint(str(out / "ckpt_000001.pt"))
    assert all(torch.equal(ck0["lora"][k], ck1["lora"][k]) for k in ck0["lora"])
    assert json.loads(open(out / "log.jsonl").readlines()[-1])["skipped"] is True


def test_the_done_line_and_the_log_tell_how_many_steps_were_skipped_and_why(tiny_setup, tmp_path, monkeypatch,
                                                                          capsys):
    """One NaN loss in two steps: the run ends as a success (the other step learned), and says it skipped one."""
    real, calls = grpo.grpo_loss, []

    def nan_once(*a, **k):
        loss, st = real(*a, **k)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 1 else loss), st
    monkeypatch.setattr(grpo, "grpo_loss", nan_once)
    out = tmp_path / "once"
    run(tiny_setup, out, "--max_iters=2")
    assert capsys.readouterr().out.rstrip().endswith("; 1 of 2 steps skipped (non-finite loss or gradient: 1)")
    logs = [json.loads(line) for line in open(out / "log.jsonl")][1:]
    assert [(l["skipped"], l["skipped_steps"]) for l in logs] == [(True, 1), (False, 1)]


@pytest.mark.parametrize("influence", ["summed", "matrix"])
def test_tracin_step_with_non_finite_gradients_is_skipped_like_a_standard_step(tiny_setup, tmp_path, monkeypatch,
                                                                               influence):
    """NaN per-sample gradients (an overflow) give a non-finite influence, so no rollout is kept: the step is skipped and counted (weights
    untouched, 'skipped' logged), as a standard step with a NaN loss is; the run goes on to its end, where
    every step that could learn having been skipped is an error, not a success."""
    import ghost
    import tracin
    real = ghost.per_sample_grads
    monkeypatch.setattr(tracin, "per_sample_grads", lambda *a, **k: {n: (dA * float("nan"), dB * float("nan"))
                                                                       for n, (dA, dB) in real(*a, **k).items()})
    if influence == "matrix":  # the matrix path's products come from the captured buffers themselves
        real_m = ghost.compute_ghost_inner_product_matrix
        monkeypatch.setattr(tracin, "compute_ghost_inner_product_matrix", lambda *a, **k: real_m(*a, **k) * float("nan"))
    out = tmp_path / "inf"
    with pytest.raises(UserError, match=r"^2 of the 2 steps that could learn skipped .*diverged"):
        run(tiny_setup, out, "--max_iters=2", "--tracin=True", "--tracin_val_loss=nll", "--beta=0.0",
            f"--tracin_influence={influence}")
    ck0, ck2 = load_checkpoint(str(out / "ckpt_000000.pt")), load_checkpoint(str(out / "ckpt.pt"))
    assert ck2["iter_num"] == 2 and all(torch.equal(ck0["lora"][k], ck2["lora"][k]) for k in ck0["lora"])
    logs = [json.loads(line) for line in open(out / "log.jsonl")][1:]
    assert [l["skipped"] for l in logs] == [True, True] and all(l["skip_reason"] for l in logs)


def test_tracin_run_logs_selection(tiny_setup, tmp_path):
    out = tmp_path / "tr"
    run(tiny_setup, out, "--max_iters=2", "--tracin=True", "--tracin_val_batch_size=2", "--beta=0.0",
        "--defect_frac=0.5")
    step = json.loads(open(out / "log.jsonl").readlines()[-1])
    for k in ["selection_rate", "n_selected", "influence/mean", "time/grad_capture_train",
              "time/grad_capture_val", "time/influence", "defect/clean_base_rate"]:
        assert k in step, k
    roll = json.loads(open(out / "rollouts.jsonl").readlines()[-1])
    assert len(roll["influence"]) == len(roll["selected"]) == 8
    for a, inf, s in zip(roll["advantages"], roll["influence"], roll["selected"]):
        if a == 0:  # zero advantage, beta 0: zero gradient, zero influence, never kept
            assert inf == 0 and not s
        assert s == (inf > 0)


def test_tracin_nll_run_logs_selection(tiny_setup, tmp_path):
    out = tmp_path / "nll"
    run(tiny_setup, out, "--max_iters=2", "--tracin=True", "--tracin_val_loss=nll", "--tracin_val_batch_size=3",
        "--beta=0.0")
    step = json.loads(open(out / "log.jsonl").readlines()[-1])
    assert "selection_rate" in step and "val/reward" not in step  # nothing is sampled for validation
    roll = json.loads(open(out / "rollouts.jsonl").readlines()[-1])
    assert [s for s in roll["selected"]] == [i > 0 for i in roll["influence"]]


def tiny_model_and_data(tiny_setup):
    ck = load_checkpoint(tiny_setup)
    enc = load_tokenizer(ck["data_dir"])
    torch.manual_seed(1)
    m = GPT(GPTConfig(**ck["model_args"]))
    apply_lora(m, r=4, alpha=8, targets=("c_attn", "c_proj", "c_fc"))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return m, enc, load_split(ck["data_dir"], "val")


def test_reference_solutions_gradient_is_mean_nll(tiny_setup):
    """tracin_val_loss='nll': the GRPO loss with A = +1 on the left-padded reference solutions must
    have the gradient of the plain mean (over examples) of each solution's mean token NLL, computed
    here one unpadded example at a time with F.cross_entropy."""
    m, enc, val = tiny_model_and_data(tiny_setup)
    ex = val[:3]
    assert len({len(e["question"]) for e in ex}) > 1  # prompts of different lengths: padding is exercised
    cfg = {**tg.defaults, "micro_batch_size": 2, "max_new_tokens": 40}
    R = tracin.reference_solutions(enc, ex, "cpu")
    cfg_calls.policy_backward(m, R, cfg, cfg_calls.loss_of(cfg, beta=0.0))
    params = lora_parameters(m)
    g = [p.grad.clone() for p in params]
    m.zero_grad(set_to_none=True)
    ref = 0.0
    for e in ex:
        prompt, sol = enc.encode(prompt_text(e["question"])), enc.encode(e["solution"]) + [enc.eot_token]
        seq = torch.tensor(prompt + sol)[None]
        logits, _ = m(seq[:, :-1], targets=torch.zeros_like(seq[:, :-1]))  # full logits, no padding
        ref = ref + F.cross_entropy(logits[0, len(prompt) - 1:], seq[0, len(prompt):]) / len(ex)
    ref.backward()
    for a, p in zip(g, params):
        assert torch.allclose(a, p.grad, atol=1e-6, rtol=1e-4)
    assert any(a.abs().max() > 1e-4 for a in g)


def test_train_and_val_sampled_in_one_call(tiny_setup, monkeypatch):
    """make_rollouts with two batches = one generate call over the concatenated prompts, each batch's
    uniforms from its own stream (TracIn's 'pg' validation batch: Prompts.generator), scored per
    batch: with scale_rewards='batch' each part uses its own std."""
    m, enc, val = tiny_model_and_data(tiny_setup)
    cfg = {**tg.defaults, "group_size": 4, "max_new_tokens": 8, "scale_rewards": "batch",
           "reward_funcs": ("correctness", "format", "chars"), "reward_weights": (1.0, 0.5, 1.0)}
    task, run_funcs = TASKS["arith"], (cfg["reward_funcs"], cfg["reward_weights"])
    prompts = lambda rows: [encode_prompt(enc, e["question"]) for e in rows]  # noqa: E731
    gen = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    a = grpo.Prompts(prompts(val[:2]), [e["answer"] for e in val[:2]], *run_funcs)
    b = grpo.Prompts(prompts(val[2:5]), [e["answer"] for e in val[2:5]], task["rewards"], task["weights"],
                     generator=gen(4))
    calls, real = [], grpo.generate

    def spy(model, p, *x, **k):  # each generate call's prompts and uniforms
        calls.append((p, k["u"]))
        return real(model, p, *x, **k)
    monkeypatch.setattr(grpo, "generate", spy)
    R, V = cfg_calls.make_rollouts(m, enc, [a, b], cfg, gen(3))
    ((ids, u),) = calls  # one call, both batches' prompts
    assert ids == a.ids + b.ids
    S = cfg["max_new_tokens"]
    own_streams = [torch.rand(S, 2 * 4, generator=gen(3)), torch.rand(S, 3 * 4, generator=gen(4))]
    assert torch.equal(u, torch.cat(own_streams, 1))
    cfg_calls.make_rollouts(m, enc, [a], cfg, gen(3))  # alone, the training rows draw the same uniforms
    assert torch.equal(calls[1][1], u[:, :2 * 4])
    # the training part scored by the run's rewards, the validation part by its own (the task's,
    # data/tasks.TASKS): 'chars' paid R's rows, not V's
    for P, batch, funcs in ((R, a, run_funcs), (V, b, (task["rewards"], task["weights"]))):
        texts = decode_completions(enc, P.idx, P.mask)
        own, _, _ = compute_rewards(texts, [x for x in batch.answers for _ in range(4)], *funcs)
        assert P.rewards.tolist() == pytest.approx(own)
    assert set(V.per_fn) == set(task["rewards"]) and "chars" in R.per_fn
    for P in (R, V):
        adv, _ = grpo.compute_group_advantages(P.rewards, 4, "batch")
        assert torch.equal(P.advantages, adv)


@pytest.mark.parametrize("args, match", [
    (["--group_size=1", "--micro_batch_size=2"], "group_size"),
    (["--micro_batch_size=3"], "micro-batches"),
    (["--init_from=resume"], "checkpoint not found"),
    (["--loss_type=nope"], "loss_type"),
    (["--max_iters=1"], "already holds a run"),
    (["--tracin=True", "--grad_checkpoint=True"], "tracin"),
    (["--tracin=True", "--tracin_val_loss=mse"], "tracin_val_loss"),
])
def test_bad_config(tiny_setup, tmp_path, args, match):
    if match == "already holds a run":
        run(tiny_setup, tmp_path / "bad", "--max_iters=1")
        before = open(tmp_path / "bad" / "rollouts.jsonl").read()
    with pytest.raises(UserError, match=match):
        run(tiny_setup, tmp_path / "bad", "--max_iters=1", *args)
    if match == "already holds a run":  # nothing of the first run was lost
        assert open(tmp_path / "bad" / "rollouts.jsonl").read() == before


def test_mask_truncated_completions(tiny_setup, tmp_path):
    out = tmp_path / "trunc"
    run(tiny_setup, out, "--max_iters=1", "--max_new_tokens=3", "--mask_truncated_completions=True")
    roll = json.loads(open(out / "rollouts.jsonl").readline())
    eot = load_tokenizer(load_checkpoint(tiny_setup)["data_dir"]).eot_token
    n_trunc = 0
    for toks, m in zip(roll["completion_tokens"], roll["completion_mask"]):
        if eot not in toks:          # never ended: no token of it may carry loss
            assert sum(m) == 0
            n_trunc += 1
        else:                        # ended: 1 up to and including the end-of-text
            assert m == [1] * (toks.index(eot) + 1) + [0] * (len(toks) - toks.index(eot) - 1)
    assert n_trunc > 0


def test_sample_cli_loads_grpo_checkpoint(tiny_setup, tmp_path, capsys):
    import sample
    out = tmp_path / "cli"
    run(tiny_setup, out, "--max_iters=1")
    model, enc, _ = runs.loading.load_policy(str(out / "ckpt.pt"))
    assert any(".lora_" in n for n, _ in model.named_parameters())  # the adapter is applied
    lora = load_checkpoint(str(out / "ckpt.pt"))["lora"]
    assert all(torch.equal(dict(model.named_parameters())[k], v) for k, v in lora.items())
    capsys.readouterr()
    sample.main([f"--ckpt={out / 'ckpt.pt'}", "--num_questions=2", "--num_samples=2", "--max_new_tokens=4"])
    printed = capsys.readouterr().out
    assert printed.count("--- ") == 2 and len(printed.strip().splitlines()) >= 6


@pytest.mark.parametrize("mode", ["standard", "pg", "nll"])
def test_grpo_step_under_bf16_autocast(tiny_setup, mode, monkeypatch):
    """The CUDA path's dtype mixing (bf16 autocast, float32 LoRA weights and AdamW state), exercised
    with CPU autocast: a step runs, its loss and gradient are finite, the weights move and stay float32."""
    m, enc, val = tiny_model_and_data(tiny_setup)
    cfg = {**tg.defaults, "group_size": 4, "max_new_tokens": 8, "micro_batch_size": 8, "tracin": mode != "standard",
           "tracin_val_loss": "nll" if mode == "nll" else "pg", "beta": 0.04 if mode == "standard" else 0.0,
           "reward_funcs": ("correctness", "format", "chars"), "reward_weights": (1.0, 0.5, 1.0)}
    if mode == "pg":  # the validation batch is scored by the task's rewards: 'chars' too, for a signal
        monkeypatch.setitem(TASKS, "arith", {**TASKS["arith"], "rewards": cfg["reward_funcs"],
                                             "weights": cfg["reward_weights"]})
    opt = torch.optim.AdamW(lora_parameters(m), lr=1e-2)
    before = [p.detach().clone() for p in lora_parameters(m)]
    amp = torch.autocast("cpu", dtype=torch.bfloat16)  # every pass of the step under bf16 autocast
    funcs = (cfg["reward_funcs"], cfg["reward_weights"])
    v = val[2:5]
    v = tracin.reference_solutions(enc, v, "cpu") if mode == "nll" else \
        grpo.Prompts([encode_prompt(enc, e["question"]) for e in v], [e["answer"] for e in v], *funcs)
    batch = grpo.Prompts([encode_prompt(enc, e["question"]) for e in val[:2]], [e["answer"] for e in val[:2]],
                         *funcs)
    rollouts, result = cfg_calls.grpo_step(m, opt, enc, batch, cfg, torch.Generator().manual_seed(0), amp, v)
    log = step_log(rollouts, result, cfg)
    assert not log["skipped"] and math.isfinite(log["loss"]) and math.isfinite(log["grad_norm"])
    assert all(p.dtype == torch.float32 for p in lora_parameters(m))
    assert any(not torch.equal(a, p) for a, p in zip(before, lora_parameters(m)))


# ---------------------------------------------------------------------------- TRL-complete GRPO
def test_advantages_leave_unscored_out_and_use_epsilon():
    nan = float("nan")
    r = torch.tensor([1.0, nan, 0.0, 2.0, nan, nan, nan, 5.0, 3.0, 3.0, nan, 3.0])
    adv, n_zero = grpo.compute_group_advantages(r, 4, "group", epsilon=1e-4)
    xs = [1.0, 0.0, 2.0]                                   # group 0's scored rewards
    m, sd = sum(xs) / 3, math.sqrt(sum((x - sum(xs) / 3) ** 2 for x in xs) / 2)
    want = [(1.0 - m) / (sd + 1e-4), 0.0, (0.0 - m) / (sd + 1e-4), (2.0 - m) / (sd + 1e-4)]
    assert adv[:4].tolist() == pytest.approx(want, abs=1e-6)
    assert adv[4:].tolist() == [0.0] * 8                   # one scored reward, or all equal: no signal
    assert n_zero == 2 and torch.isfinite(adv).all()


def test_reward_function_may_return_none(monkeypatch):
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "picky", lambda c, a: None if c == "?" else 2.0)
    totals, per_fn, _ = rewards.compute_rewards(["#### 3", "?", "x"], [3, 3, 3], ["picky", "correctness"], [0.5, 1.0])
    assert totals == [2.0, 0.0, 1.0] and math.isnan(per_fn["picky"][1])   # left out of the total
    totals, _, _ = rewards.compute_rewards(["?"], [3], ["picky"], [1.0])
    assert math.isnan(totals[0])                                          # nothing could score it


def test_old_and_reference_logprobs_are_the_sampling_and_base_policies(lora_gpt):
    lora_gpt = lora_gpt[0]
    torch.manual_seed(0)
    idx = torch.randint(1, 50, (5, 9))
    batch = grpo.Rollouts(idx, torch.zeros(5, dtype=torch.long), torch.ones(5, 4, dtype=torch.long), None)
    cfg = {**tg.defaults, "micro_batch_size": 2, "beta": 0.1}
    old = cfg_calls.old_logprobs(lora_gpt, batch, cfg)
    ref = cfg_calls.reference_logprobs(lora_gpt, batch, cfg)
    full = F.log_softmax(lora_gpt(idx[:, :-1], keep_last=4)[0].double(), -1).gather(-1, idx[:, -4:, None]).squeeze(-1)
    assert torch.allclose(old.double(), full, atol=1e-5) and not old.requires_grad
    with disable_lora(lora_gpt):
        base = F.log_softmax(lora_gpt(idx[:, :-1], keep_last=4)[0].double(), -1).gather(-1, idx[:, -4:, None]).squeeze(-1)
    assert torch.allclose(ref.double(), base, atol=1e-5) and (ref - old).abs().max() > 1e-3


def test_num_iterations_two_clips_and_takes_two_steps(tiny_setup, tmp_path):
    out = tmp_path / "mu2"
    run(tiny_setup, out, "--max_iters=3", "--num_iterations=2", "--epsilon_low=0.001", "--epsilon_high=0.001",
        "--learning_rate=0.05", "--loss_type=dapo", "--importance_sampling_level=sequence")
    logs = [json.loads(line) for line in open(out / "log.jsonl")][1:]
    assert any(l["clip_ratio/low"] > 0 for l in logs) and any(l["clip_ratio/high"] > 0 for l in logs)
    assert all(l["clip_ratio"] == pytest.approx(l["clip_ratio/low"] + l["clip_ratio/high"]) for l in logs)
    opt = load_checkpoint(str(out / "ckpt.pt"))["optimizer"]
    assert all(s["step"] == 6 for s in opt["state"].values())   # 2 AdamW steps per generation
    one = tmp_path / "mu1"
    run(tiny_setup, one, "--max_iters=3")
    assert all(l["clip_ratio"] == 0 for l in [json.loads(x) for x in open(one / "log.jsonl")][1:])  # ratio 1


def test_tracin_refuses_num_iterations_above_one(tiny_setup, tmp_path):
    with pytest.raises(UserError, match="'num_iterations' = 2 is not allowed: must be 1 with tracin=True"):
        run(tiny_setup, tmp_path / "r", "--tracin=True", "--num_iterations=2", "--beta=0.0")


def test_reward_cache_scores_each_completion_once(monkeypatch):
    import rewards
    calls = []
    monkeypatch.setitem(rewards.REWARD_FUNCS, "counted", lambda c, a: calls.append((c, a)) or len(c))
    cache = rewards.RewardCache()
    texts, answers = ["#### 3", "ab", "#### 3", "ab"], [3, 3, 3, 4]
    plain = rewards.compute_rewards(texts, answers, ["counted", "correctness"], [1.0, 1.0])
    calls.clear()
    first = rewards.compute_rewards(texts, answers, ["counted", "correctness"], [1.0, 1.0], cache)
    again = rewards.compute_rewards(texts, answers, ["counted", "correctness"], [1.0, 1.0], cache)
    assert first == again == plain
    assert sorted(calls) == sorted({("#### 3", 3), ("ab", 3), ("ab", 4)})   # 3 distinct (text, answer)
    assert cache.lookups == 16 and cache.hits == 16 - 6


def test_background_rewards_give_the_same_run(tiny_setup, tmp_path):
    """Scoring on a worker thread while the reference pass runs changes nothing but the timing."""
    run(tiny_setup, tmp_path / "fg", "--max_iters=2", "--beta=0.1")
    run(tiny_setup, tmp_path / "bg", "--max_iters=2", "--beta=0.1", "--background_rewards=True")
    fg, bg = (load_checkpoint(str(tmp_path / d / "ckpt.pt"))["lora"] for d in ("fg", "bg"))
    assert all(torch.equal(fg[k], bg[k]) for k in fg)
    logs = [json.loads(line) for line in open(tmp_path / "bg" / "log.jsonl")][1:]
    assert all(0 <= l["rewards/cache_hit_rate"] <= 1 for l in logs) and logs[-1]["kl"] > 0  # a real reference pass
