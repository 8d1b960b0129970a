# A non-finite influence skips the step, even one among finite ones (tracin.tracin_backward marks
# the step, grpo.update skips it: the weights stay as they were); post-hoc attribution
# (attribute.find_critical_samples) refuses non-finite inner products in one line, never reporting them
# as scores. References: the weights compared bit for bit; for post-hoc, a training rollout whose
# advantage is NaN (its gradient, and only its inner product, is NaN: the others stay finite).
# Run: python -m pytest -q tests/test_nonfinite_influence.py
import math

import pytest
import torch

import ghost
from analysis import attribute
import tracin
from configurator import UserError
from cfg_calls import tracin_backward, tracin_updates, update
from lora import lora_parameters
from runs.checkpoint import load_checkpoint, save_checkpoint
from test_influence_summed import as_batch, cfg, world  # noqa: F401 (world: the fixture)
from test_tracin import VAL_ADV, TRAIN_ADV, ByteEnc, make_model, posthoc_setup

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


@pytest.mark.parametrize("how", ["summed", "matrix"])
def test_one_nan_influence_among_finite_ones_skips_the_step(world, monkeypatch, how):  # noqa: F811
    m, train, val = world
    real = {"summed": ghost.summed_inner_products,
            "matrix": ghost.compute_ghost_inner_product_matrix}[how]

    def one_nan(*a, **k):  # the influence of rollout 2 overflowed; every other one is finite
        out = real(*a, **k).clone()
        out[2] = float("nan")
        return out

    name = "summed_inner_products" if how == "summed" else "compute_ghost_inner_product_matrix"
    monkeypatch.setattr(tracin, name, one_nan)
    opt = torch.optim.AdamW(lora_parameters(m), lr=0.1)
    before = [p.detach().clone() for p in lora_parameters(m)]
    c = cfg(4, tracin_influence=how, tracin_selection="positive", tracin_topk_frac=0.5)
    stats, infl, keep, reason = tracin_backward(m, opt, as_batch(train, TRAIN_ADV),
                                                       as_batch(val, VAL_ADV), c)
    assert torch.isnan(infl).sum() == 1 and torch.isfinite(infl).sum() == len(infl) - 1
    assert keep.any()  # some rollouts are kept: without the reason the update would go ahead
    assert reason == "non-finite influence"
    assert all(math.isfinite(v) for v in stats["losses"])  # GRPO's losses are left as they were
    _, nonfinite = update(m, opt, c, stats, apply=reason is None)  # as tracin.tracin_updates calls it
    assert nonfinite is None  # the reason is TracIn's own
    assert all(torch.equal(p, b) for p, b in zip(lora_parameters(m), before))
    batches = as_batch(train, TRAIN_ADV), as_batch(val, VAL_ADV)
    _, grad_norm, reason, _, keep = tracin_updates(m, opt, *batches, c)  # the step's steps 4-7 whole
    assert reason == "non-finite influence" and grad_norm == 0.0 and keep.any()
    assert all(torch.equal(p, b) for p, b in zip(lora_parameters(m), before))


def test_update_skips_when_any_loss_is_not_finite(world):  # noqa: F811
    m, _, _ = world
    opt = torch.optim.AdamW(lora_parameters(m), lr=0.1)
    before = [p.detach().clone() for p in lora_parameters(m)]
    for bad in ([0.5, float("nan"), 0.2], [float("inf"), 0.1], [float("nan")]):
        for p in lora_parameters(m):
            p.grad = torch.ones_like(p)  # a finite gradient: only the losses say the step is bad
        _, reason = update(m, opt, cfg(4), {"losses": bad})
        assert reason is not None
        assert all(torch.equal(p, b) for p, b in zip(lora_parameters(m), before))
    for p in lora_parameters(m):
        p.grad = torch.ones_like(p)
    _, reason = update(m, opt, cfg(4), {"losses": [0.5, 0.2]})  # all finite: step taken
    assert reason is None and any(not torch.equal(p, b) for p, b in zip(lora_parameters(m), before))


def test_posthoc_refuses_one_non_finite_inner_product(tmp_path):
    m = make_model()
    paths, _, train, test = posthoc_setup(tmp_path, m)
    ok = attribute.find_critical_samples(m, paths, train, test, ByteEnc(), mode="memory_efficient")
    assert all(math.isfinite(s["tracin_score"]) for s in ok["scores"])
    bad = load_checkpoint(paths[1])
    next(iter(bad["lora"].values()))[0, 0] = float("nan")  # one weight of one adapter
    save_checkpoint(bad, paths[1])
    with pytest.raises(UserError, match="NaN/Inf") as e:
        attribute.find_critical_samples(m, paths, train, test, ByteEnc(), mode="memory_efficient")
    assert "\n" not in str(e.value) and f"checkpoint {paths[1]}" in str(e.value)
    train[1]["advantage"] = float("nan")  # a NaN advantage: refused by name before any work
    with pytest.raises(UserError, match=r"train_samples\[1\] is not a rollout"):
        attribute.find_critical_samples(m, paths[:1], train, test, ByteEnc())


def test_a_nan_advantage_makes_only_its_own_inner_product_nan(tmp_path):
    """The premise of the test above: one NaN among finite products, not all of them NaN."""
    m = make_model()
    _, _, train, test = posthoc_setup(tmp_path, m)
    train[1]["advantage"] = float("nan")
    chunks = [tracin.rollout_batch(ByteEnc(), rows, "cpu") for rows in (train, test)]
    inner, _, _ = tracin.hook_products(m, chunks[:1], chunks[1:], 1.0, None)
    assert torch.isnan(inner[1]) and torch.isfinite(inner[[0, 2, 3]]).all()
