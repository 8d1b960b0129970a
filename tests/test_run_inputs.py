# train_grpo.py and train_base.py given input that used to end in a traceback, a silent run or a lost
# file: a run directory that is its base's (the base kept, byte for byte), a config file that exits,
# a checkpoint file that holds no dict, a resumed checkpoint missing its parts, reward functions that
# cannot read the task's answers or weights that overflow, and SIGTERM (the resume command, exit
# status 143, the lock let go). References: the files before and after, a real process and signal.
# Run: python -m pytest -q tests/test_run_inputs.py
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import train_grpo as tg
from configurator import UserError
from runs.checkpoint import load_checkpoint
from test_train_grpo import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("chars_reward")


def test_a_run_in_its_bases_directory_is_refused_and_the_base_kept(tiny_setup, tmp_path):
    base = tmp_path / "b"
    shutil.copytree(os.path.dirname(tiny_setup), base)
    before = {n: (base / n).read_bytes() for n in os.listdir(base)}
    for out in (base, tmp_path / "b" / "." ):
        with pytest.raises(UserError, match="'out_dir' = .* is the base's directory"):
            tg.main([f"--base_ckpt={base}/ckpt.pt", f"--out_dir={out}", "--max_iters=1"])
    assert {n: (base / n).read_bytes() for n in os.listdir(base)} == before


def test_a_config_file_that_exits_is_named(tiny_setup, tmp_path):
    conf = tmp_path / "c.py"
    conf.write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(UserError, match=f"config file {conf}, line 2: SystemExit"):
        tg.main([str(conf), f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'r'}"])
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("obj", [torch.zeros(2), [1, 2], None, 5])
def test_a_file_that_holds_no_dict_is_not_a_checkpoint(tmp_path, obj):
    torch.save(obj, tmp_path / "t.pt")
    with pytest.raises(UserError, match=r"t.pt holds a \w+, not a checkpoint"):
        load_checkpoint(str(tmp_path / "t.pt"))


@pytest.mark.parametrize("key, value", [("optimizer", None), ("iter_num", None), ("rng", None),
                                        ("train_seconds", None), ("config", [1]),
                                        ("iter_num", "3")])
def test_a_resumed_checkpoint_missing_its_parts_is_one_line(tiny_setup, tmp_path, key, value):
    out = tmp_path / "r"
    run(tiny_setup, out, "--max_iters=1")
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    if value is None:
        del ckpt[key]
    else:
        ckpt[key] = value
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(UserError, match="is not a train_grpo.py checkpoint .*changed since"):
        tg.main([f"--out_dir={out}", "--init_from=resume"])


def test_an_optimizer_state_that_does_not_fit_is_one_line(tiny_setup, tmp_path):
    out = tmp_path / "r"
    run(tiny_setup, out, "--max_iters=1")
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    ckpt["optimizer"]["param_groups"] = ckpt["optimizer"]["param_groups"] * 2
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(UserError, match="its optimizer or random state does not fit"):
        tg.main([f"--out_dir={out}", "--init_from=resume"])


@pytest.mark.parametrize("arg, said", [
    ("--reward_funcs=countdown", "countdown cannot score the arith task's answers"),
    ("--reward_funcs=[['correctness']]", "a non-empty list of distinct names"),
    ("--reward_weights=1e39,1", "at most 1e18"),
])
def test_rewards_that_cannot_work_are_refused_before_iteration_0(tiny_setup, tmp_path, arg, said):
    """Before: countdown's reward on arith answers raised at every call, caught and counted, and the
    run went on without a learning signal; a nested name raised TypeError; 1e39 gave Inf rewards."""
    weights = ["--reward_weights=1.0"] if arg == "--reward_funcs=countdown" else []
    with pytest.raises(UserError, match=said):
        tg.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'r'}", arg, *weights])
    assert not os.path.exists(tmp_path / "r" / "ckpt.pt")


def test_sigterm_ends_a_run_as_ctrl_c_does(tiny_setup, tmp_path):
    out = tmp_path / "r"
    p = subprocess.Popen([sys.executable, "train_grpo.py", f"--base_ckpt={tiny_setup}",
                          f"--out_dir={out}", "--max_iters=100000", "--batch_size=2",
                          "--group_size=2", "--max_new_tokens=4", "--eval_n=2", "--eval_k=1",
                          "--log_interval=1", "--ckpt_interval=1", "--reward_funcs=correctness",
                          "--reward_weights=1.0"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for line in p.stdout:  # the loop is running: a step has been logged
            if line.startswith("iter    2"):
                break
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("terminated (SIGTERM): ") and "--init_from=resume" in last, err
    assert not os.path.exists(out / "run.lock") and os.path.exists(out / "ckpt.pt")


@pytest.mark.parametrize("arg, said", [
    ("--group_size=100000000", "cannot allocate sampling's KV cache .*lower batch_size"),
    ("--eval_k=10000000", "cannot allocate sampling's KV cache"),
    ("--tracin=True --tracin_val_loss=pg --tracin_val_batch_size=100000000",
     "cannot allocate sampling's KV cache"),
    ("--lora_r=1000000000000", "cannot allocate a LoRA adapter of rank r=1000000000000"),
])
def test_sizes_beyond_the_memory_are_refused_before_iteration_0(tiny_setup, tmp_path, arg, said):
    """Before: a traceback from the allocator after the first files were written, or a run that
    never finished its first step."""
    with pytest.raises(UserError, match=said):
        tg.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'r'}", *arg.split()])
    assert not os.path.exists(tmp_path / "r" / "ckpt_000000.pt")


def test_a_base_batch_beyond_the_memory_is_refused_before_iteration_0(tmp_path, monkeypatch):
    import train_base
    from data.datadir import load_tokenizer
    from data.gsm_synth.prepare import prepare
    from test_base_resume import ARGS
    d = prepare(steps=1, max_operand=5, ops="+", n_train=200, n_val=10, n_test=10, num_merges=20,
                verbose=False, root=str(tmp_path / "data"))
    monkeypatch.setattr(train_base, "load_task", lambda cfg, verbose=True: (d, load_tokenizer(d)))
    with pytest.raises(UserError, match="'batch_size' = 100000000 is not allowed: a batch's logits"):
        train_base.main([f"--out_dir={tmp_path / 'b'}", *ARGS, "--batch_size=100000000"])
    assert not os.path.exists(tmp_path / "b" / "ckpt.pt")


@pytest.mark.parametrize("text, said", [
    ("out_dir = 5\n", r"base_config .*b.py: out_dir = 5 is not a directory's path"),
    ("n_head = 3\n", r"training the base with base_config .*b.py: config key 'n_embd'"),
])
def test_a_base_config_at_fault_is_named(tmp_path, monkeypatch, text, said):
    """The base a fresh run trains first (train_grpo.train_missing_base): its config file is named."""
    conf = tmp_path / "b.py"
    out = tmp_path / "base"
    conf.write_text(f"out_dir = {str(out)!r}\nmax_iters = 1\n{text}")
    with pytest.raises(UserError, match=said):
        tg.main([f"--base_config={conf}", f"--base_ckpt={out}/ckpt.pt",
                 f"--out_dir={tmp_path / 'r'}"])
    assert not os.path.exists(out / "ckpt.pt") and not os.path.exists(tmp_path / "r")
