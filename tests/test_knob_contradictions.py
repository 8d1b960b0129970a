# Knobs that contradict each other or do nothing are refused (or bounded, and said) before any work:
# min_lr above learning_rate (both trainers), Countdown's give-up and variants with no miss shown, a
# curriculum's eval_n beyond the test split, and a diverging adapter's message naming every knob that
# can cause it. Errors name where a knob was set (a config file, not the command line), and a
# one-dash override is not taken for a config file's name.
# Run: python -m pytest -q tests/test_knob_contradictions.py
import json
import os
import re

import pytest

import train_base as tb
import train_grpo as tg
from checks.base_knobs import check_resume
from checks.grpo_knobs import validate
from configurator import UserError, check, configure
from data.countdown import searched
from data.countdown.solutions import searched_solution
from data.curriculum import from_config
from data.gsm_synth.prepare import prepare
from data.tasks import check_base_knobs
from test_train_grpo import run


def refused(call, pattern):
    with pytest.raises(UserError, match=pattern) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


def base_validate(**knobs):
    tb.validate(configure(tb.defaults, [f"--{k}={v}" for k, v in knobs.items()]))


def grpo_validate(base, **knobs):
    validate(configure(tg.defaults, [f"--base_ckpt={base}"] +
                       [f"--{k}={v}" for k, v in knobs.items()]))


# --- min_lr above learning_rate: the cosine would climb ------------------------------------------
@pytest.mark.parametrize("lr, min_lr", [(1e-3, 1e-2), (1e-3, 1.001e-3), (3e-5, 3e-4)])
def test_min_lr_above_learning_rate_is_refused_by_both_trainers(tiny_setup, lr, min_lr):
    pattern = rf"'min_lr' = {min_lr!r} is not allowed: must be at most learning_rate"
    refused(lambda: base_validate(learning_rate=lr, min_lr=min_lr), pattern)
    refused(lambda: grpo_validate(tiny_setup, learning_rate=lr, min_lr=min_lr), pattern)


@pytest.mark.parametrize("lr, min_lr", [(1e-3, 1e-3), (1e-3, 0.0), (3e-3, 3e-4)])
def test_min_lr_up_to_learning_rate_is_accepted(tiny_setup, lr, min_lr):
    base_validate(learning_rate=lr, min_lr=min_lr)  # equal: a constant rate after warmup
    grpo_validate(tiny_setup, learning_rate=lr, min_lr=min_lr)
    assert tb.get_lr(10 ** 6, 10, lr, min_lr, 0) == pytest.approx(min_lr)  # it ends at min_lr


# --- Countdown knobs that act on misses, with none shown -----------------------------------------
CD = dict(n_numbers=3, max_number=10, max_target=100, n_train=50, n_val=5, n_test=5, num_merges=0)


@pytest.mark.parametrize("knob, value", [("give_up", 0.5), ("give_up", 1.0), ("variants", 2),
                                         ("variants", 5)])
def test_miss_knobs_without_misses_are_refused(tmp_path, monkeypatch, knob, value):
    monkeypatch.setattr(searched, "ROOT", str(tmp_path))
    refused(lambda: searched.prepare(**CD, max_misses=0, **{knob: value}, verbose=False),
            rf"{knob}={value!r}: must be (0|1) with max_misses=0: .*raise max_misses")
    assert os.listdir(tmp_path) == []  # no directory named for it
    searched.check_knobs(**CD, max_misses=1, **{knob: value})  # one miss shown: accepted


@pytest.mark.parametrize("knob, value", [("countdown_give_up", 0.25), ("countdown_variants", 3)])
def test_train_base_names_its_own_keys(knob, value):
    cfg = {**tb.defaults, "task": "countdown", "countdown_max_misses": 0, knob: value}
    refused(lambda: check_base_knobs(cfg, tb.defaults),
            rf"'{knob}' = {value!r} is not allowed: .*with countdown_max_misses=0: "
            r".*raise countdown_max_misses")


@pytest.mark.parametrize("numbers, target", [([3, 4, 5], 23), ([2, 7, 9], 25), ([1, 6, 8], 40)])
def test_without_misses_no_solution_gives_up_and_variants_repeat(numbers, target):
    """Why they are refused: with max_misses=0 giving up changes no solution, and the solutions a
    problem gets from different seeds (its variants) are mostly one text."""
    plain = [searched_solution(numbers, target, 0, seed=s) for s in range(8)]
    gave_up = [searched_solution(numbers, target, 0, seed=s, give_up=True) for s in range(8)]
    assert gave_up == plain
    assert len({text for text, _ in plain}) < len(plain)


# --- a curriculum's eval_n: bounded by the test split, as without a curriculum ---------------------
@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    d = prepare(steps=1, max_operand=5, ops="+", n_train=60, n_val=10, n_test=12, num_merges=0,
                verbose=False, root=str(tmp_path_factory.mktemp("d")))
    return d


@pytest.mark.parametrize("eval_n, n", [(10 ** 6, 12), (13, 12), (12, 12), (5, 5)])
def test_curriculum_eval_n_is_bounded_by_the_test_split(arith, capsys, eval_n, n):
    cfg = {**tg.defaults, "curriculum": "1:9,2:9", "eval_n": eval_n}
    curriculum, test = from_config(cfg, arith, lambda q: [0] * len(q), 10 ** 4, [])
    assert len(test) == n and len({e["question"] for e in test}) == n
    said = capsys.readouterr().out
    assert (f"eval_n={eval_n} bounded by the test split's size" in said) == (eval_n > n)


# --- a diverging adapter: every knob that can cause it is named -----------------------------------
@pytest.mark.parametrize("extra, blamed", [(f"--lora_alpha={10 ** 20}", f"{10 ** 20} / 8"),
                                           ("--beta=1e30", "beta (1e+30")])
def test_skipped_steps_name_the_knobs_that_can_cause_them(tiny_setup, tmp_path, chars_reward,
                                                          extra, blamed):
    message = refused(lambda: run(tiny_setup, tmp_path / "r", "--max_iters=12",
                                  "--max_skipped_steps=3", extra),
                      r"3 steps in a row skipped .*diverged")
    assert blamed in message and "learning_rate (" in message and "lora_alpha / lora_r" in message


def test_a_run_whose_every_step_that_could_learn_was_skipped_ends_as_an_error_naming_the_knobs(
        tiny_setup, tmp_path, chars_reward):
    """lora_alpha 1e30: every step with a learning signal is non-finite and skipped. Without a stop in a
    row (max_skipped_steps beyond max_iters; before, steps with nothing to learn between them also reset
    it), the run must not end 'done' with an adapter that never moved: exit 2, the knobs named."""
    out = tmp_path / "r"
    message = refused(lambda: run(tiny_setup, out, "--max_iters=4", "--max_skipped_steps=100",
                                  f"--lora_alpha={10 ** 30}"),
                      r"^(\d+) of the \1 steps that could learn skipped \(non-finite .*\) at iter 4: "
                      r"the adapter's updates have diverged")
    assert f"{10 ** 30} / 8" in message and "learning_rate (" in message
    logs = [json.loads(line) for line in open(out / "log.jsonl")][1:]
    assert logs[-1]["skipped_steps"] == sum(line["skipped"] for line in logs) > 0


@pytest.mark.parametrize("alpha, r", [(10 ** 39, 1), (4 * 10 ** 38, 1), (10 ** 40, 8)])
def test_a_lora_scaling_beyond_float32_is_refused_before_any_work(tiny_setup, alpha, r):
    """lora_alpha / lora_r above the largest float32: the scaling itself is Inf, no update can be finite."""
    refused(lambda: grpo_validate(tiny_setup, lora_alpha=alpha, lora_r=r),
            rf"^config key 'lora_alpha' = .* is not allowed: over lora_r = {r} gives the adapter's scaling "
            r".*more than float32 holds \(3.4e\+38\)")
    grpo_validate(tiny_setup, lora_alpha=alpha, lora_r=r * 100)  # a scaling float32 holds: allowed


# --- where a knob was set -------------------------------------------------------------------------
def test_a_knob_from_a_config_file_is_named_with_its_file(tmp_path):
    path = str(tmp_path / "my_config.py")
    with open(path, "w") as f:
        f.write("min_lr = 0.5\nn_layer = 3\n")
    for argv, where in (([path], f" (set in {path})"), ([path, "--min_lr=0.6"], ""),
                        (["--min_lr=0.6", path], f" (set in {path})")):
        cfg = configure(tb.defaults, argv)
        message = refused(lambda: check(cfg, "min_lr", False, "no"),
                          r"config key 'min_lr' = 0\.[56]")
        assert message.startswith(f"config key 'min_lr' = {cfg['min_lr']!r}{where} is not")
    cfg = configure(tb.defaults, [path])
    other = dict(cfg)  # a config configure did not return: no file to name
    assert "set in" not in refused(lambda: check(other, "min_lr", False, "no"), "min_lr")


@pytest.mark.parametrize("from_file", [True, False])
def test_resume_names_where_a_changed_knob_was_set(tmp_path, from_file):
    path = str(tmp_path / "c.py")
    with open(path, "w") as f:
        f.write("n_layer = 2\n")
    saved = {**tb.defaults, "n_layer": 1}
    cfg = configure(tb.defaults, [path] if from_file else ["--n_layer=2"], saved=saved)
    ckpt = {"model_args": {"n_layer": 1}, "config": saved}
    fix = f"remove n_layer from {re.escape(path)}" if from_file else "leave --n_layer out"
    refused(lambda: check_resume(cfg, ckpt, "b/ckpt.pt"), f"cannot change on resume: .*; {fix} ")


# --- a dash too few -------------------------------------------------------------------------------
@pytest.mark.parametrize("arg", ["-max_iters=2", "-out_dir=x", "-quick", "-"])
def test_one_dash_override_is_not_a_config_file(arg):
    refused(lambda: configure(tb.defaults, [arg]),
            rf"bad argument '{re.escape(arg)}': not a config file; did you mean -{re.escape(arg)}\?")


def test_a_config_file_whose_name_starts_with_a_dash_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-odd.py").write_text("max_iters = 7\n")
    assert configure(tb.defaults, ["-odd.py"])["max_iters"] == 7
