# What a TracIn step does when its influences carry no evidence, and what the selection's precision
# averages over:
#   - a 'topk' run whose validation gradient is zero at every step (a 'pg' validation batch scored
#     by the task's own rewards, which the random tiny base never earns: every validation advantage
#     is 0) keeps no rollout and moves no weight, as a 'positive' run does; it says so at each step;
#   - the selection's precision is logged only for a step that kept some rollouts and updated on
#     them (not for a skipped one), and analysis.summarize averages no NaN into it.
# Run: python -m pytest -q tests/test_selection_evidence.py
import json

import pytest

from analysis.summarize import mean
from data.defect import defect_record
from runs.checkpoint import load_checkpoint
from test_train_grpo import run


@pytest.mark.parametrize("rule", ["topk", "positive"])
def test_no_validation_signal_keeps_nothing_and_moves_nothing(tiny_setup, tmp_path, chars_reward, capsys,
                                                              rule):
    out = tmp_path / rule
    run(tiny_setup, out, "--max_iters=3", "--tracin=True", "--tracin_val_loss=pg", "--beta=0.0",
        f"--tracin_selection={rule}", "--tracin_topk_frac=0.5", "--tracin_val_batch_size=2")
    logs = [json.loads(line) for line in open(out / "log.jsonl") if '"val/reward"' in line]
    assert len(logs) == 3 and all(log["val/reward"] == 0 for log in logs)  # no validation signal
    assert [log["n_selected"] for log in logs] == [0, 0, 0]
    lora = load_checkpoint(str(out / "ckpt.pt"))["lora"]
    assert all(not v.any() for k, v in lora.items() if "lora_B" in k)  # B is still its zero init
    said = capsys.readouterr().out
    why = "every influence is the same" if rule == "topk" else "no rollout has positive influence"
    assert said.count(f"tracin: {why}") == 3 and "no update this step" in said


def test_precision_only_over_steps_that_updated():
    cfg = {"group_size": 2, "tracin": True}
    picks, defective = [0, 1], {1}  # rows 0-1 clean, 2-3 from the defective prompt
    rollouts = {"selected": [True, False, True, False]}
    updated = {"n_selected": 2, "skipped": False}
    defect_record(updated, dict(rollouts), picks, defective, cfg)
    assert updated["defect/selection_precision"] == 0.5 and updated["defect/clean_base_rate"] == 0.5
    skipped = {"n_selected": 2, "skipped": True}  # a non-finite influence: no weight moved
    defect_record(skipped, dict(rollouts), picks, defective, cfg)
    nothing = {"n_selected": 0, "skipped": False}
    defect_record(nothing, {"selected": [False] * 4}, picks, defective, cfg)
    assert "defect/selection_precision" not in skipped and "defect/selection_precision" not in nothing
    assert mean([0.5, None, float("nan"), 1.0]) == 0.75  # a NaN in a hand-made log is left out too


def test_a_ranking_other_than_dot_or_cosine_is_refused_in_one_line(tiny_setup):
    import train_grpo
    from checks.grpo_knobs import validate
    from configurator import UserError, configure
    cfg = configure(train_grpo.defaults, [f"--base_ckpt={tiny_setup}", "--tracin_ranking=norm"])
    with pytest.raises(UserError) as e:
        validate(cfg)
    assert str(e.value) == "config key 'tracin_ranking' = 'norm' is not allowed: must be one of 'dot', 'cosine'"
