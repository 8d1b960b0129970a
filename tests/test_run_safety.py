# Whole runs of train_grpo.py / train_base.py / sample.py given bad input or faults: every knob refused
# before any file is written, run directories never mixed, resume continues the saved run, an adapter
# bound to its base, NaN/Inf logits, Ctrl-C. Run: python -m pytest tests/test_run_safety.py -q
import glob
import json
import os

import pytest
import torch

import runs.evaluate
import runs.loading
import runs.state
import sample
from model import NonFiniteLogits, Sampling, generate, sample_next, uniforms
import train_base as tb
import grpo
import train_grpo as tg
from configurator import Interrupted, UserError
from runs.checkpoint import load_checkpoint, save_checkpoint
from test_train_grpo import run

pytestmark = pytest.mark.usefixtures("chars_reward")


@pytest.mark.parametrize("arg, key", [
    ("--batch_size=0", "batch_size"), ("--micro_batch_size=-4", "micro_batch_size"),
    ("--ckpt_interval=0", "ckpt_interval"), ("--eval_interval=0", "eval_interval"), ("--eval_n=0", "eval_n"),
    ("--tracin_val_batch_size=0", "tracin_val_batch_size"), ("--top_k=-1", "top_k"), ("--top_p=0", "top_p"),
    ("--top_p=1.5", "top_p"), ("--temperature=-1", "temperature"), ("--temperature=0", "temperature"),
    ("--learning_rate=0", "learning_rate"), ("--learning_rate=-1e-3", "learning_rate"),
    ("--defect_frac=1.5", "defect_frac"), ("--defect_frac=-0.1", "defect_frac"),
    ("--reward_funcs=nope", "reward_funcs"), ("--reward_funcs=correctness,correctness", "reward_funcs"),
    ("--reward_weights=(1.0,)", "reward_weights"), ("--reward_weights=(1.0,'x',2.0)", "reward_weights"),
    ("--out_dir=", "out_dir"), ("--max_iters=-1", "max_iters"), ("--group_size=1", "group_size"),
    ("--scale_rewards=z", "scale_rewards"), ("--tracin_selection=all", "tracin_selection"),
    ("--tracin_topk_frac=0", "tracin_topk_frac"), ("--lora_r=0", "lora_r"), ("--lora_dropout=1.0", "lora_dropout"),
    ("--max_skipped_steps=0", "max_skipped_steps"), ("--max_new_tokens=0", "max_new_tokens"),
    ("--lora_targets=()", "lora_targets"), ("--grad_clip=0", "grad_clip"), ("--base_ckpt=", "base_ckpt"),
    ("--loss_type=x", "loss_type"),
])
def test_every_grpo_knob_refused_before_any_file(tiny_setup, tmp_path, arg, key):
    out = tmp_path / "run"
    with pytest.raises(UserError, match=f"'{key}' = .* is not allowed"):
        tg.main([f"--base_ckpt={tiny_setup}", f"--out_dir={out}", arg] if arg != "--out_dir=" else
                [f"--base_ckpt={tiny_setup}", arg])
    assert not out.exists()


@pytest.mark.parametrize("device", ["gpu", "cuda0", "tpu"])
def test_unknown_device(tiny_setup, tmp_path, device):
    with pytest.raises(UserError, match=f"unknown device '{device}'"):
        tg.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'r'}", f"--device={device}"])
    assert not (tmp_path / "r").exists()


def test_bad_lora_target_regex(tiny_setup, tmp_path):
    with pytest.raises(UserError, match="'c_attn\\(' is neither a layer name nor a valid regex"):
        run(tiny_setup, tmp_path / "r", "--lora_targets=c_attn(")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("arg, key", [("--n_seq=0", "n_seq"), ("--repeats=-1", "repeats"),
                                      ("--mem_n_layer=-1", "mem_n_layer"), ("--seq_lens=()", "seq_lens"),
                                      ("--seq_lens=(64,0)", "seq_lens"), ("--rows=sampling,nope", "rows")])
def test_bench_knobs(arg, key):
    from bench import run as bench
    with pytest.raises(UserError, match=f"'{key}' = .* is not allowed"):
        bench.main([arg])


def test_max_new_tokens_must_fit_the_context(tiny_setup, tmp_path):
    with pytest.raises(UserError, match="max_new_tokens.*context of 128"):
        run(tiny_setup, tmp_path / "r", "--max_new_tokens=126")
    assert not (tmp_path / "r").exists()  # nothing written, not even the directory


@pytest.mark.parametrize("name", ["log.jsonl", "rollouts.jsonl", "ckpt_000000.pt", "ckpt.pt"])
def test_fresh_run_refuses_a_directory_with_any_run_file(tiny_setup, tmp_path, name):
    out = tmp_path / "r"
    out.mkdir()
    (out / name).write_text("precious\n")
    # with a ckpt.pt the advice is to resume it; without one there is nothing to resume from
    said = "already holds a run" if name == "ckpt.pt" else "holds the files of a run that stopped before its first " \
        "checkpoint"
    with pytest.raises(UserError, match=f"{said} \\({name}\\)"):
        run(tiny_setup, out, "--max_iters=1")
    assert sorted(os.listdir(out)) == [name] and (out / name).read_text() == "precious\n"


def test_resume_restores_the_saved_config(tiny_setup, tmp_path, capsys):
    out = tmp_path / "r"
    run(tiny_setup, out, "--max_iters=2", "--max_new_tokens=6")
    capsys.readouterr()
    # only out_dir, init_from and max_iters given: batch_size, group_size, rewards... come from the saved run
    tg.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=3", "--eval_interval=50"])
    printed = capsys.readouterr().out
    cfg = load_checkpoint(str(out / "ckpt.pt"))["config"]
    assert (cfg["batch_size"], cfg["group_size"], cfg["max_new_tokens"], cfg["max_iters"]) == (2, 4, 6, 3)
    assert cfg["reward_funcs"] == ("correctness", "format", "chars") and cfg["eval_interval"] == 50
    assert "resume: max_iters = 3 (the saved run had 2)" in printed
    assert "resume: eval_interval = 50 (the saved run had 100)" in printed
    rows = [json.loads(line) for line in open(out / "rollouts.jsonl")]
    assert [r["iter"] for r in rows] == [1, 2, 3] and len(rows[-1]["rewards"]) == 2 * 4


def test_resume_refuses_another_base_of_the_same_shape(tiny_setup, tmp_path):
    base = load_checkpoint(tiny_setup)
    other = tmp_path / "base" / "ckpt.pt"
    save_checkpoint(base, str(other))
    run(other, tmp_path / "r", "--max_iters=1")
    base["model"] = {k: v + 1e-3 if v.is_floating_point() else v for k, v in base["model"].items()}  # "retrained"
    save_checkpoint(base, str(other))
    with pytest.raises(UserError, match=r"another base than .*base/ckpt.pt holds now \(changed: its weights"):
        tg.main([f"--out_dir={tmp_path / 'r'}", "--init_from=resume", "--max_iters=2"])
    with pytest.raises(UserError, match=r"another base than .*base/ckpt.pt holds now \(changed: its weights"):
        runs.loading.load_policy(str(tmp_path / "r" / "ckpt.pt"))


def test_nonfinite_logits_skip_steps_then_stop(tiny_setup, tmp_path, monkeypatch, capsys):
    """A learning rate that turns the weights into NaN: every later step sees NaN logits while sampling,
    is skipped (no rollouts, no checkpoint of the broken weights), and the run stops after
    max_skipped_steps of them instead of finishing as if it had learned something."""
    real_step = torch.optim.AdamW.step

    def blow_up(self, *a, **k):
        real_step(self, *a, **k)
        with torch.no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    p.fill_(float("inf"))
    monkeypatch.setattr(torch.optim.AdamW, "step", blow_up)
    out = tmp_path / "r"
    with pytest.raises(UserError, match="3 steps in a row skipped \\(non-finite logits\\) at iter 4.*iter 0"):
        run(tiny_setup, out, "--max_iters=20", "--max_skipped_steps=3")
    logs = [json.loads(line) for line in open(out / "log.jsonl")]
    assert [l["skipped"] for l in logs[1:]] == [False, True, True, True]
    assert [json.loads(line)["iter"] for line in open(out / "rollouts.jsonl")] == [1]
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 0      # none with the broken weights
    assert all(torch.isfinite(v).all() for v in load_checkpoint(str(out / "ckpt.pt"))["lora"].values())
    assert "NaN/Inf logits" in capsys.readouterr().out


def test_generate_reports_nonfinite_logits(tiny_gpt):
    with torch.no_grad():
        tiny_gpt.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(NonFiniteLogits, match="NaN/Inf logits"):
        generate(tiny_gpt, [[1, 2, 3]], 4, eot_id=0, num_samples=2, u=uniforms(4, 2, 0, "cpu"))
    assert not tiny_gpt.training


def test_ctrl_c_names_the_checkpoint_and_the_resume_command(tiny_setup, tmp_path, monkeypatch):
    out = tmp_path / "r"
    real, calls = tg.grpo_step, []

    def interrupted_third_step(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(tg, "grpo_step", interrupted_third_step)
    with pytest.raises(Interrupted) as e:
        run(tiny_setup, out, "--max_iters=5", "--ckpt_interval=2")
    msg = str(e.value)
    assert "stopped at iter 2 of 5" in msg and f"{out}/ckpt.pt (iter 2)" in msg
    assert msg.endswith(f"python train_grpo.py --out_dir={out} --init_from=resume") and "\n" not in msg
    assert not glob.glob(str(out / "*.tmp")) and not (out / "run.lock").exists()
    monkeypatch.setattr(tg, "grpo_step", real)
    tg.main([f"--out_dir={out}", "--init_from=resume"])      # the printed command, as it is
    assert [json.loads(line)["iter"] for line in open(out / "rollouts.jsonl")] == [1, 2, 3, 4, 5]


def test_cut_off_log_line_does_not_block_resume(tiny_setup, tmp_path, capsys):
    out = tmp_path / "r"
    run(tiny_setup, out, "--max_iters=2")
    for name in ("log.jsonl", "rollouts.jsonl"):
        with open(out / name, "a") as f:
            f.write('{"iter": 3, "rewa')                          # a crash in the middle of a write
    tg.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=3"])
    assert "cut off" in capsys.readouterr().err
    assert [json.loads(line)["iter"] for line in open(out / "rollouts.jsonl")] == [1, 2, 3]


def test_question_text_is_taken_as_typed(tiny_setup, capsys):
    sample.main([f"--ckpt={tiny_setup}", "--question=1234", "--num_samples=1", "--max_new_tokens=2"])
    assert "--- 1234" in capsys.readouterr().out
    sample.main([f"--ckpt={tiny_setup}", "--question=a <|endoftext|> b", "--num_samples=1", "--max_new_tokens=2"])
    assert "--- a <|endoftext|> b" in capsys.readouterr().out


@pytest.mark.parametrize("arg, key", [("--num_samples=0", "num_samples"), ("--num_questions=-1", "num_questions"),
                                      ("--top_p=0", "top_p"), ("--temperature=-0.5", "temperature"),
                                      ("--top_k=-2", "top_k"), ("--ckpt=", "ckpt")])
def test_sample_cli_knobs(tiny_setup, arg, key):
    with pytest.raises(UserError, match=f"'{key}' = .* is not allowed"):
        sample.main([f"--ckpt={tiny_setup}", arg])


def test_top_p_tiny_keeps_the_most_likely_token():
    logits = torch.randn(64, 50)
    for top_p in (1e-12, 1e-3):
        u = torch.rand(64, generator=torch.Generator().manual_seed(0))
        got = sample_next(logits, Sampling(top_p=top_p), u)
        assert torch.equal(got, logits.argmax(-1))


def test_selective_log_softmax_refuses_double_backward():
    logits = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    logp = grpo.selective_log_softmax(logits, torch.randint(7, (2, 3)))
    (g,) = torch.autograd.grad(logp.sum(), logits, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        torch.autograd.grad(g.pow(2).sum(), logits)


# ---------------------------------------------------------------------------- train_base.py
@pytest.fixture
def base_args(tiny_setup, monkeypatch, tmp_path):
    from data.datadir import load_tokenizer
    data_dir = load_checkpoint(tiny_setup)["data_dir"]
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: (data_dir, load_tokenizer(data_dir)))
    return [f"--out_dir={tmp_path / 'b'}", "--n_layer=1", "--n_embd=16", "--n_head=2", "--batch_size=4",
            "--eval_n=2", "--eval_interval=2", "--log_interval=1", "--max_new_tokens=4", "--warmup_iters=1"]


@pytest.mark.parametrize("arg, key", [("--n_head=3", "n_embd"), ("--task_steps=0", "task_steps"),
                                      ("--task_ops=x", "task_ops"), ("--task_noise=2.0", "task_noise"),
                                      ("--task_max_operand=0", "task_max_operand"), ("--batch_size=0", "batch_size"),
                                      ("--dropout=1.0", "dropout"), ("--learning_rate=0", "learning_rate")])
def test_base_knobs_refused_before_any_file(base_args, tmp_path, arg, key):
    with pytest.raises(UserError, match=f"'{key}' = .* is not allowed"):
        tb.main([*base_args, arg])
    assert not (tmp_path / "b").exists()


def test_base_refuses_to_overwrite_and_resumes_with_saved_config(base_args, tmp_path, capsys):
    tb.main([*base_args, "--max_iters=2"])
    ckpt = tmp_path / "b" / "ckpt.pt"
    before = ckpt.read_bytes()
    with pytest.raises(UserError, match="ckpt.pt exists: continue that run with --init_from=resume"):
        tb.main([*base_args, "--max_iters=2"])
    assert ckpt.read_bytes() == before
    capsys.readouterr()
    tb.main([f"--out_dir={tmp_path / 'b'}", "--init_from=resume", "--max_iters=4"])  # n_embd=16 etc. restored
    c = load_checkpoint(str(ckpt))
    assert c["iter_num"] == 4 and c["model_args"]["n_embd"] == 16 and c["config"]["batch_size"] == 4
    assert "resume: max_iters = 4 (the saved run had 2)" in capsys.readouterr().out


def test_base_divergence_is_an_error(base_args):
    with pytest.raises(UserError, match="training diverged; lower learning_rate"):
        tb.main([*base_args, "--max_iters=4", "--learning_rate=1e30", "--grad_clip=1e30", "--warmup_iters=0"])


def test_checkpoint_lr_is_the_rate_of_the_next_step(tiny_setup, tmp_path):
    """TracIn's eta_t pairs the weights theta_t with the step taken from them: ckpt_s holds lr(s)."""
    out = tmp_path / "r"
    run(tiny_setup, out, "--max_iters=3")          # warmup_iters=1, lr_decay_iters=4, learning_rate=0.01
    for s in range(4):
        want = tb.get_lr(s, 4, 0.01, tg.defaults["min_lr"], 1)
        assert load_checkpoint(str(out / f"ckpt_{s:06d}.pt"))["lr"] == pytest.approx(want)
    assert len({load_checkpoint(str(out / f"ckpt_{s:06d}.pt"))["lr"] for s in range(4)}) == 4


def test_missing_base_is_trained_only_where_base_config_puts_it(tiny_setup, tmp_path):
    with pytest.raises(UserError, match="base_ckpt .*bsae/ckpt.pt not found; train it with: python train_base.py"):
        run(tmp_path / "bsae" / "ckpt.pt", tmp_path / "r")      # a typo'd path: no silent 800-step training
    assert not (tmp_path / "bsae").exists() and not (tmp_path / "r").exists()


def test_resume_needs_its_own_base_and_a_grpo_checkpoint(tiny_setup, tmp_path):
    base = tmp_path / "base" / "ckpt.pt"
    save_checkpoint(load_checkpoint(tiny_setup), str(base))
    run(base, tmp_path / "r", "--max_iters=1")
    with pytest.raises(UserError, match="is not a train_grpo.py checkpoint"):
        tg.main([f"--out_dir={tmp_path / 'base'}", "--init_from=resume"])
    os.remove(base)
    with pytest.raises(UserError, match=r"was trained on is not found .*: it was moved or deleted; put it back, or name "
                                         r"where it is now with --base_ckpt=PATH"):
        tg.main([f"--out_dir={tmp_path / 'r'}", "--init_from=resume", "--max_iters=2"])
    assert not base.exists()


@pytest.mark.parametrize("arg, key", [("--learning_rate=1e999", "learning_rate"), ("--beta=nan", "beta"),
                                      ("--top_p=-inf", "top_p")])
def test_non_finite_knobs(tiny_setup, tmp_path, arg, key):
    with pytest.raises(UserError, match=f"'{key}' = .* is not allowed"):
        run(tiny_setup, tmp_path / "r", arg)
    assert not (tmp_path / "r").exists()


def test_scalar_for_a_list_key(tiny_setup, tmp_path):
    run(tiny_setup, tmp_path / "r", "--max_iters=1", "--reward_funcs=chars", "--reward_weights=1.0")
    assert load_checkpoint(str(tmp_path / "r" / "ckpt.pt"))["config"]["reward_weights"] == (1.0,)


def test_ctrl_c_before_the_first_checkpoint_leaves_a_directory_the_same_command_can_use(tiny_setup, tmp_path,
                                                                                         monkeypatch):
    out = tmp_path / "r"
    real = runs.state.save_checkpoint

    def interrupted_save(state, path):  # Ctrl-C between ckpt_000000.pt and ckpt.pt
        if path.endswith("ckpt.pt") and not path.endswith("_000000.pt"):
            raise KeyboardInterrupt
        real(state, path)
    monkeypatch.setattr(runs.state, "save_checkpoint", interrupted_save)
    with pytest.raises(Interrupted, match="stopped at iter 0 of 2; no checkpoint written yet: run the same command"):
        run(tiny_setup, out, "--max_iters=2")
    assert not out.exists() or os.listdir(out) == []
    monkeypatch.setattr(runs.state, "save_checkpoint", real)
    run(tiny_setup, out, "--max_iters=2")                    # the same command now runs
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 2


def test_resume_prints_only_final_changes_and_a_moved_base_can_be_named(tiny_setup, tmp_path, capsys):
    """Arguments a later one undoes print nothing; --base_ckpt given on resume is the base used (the
    printed advice when the base has moved), checked against the run's fingerprint."""
    base = tmp_path / "base" / "ckpt.pt"
    save_checkpoint(load_checkpoint(tiny_setup), str(base))
    out = tmp_path / "r"
    run(base, out, "--max_iters=1")
    moved = tmp_path / "moved" / "ckpt.pt"
    os.makedirs(moved.parent)
    os.rename(base, moved)
    with pytest.raises(UserError, match="put it back, or name where it is now with --base_ckpt=PATH"):
        tg.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=2"])
    capsys.readouterr()
    tg.main([f"--out_dir={out}", "--init_from=resume", "--batch_size=8", "--batch_size=2", "--max_iters=2",
             f"--base_ckpt={moved}"])
    resumed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resume:")]
    assert resumed == ["resume: max_iters = 2 (the saved run had 1)",
                       f"resume: base_ckpt = {moved} (the saved run had {base})"]
    ck = load_checkpoint(str(out / "ckpt.pt"))
    assert ck["iter_num"] == 2 and ck["base_ckpt"] == str(moved) and ck["config"]["batch_size"] == 2


def test_no_accuracy_printed_as_nan(tiny_setup, tmp_path, capsys):
    """Without the task's correctness reward there is no training accuracy: '-' on the console, not nan."""
    run(tiny_setup, tmp_path / "r", "--max_iters=2", "--reward_funcs=chars", "--reward_weights=1.0")
    steps = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ")]
    assert len(steps) == 2 and all("| acc - |" in line and "nan" not in line for line in steps)


def test_missing_base_command_makes_the_file_grpo_then_uses(base_args, tiny_setup, tmp_path):
    """A base_ckpt not named ckpt.pt: train_base.py writes OUT_DIR/ckpt.pt, so the printed command says to
    give that file; followed (the tiny sizes added before it), GRPO runs on it."""
    import shlex
    wanted = tmp_path / "bases" / "model.pt"
    with pytest.raises(UserError) as e:
        run(wanted, tmp_path / "r")
    msg = str(e.value)
    train, then = msg.split("train it with: ")[1].split(" (only ")[0].split(", then give ")
    cmd = shlex.split(train)
    assert cmd[:2] == ["python", "train_base.py"] and then == f"--base_ckpt={tmp_path}/bases/ckpt.pt"
    tb.main([*base_args, *cmd[3:], "--max_iters=2"])  # (cmd[2]: the base config, whose sizes base_args replace)
    run(then.split("=", 1)[1], tmp_path / "r", "--max_iters=1")
    assert load_checkpoint(str(tmp_path / "r" / "ckpt.pt"))["base_ckpt"] == f"{tmp_path}/bases/ckpt.pt"


@pytest.mark.parametrize("fail_at", [2, 4])
def test_base_full_disk_names_the_command_that_goes_on(base_args, tmp_path, monkeypatch, fail_at):
    """train_base.py's checkpoint at iter fail_at lands on a full disk: the error names the resume command (or
    the same command, when no checkpoint was written), which then finishes the run."""
    import builtins
    import shlex
    real_open, real_save = builtins.open, tb.save_checkpoint

    def save(state, path):
        if state["iter_num"] != fail_at:
            return real_save(state, path)
        monkeypatch.setattr(builtins, "open", lambda p, mode="r", *a, **k: real_open(
            "/dev/full" if str(p).endswith(".tmp") else p, mode, *a, **k))
        try:
            return real_save(state, path)
        finally:
            monkeypatch.setattr(builtins, "open", real_open)
    with monkeypatch.context() as m:
        m.setattr(tb, "save_checkpoint", save)
        with pytest.raises(UserError, match=f"No space left on device; train_base.py stopped at iter {fail_at}") as e:
            tb.main([*base_args, "--max_iters=4"])
    msg = str(e.value)
    if fail_at == 2:
        assert msg.endswith("no checkpoint written yet: run the same command again to start over")
        tb.main([*base_args, "--max_iters=4"])
    else:
        cmd = shlex.split(msg.split("resume with: ")[1])
        assert cmd[:2] == ["python", "train_base.py"]
        tb.main(cmd[2:])
    assert load_checkpoint(str(tmp_path / "b" / "ckpt.pt"))["iter_num"] == 4


def test_a_skipped_evaluation_logs_no_nan_accuracy(tiny_setup, tmp_path, monkeypatch, capsys):
    def broken(*a, **k):
        raise NonFiniteLogits("NaN/Inf logits in 1 of 4 sampled rows")
    monkeypatch.setattr(runs.evaluate, "evaluate", broken)
    run(tiny_setup, tmp_path / "r", "--max_iters=1")
    logs = [json.loads(line) for line in open(tmp_path / "r" / "log.jsonl")]
    assert [l["iter"] for l in logs] == [0, 1] and not any("test/accuracy" in l for l in logs)
    assert "evaluation at iter 0 skipped" in capsys.readouterr().out
