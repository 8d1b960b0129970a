# What a step records and what post-hoc attribution reads back: rollouts that never moved a weight
# (a mask of zeros under mask_truncated_completions, TracIn's rejected ones, a skipped step's) are not
# scored; the planted defect counts only the problems whose planted answer is wrong; the KV cache
# checked before iteration 0 is the one TracIn 'pg' sampling allocates; the logged loss of several
# updates per generation is one update's, as the other figures are.
# Run: python -m pytest -q tests/test_step_records.py
import json
import shutil

import pytest
import torch

import cfg_calls
import grpo
import train_grpo as tg
from analysis import attribute
from checks import grpo_knobs
from runs.metrics import step_log
from test_tracin_cli import tiny_run
from test_train_grpo import run as grpo_run

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


@pytest.fixture(scope="module")
def standard_run(tiny_setup, tmp_path_factory):
    return tiny_run(tiny_setup, tmp_path_factory, "--temperature=0.7")


def rewrite_records(run, change):
    """rollouts.jsonl with change(record) applied to each record."""
    path = run / "rollouts.jsonl"
    records = [json.loads(line) for line in open(path)]
    for r in records:
        change(r)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


@pytest.fixture
def spy(monkeypatch):
    """The rollouts each find_critical_samples call of the command line scores."""
    calls, real = [], attribute.find_critical_samples

    def record(model, checkpoints, train, *a, **k):
        calls.append({"train": train})
        return real(model, checkpoints, train, *a, **k)
    monkeypatch.setattr(attribute, "find_critical_samples", record)
    return calls


def test_a_truncated_row_with_no_counted_token_is_left_out_not_refused(standard_run, tmp_path, spy):
    """mask_truncated_completions=True records a truncated row with a mask of zeros and its advantage:
    it trained on no token, so its influence is 0. The attribution leaves it out and runs (it refused
    the whole run: an empty completion is not a rollout)."""
    run = shutil.copytree(standard_run, tmp_path / "run")

    def truncate_first_signal(r):
        j = next(j for j, a in enumerate(r["advantages"]) if a != 0)
        r["completion_mask"][j] = [0] * len(r["completion_mask"][j])
    records = rewrite_records(run, truncate_first_signal)
    attribute.main([f"--out_dir={run}", "--question=Mia has 2 pears. How many?", "--n_probe=0"])
    (call,) = spy
    signal = sum(a != 0 and sum(m) > 0 for r in records
                 for a, m in zip(r["advantages"], r["completion_mask"]))
    assert len(call["train"]) == signal > 0
    assert all(sum(s["completion_mask"]) > 0 for s in call["train"])


def test_a_question_is_attributed_to_the_rollouts_that_moved_a_weight(standard_run, tmp_path, spy):
    """--question ranks what the audit ranks: a TracIn run's selected rollouts only, never a skipped
    step's (NaN/Inf: its weights were left as they were)."""
    run = shutil.copytree(standard_run, tmp_path / "run")

    def mark(r):
        if r["iter"] == 1:
            r["skipped"] = True  # as train_grpo.train writes a skipped step's record
        r["selected"] = [j % 2 == 0 for j in range(len(r["advantages"]))]  # TracIn kept the even rows
    records = rewrite_records(run, mark)
    attribute.main([f"--out_dir={run}", "--question=Mia has 2 pears. How many?", "--n_probe=0"])
    (call,) = spy
    want = [(r["iter"], j) for r in records if r["iter"] != 1
            for j, (a, m) in enumerate(zip(r["advantages"], r["completion_mask"]))
            if a != 0 and sum(m) > 0 and j % 2 == 0]
    assert want and len(call["train"]) == len(want)
    assert {s["iter"] for s in call["train"]} == {i for i, _ in want}


def test_a_skipped_steps_record_says_so_and_no_other_does(tiny_setup, tmp_path, monkeypatch, chars_reward):
    real = grpo.update

    def second_skipped(model, optimizer, stats, **k):
        if len(calls) == 1:
            stats["losses"].append(float("nan"))
        calls.append(1)
        return real(model, optimizer, stats, **k)
    calls = []
    monkeypatch.setattr(grpo, "update", second_skipped)
    grpo_run(tiny_setup, tmp_path / "r", "--max_iters=3")
    records = [json.loads(line) for line in open(tmp_path / "r" / "rollouts.jsonl")]
    assert [r.get("skipped") for r in records] == [None, True, None]


def test_a_planted_answer_equal_to_the_right_one_is_no_defect(tiny_setup, tiny_setup_two_steps, tmp_path,
                                                          chars_reward):
    """One-step problems: the first equation's result is the answer, so the 'wrong' answer planted is
    right and no prompt is defective (every rollout clean); two-step problems: some are."""
    cases = ((tiny_setup, lambda rate: rate == 1.0), (tiny_setup_two_steps, lambda rate: rate < 1.0))
    for n, (base, clean) in enumerate(cases):
        out = tmp_path / f"run{n}"
        grpo_run(base, out, "--max_iters=4", "--defect_frac=0.9", "--batch_size=4")
        rates = [json.loads(line).get("defect/clean_base_rate") for line in open(out / "log.jsonl")][1:]
        assert all(r is not None for r in rates) and clean(min(rates)), rates


@pytest.mark.parametrize("pg, world, want", [(True, 1, (8 + 4) * 8), (False, 1, 8 * 8),
                                             (True, 2, 6 * 8), (True, 5, 3 * 8)])
def test_the_sampling_cache_checked_is_the_one_sampling_allocates(monkeypatch, pg, world, want):
    """TracIn 'pg' samples the training and validation prompts in ONE generate call: the cache has
    (batch + val) x group_size rows, rank 0 the largest share of them (distributed.split)."""
    seen = []
    monkeypatch.setattr(grpo_knobs, "check_kv_cache", lambda m, rows, *a, **k: seen.append(rows))
    monkeypatch.setattr(grpo_knobs.distributed, "launched_world_size", lambda: world)
    cfg = {**tg.defaults, "tracin": pg, "tracin_val_loss": "pg", "batch_size": 8,
           "tracin_val_batch_size": 4, "group_size": 8, "eval_n": 2, "eval_k": 1}
    grpo_knobs.check_sampling_cache(cfg, None, 10, 64)
    assert seen == [want]  # 12 prompts: 6 each on 2 ranks, 3 on rank 0 of 5 (3, 3, 2, 2, 2)


def test_the_logged_loss_of_several_updates_is_one_updates(tiny_gpt):
    """num_iterations = 3 at learning rate 0: every update sees the same weights, so each update's
    loss is the same; the log reports that loss (a mean over the updates), not their sum."""
    from lora import apply_lora, lora_parameters
    apply_lora(tiny_gpt, r=2, alpha=4)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lora_parameters(tiny_gpt):
            p.normal_(0, 0.1, generator=gen)
    idx = torch.randint(1, 50, (4, 9), generator=gen)
    batch = grpo.Rollouts(idx, torch.zeros(4, dtype=torch.long), torch.ones(4, 4, dtype=torch.long),
                          torch.tensor([1.0, -0.5, 0.5, 0.5]), rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]),
                          per_fn={}, errors={}, truncated=torch.zeros(4, dtype=torch.bool))
    cfg = {**tg.defaults, "micro_batch_size": 2, "beta": 0.0, "device": "cpu", "group_size": 2}
    opt = torch.optim.AdamW(lora_parameters(tiny_gpt), lr=0.0)
    one = cfg_calls.policy_backward(tiny_gpt, batch, cfg)  # one update's losses
    opt.zero_grad(set_to_none=True)
    stats, norm, reason = cfg_calls.grpo_updates(tiny_gpt, opt, batch, {**cfg, "num_iterations": 3})
    assert reason is None and stats["updates"] == 3 and len(stats["losses"]) == 3 * len(one["losses"])
    log = step_log(batch, grpo.StepResult(stats, norm), cfg)
    assert log["loss"] == pytest.approx(sum(one["losses"]), rel=1e-6)
    assert abs(sum(one["losses"])) > 1e-6
