# The lecture's records state the rules their math relies on once (RULES; tracin.capture_problem) and
# checks/grpo_knobs.py says each to the user by its config key: every such refusal below is the one
# line train_grpo.py gave before the rules moved into the records (copied from that code's output); the
# lecture asserts the same rule when a record is made; checks/ changes no config value; the script
# fills in the task's reward functions itself.
# Run: python -m pytest -q tests/test_contract.py
import copy

import pytest

import grpo
import tracin
import train_grpo
from checks.grpo_knobs import validate
from configurator import UserError, configure
from model import Sampling
from runs.metrics import PhaseTimer

REFUSED = [
    (['--tracin=True', '--num_iterations=2'],
     "config key 'num_iterations' = 2 is not allowed: must be 1 with tracin=True: the selection is made from the sampling policy's per-sample gradients, one update per generation"),
    (['--tracin=True', '--grad_checkpoint=True'],
     'tracin=True needs grad_checkpoint=False and lora_dropout=0: the hooks must see each activation once, exactly as the gradient used it'),
    (['--tracin=True', '--lora_dropout=0.1'],
     'tracin=True needs grad_checkpoint=False and lora_dropout=0: the hooks must see each activation once, exactly as the gradient used it'),
    (['--epsilon_low=1.0'],
     "config key 'epsilon_low' = 1.0 is not allowed: must be in [0, 1)"),
    (['--epsilon_low=-0.1'],
     "config key 'epsilon_low' = -0.1 is not allowed: must be in [0, 1)"),
    (['--epsilon_high=-0.1'],
     "config key 'epsilon_high' = -0.1 is not allowed: must be >= 0"),
    (['--beta=-1.0'],
     "config key 'beta' = -1.0 is not allowed: must be >= 0"),
    (['--loss_type=x'],
     "config key 'loss_type' = 'x' is not allowed: must be one of 'grpo', 'bnpo', 'dapo', 'dr_grpo'"),
    (['--importance_sampling_level=word'],
     "config key 'importance_sampling_level' = 'word' is not allowed: must be one of 'token', 'sequence'"),
    (['--group_size=1'],
     "config key 'group_size' = 1 is not allowed: must be >= 2: advantages are relative within a group"),
    (['--micro_batch_size=0'],
     "config key 'micro_batch_size' = 0 is not allowed: must be > 0"),
    (['--max_new_tokens=0'],
     "config key 'max_new_tokens' = 0 is not allowed: must be > 0"),
    (['--num_iterations=0'],
     "config key 'num_iterations' = 0 is not allowed: must be >= 1"),
    (['--scale_rewards=all'],
     "config key 'scale_rewards' = 'all' is not allowed: must be one of 'group', 'batch', 'none'"),
    (['--advantage_epsilon=-1.0'],
     "config key 'advantage_epsilon' = -1.0 is not allowed: must be >= 0"),
    (['--grad_clip=0.0'],
     "config key 'grad_clip' = 0.0 is not allowed: must be > 0"),
    (['--tracin_topk_frac=0.0'],
     "config key 'tracin_topk_frac' = 0.0 is not allowed: must be in (0, 1]"),
    (['--tracin_selection=all'],
     "config key 'tracin_selection' = 'all' is not allowed: must be one of 'positive', 'topk'"),
    (['--tracin_influence=full'],
     "config key 'tracin_influence' = 'full' is not allowed: must be one of 'summed', 'matrix'"),
]


def config(base, *args):
    return configure(train_grpo.defaults, [f"--base_ckpt={base}", "--out_dir=out/contract", *args])


@pytest.mark.parametrize("args, said", REFUSED)
def test_each_rule_is_said_by_its_key_in_the_same_line_as_before(tiny_setup, args, said):
    with pytest.raises(UserError) as e:
        validate(config(tiny_setup, *args))
    assert str(e.value) == said


@pytest.mark.parametrize("args", [[], ["--tracin=True", "--tracin_selection=topk"], ["--compile=auto"],
                                  ["--reward_funcs=('correctness',)", "--reward_weights=(1.0,)"]])
def test_checks_change_no_config_value(tiny_setup, args):
    cfg = config(tiny_setup, *args)
    before = copy.deepcopy(dict(cfg))
    validate(cfg)
    assert dict(cfg) == before
    assert cfg["reward_funcs"] == before["reward_funcs"]  # () stays (): the script fills it in


def test_the_script_fills_in_the_tasks_rewards_in_sight(tiny_setup, tmp_path):
    cfg = train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path / 'run'}", "--max_iters=0",
                           "--eval_n=2", "--eval_k=1"])
    assert (cfg["reward_funcs"], cfg["reward_weights"]) == (("correctness", "format"), (1.0, 0.1))


@pytest.mark.parametrize("make", [
    lambda: grpo.LossKnobs(epsilon_low=-0.1),  # ratio 1 would lie outside the clip: it would act at mu = 1
    lambda: grpo.LossKnobs(epsilon_high=-0.1),
    lambda: grpo.LossKnobs(loss_type="sum"),
    lambda: grpo.StepKnobs(group_size=1, micro_batch_size=4, max_new_tokens=8, sampling=Sampling(),
                           loss=grpo.LossKnobs()),
    lambda: grpo.StepKnobs(group_size=4, micro_batch_size=4, max_new_tokens=8, sampling=Sampling(),
                           loss=grpo.LossKnobs(beta=0.0), rewards_during_reference=True),  # no pass 3
    lambda: tracin.TracInKnobs(topk_frac=0.0),
    lambda: tracin.TracInKnobs(ranking="norm"),
])
def test_the_lecture_asserts_the_same_rules_when_a_record_is_made(make):
    with pytest.raises(AssertionError):
        make()


def test_tracin_asserts_what_its_capture_relies_on(world_for_capture):
    model, step, knobs, batches = world_for_capture
    with pytest.raises(AssertionError):  # two updates a generation: not the sampling policy's gradients
        tracin.tracin_backward(model, None, *batches, step, knobs, timer=PhaseTimer(), amp=None)
    assert tracin.capture_problem(1, False, 0.0) is None
    assert tracin.capture_problem(2, False, 0.0)[0] == "num_iterations"
    assert tracin.capture_problem(1, True, 0.0)[0] is None and tracin.capture_problem(1, False, 0.1)


@pytest.fixture
def world_for_capture():
    from cfg_calls import step_of, tracin_of
    from conftest import build_gpt
    from lora import apply_lora
    model = build_gpt()
    apply_lora(model, 2, 4, 0.0, ("c_attn",))
    step = step_of({"num_iterations": 2, "beta": 0.0})
    return model, step, tracin_of({}), (None, None)
