# Paired seeds: with one seed, a TracIn run and a standard GRPO run train on the same prompts at every
# step, and at step 1 (the same weights: LoRA's B starts at zero) sample the same completions. TracIn's
# validation batch draws its prompts ('nll', 'pg') and its sampling uniforms ('pg') from streams of its
# own (train_grpo.setup: val_rng, val_generator), which checkpoints save and resume restores.
# Reference: the standard run's rollouts.jsonl. Not vacuous: the TracIn runs really drew validation
# batches (their log lines hold the selection, 'pg' its validation reward), and the completions after
# step 1 differ once TracIn has trained on a subset.
# Run: python -m pytest -q tests/test_paired_seeds.py
import json

import pytest

import rewards
from test_train_grpo import run

pytestmark = pytest.mark.usefixtures("chars_reward")  # a reward that varies: groups have a signal

STEPS = 4


def records(out):
    return [json.loads(line) for line in open(out / "rollouts.jsonl")]


def logs(out):
    return [json.loads(line) for line in open(out / "log.jsonl")][1:]  # the steps' lines


@pytest.fixture(scope="module")
def standard(tiny_setup, tmp_path_factory):
    """The standard run (module-wide: conftest's 'chars' reward set here for its duration)."""
    out = tmp_path_factory.mktemp("paired") / "grpo"
    with pytest.MonkeyPatch.context() as m:
        m.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
        run(tiny_setup, out, f"--max_iters={STEPS}", "--beta=0.0", "--seed=5")
    return records(out)


@pytest.mark.parametrize("val_loss", ["nll", "pg"])
def test_a_tracin_run_trains_on_a_standard_runs_prompts_at_every_step(tiny_setup, tmp_path, standard,
                                                                       val_loss):
    out = tmp_path / val_loss
    run(tiny_setup, out, f"--max_iters={STEPS}", "--beta=0.0", "--seed=5", "--tracin=True",
        f"--tracin_val_loss={val_loss}", "--tracin_val_batch_size=3")
    tracin = records(out)
    assert [r["prompts"] for r in tracin] == [r["prompts"] for r in standard]
    assert [r["answers"] for r in tracin] == [r["answers"] for r in standard]
    assert tracin[0]["completion_tokens"] == standard[0]["completion_tokens"]
    # the TracIn side really ran TracIn, with a validation batch
    assert all("n_selected" in line for line in logs(out))
    if val_loss == "pg":
        assert all("val/reward" in line for line in logs(out))


def test_a_resumed_tracin_run_draws_the_validation_batches_an_uninterrupted_one_draws(tiny_setup, tmp_path):
    """The validation streams are saved with the run: 2 steps, resume to 4 = 4 steps in one go."""
    knobs = ("--beta=0.0", "--seed=5", "--tracin=True", "--tracin_val_loss=pg", "--tracin_val_batch_size=3")
    run(tiny_setup, tmp_path / "whole", f"--max_iters={STEPS}", *knobs)
    run(tiny_setup, tmp_path / "cut", "--max_iters=2", *knobs)
    run(tiny_setup, tmp_path / "cut", f"--max_iters={STEPS}", "--init_from=resume")
    whole, cut = logs(tmp_path / "whole"), logs(tmp_path / "cut")
    assert [line["val/reward"] for line in cut] == [line["val/reward"] for line in whole]
    assert records(tmp_path / "cut") == records(tmp_path / "whole")
