"""A run that cannot learn says so: metrics.NoSignal on hand-made logs, and whole train_grpo.py runs with a
reward that never varies (every advantage 0) and with one that does. Run: python -m pytest -q tests/test_no_signal.py"""
import pytest

import train_grpo
from runs.metrics import NoSignal, Skips


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


SKIPPED = {"skipped": True, "skip_reason": "non-finite loss or gradient"}
QUIET = {"skipped": False, "frac_reward_zero_std": 1.0}   # trained, but with nothing to learn
LEARNED = {"skipped": False, "frac_reward_zero_std": 0.5}


def test_steps_without_a_signal_between_skipped_steps_do_not_reset_the_skips_in_a_row():
    """metrics.Skips: only a step that trained with a learning signal ends a run of skipped steps."""
    skips = Skips(limit=3)
    assert [skips.after_step(dict(l)) for l in (SKIPPED, QUIET, SKIPPED, QUIET)] == [None] * 4
    # the third skip of the steps that could learn: stop
    assert skips.after_step(dict(SKIPPED)) == "3 steps in a row skipped (non-finite loss or gradient)"
    skips.after_step(dict(LEARNED))
    assert skips.in_a_row == 0 and not skips.after_step(dict(SKIPPED))


def test_skipped_steps_are_counted_and_told_with_their_reasons():
    skips = Skips(limit=100)
    logs = [dict(l) for l in (LEARNED, SKIPPED, QUIET, {**SKIPPED, "skip_reason": "non-finite logits"})]
    for log in logs:
        skips.after_step(log)
    assert [log.get("skipped_steps") for log in logs] == [None, 1, 1, 2]  # log.jsonl: the count so far
    assert skips.summary() == "; 2 of 4 steps skipped (non-finite loss or gradient: 1, non-finite logits: 1)"
    assert Skips(5).summary() == "" and Skips(5).diverged() is None


@pytest.mark.parametrize("trained, skipped, diverged", [(0, 1, True), (0, 8, True), (1, 10, True),
                                                        (1, 9, False), (1, 1, False), (0, 0, False)])
def test_a_run_that_skipped_nearly_every_step_that_could_learn_has_diverged(trained, skipped, diverged):
    """More than 9 in 10 of the steps that could learn skipped, whatever steps with nothing to learn lie
    between them: the adapter hardly moved, and the run is not a success."""
    skips = Skips(limit=10 ** 6)
    for log in [LEARNED] * trained + [SKIPPED, QUIET] * skipped:
        skips.after_step(dict(log))
    said = skips.diverged()
    assert (said is not None) == diverged
    if diverged:
        assert said == f"{skipped} of the {trained + skipped} steps that could learn skipped " \
                       f"(non-finite loss or gradient: {skipped})"
