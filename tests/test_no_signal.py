"""A run that cannot learn says so: metrics.NoSignal on hand-made logs, and whole train_grpo.py runs with a
reward that never varies (every advantage 0) and with one that does. Run: python -m pytest -q tests/test_no_signal.py"""
import train_grpo
from runs.metrics import NoSignal


def test_warns_once_after_patience_steps_in_a_row(capsys):
    watch = NoSignal(patience=3)
    for frac in (1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0):
        watch.after_step({"frac_reward_zero_std": frac})
    out = capsys.readouterr().out
    assert out.count("warning: 3 steps in a row without a learning signal") == 1  # at the 6th step, never again
    assert watch.summary() == "; 9 of 11 steps had no learning signal"
    assert NoSignal().summary() == ""
    skipped = NoSignal(patience=1)
    skipped.after_step({"skipped": True})  # a skipped (NaN) step has no advantages to judge: not counted
    assert skipped.steps == 0 and capsys.readouterr().out == ""


def run(tiny_setup, out, reward, steps=6):
    return train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={out}", f"--max_iters={steps}", "--batch_size=2",
                            "--group_size=4", "--max_new_tokens=8", "--eval_n=2", "--eval_interval=100",
                            f"--reward_funcs=('{reward}',)", "--reward_weights=(1.0,)"])


def test_a_run_whose_reward_never_varies_says_so(tiny_setup, tmp_path, capsys):
    run(tiny_setup, tmp_path / "flat", "correctness")  # a random base never writes '#### N': always 0
    out = capsys.readouterr().out
    assert out.count("without a learning signal") == 1 and "a reward may never fire" in out
    assert "done: 6 GRPO steps" in out and out.rstrip().endswith("; 6 of 6 steps had no learning signal")


def test_a_run_that_learns_says_nothing(tiny_setup, tmp_path, capsys, chars_reward):
    run(tiny_setup, tmp_path / "chars", "chars")
    out = capsys.readouterr().out
    assert "learning signal" not in out and "done: 6 GRPO steps" in out
