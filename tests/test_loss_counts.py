# The counts and terms a loss is normalised by, against the formula written out: bnpo's number of
# micro-batches (a partial last one counts), the same count under two processes, a curriculum level
# that moves when its moving accuracy reaches the threshold exactly, and TracIn's validation loss
# without the KL term (the train loss keeps it).
# Run: python -m pytest -q tests/test_loss_counts.py
import itertools
from dataclasses import replace

import pytest
import torch

import ghost
import tracin
import train_grpo
from data.curriculum import Curriculum
from cfg_calls import loss_of, policy_backward, tracin_backward, with_reference
from grpo import Rollouts
from lora import lora_parameters
from test_tracin import TRAIN_ADV, TRAIN_PROMPTS, VAL_ADV, VAL_PROMPTS, make_batch, make_model

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


@pytest.fixture(scope="module")
def world():
    m = make_model()  # LoRA B != 0: the policy differs from the reference, so the KL term has a gradient
    train = make_batch(m, TRAIN_PROMPTS, 2, seed=3, end_early=[(0, 2), (3, 4)])  # 6 rows
    val = make_batch(m, VAL_PROMPTS, 1, seed=4, end_early=[(1, 1), (2, 5)])      # 4 rows
    return m, train, val


def cfg(mb, **kw):
    return {**train_grpo.defaults, "micro_batch_size": mb, "beta": 0.0, "loss_type": "grpo", **kw}


def backward(m, batch, c, beta, **kw):
    """grpo.policy_backward under the run's loss knobs at this beta, after pass 3 (beta != 0)."""
    knobs = loss_of(c, beta=beta)
    return policy_backward(m, with_reference(m, batch, c, knobs), c, knobs, **kw)


def as_batch(data, adv, rows=slice(None)):
    idx, pl, mask = data
    return Rollouts(idx=idx[rows], pad_left=pl[rows], mask=mask[rows], advantages=adv[rows])


def grads(m):
    out = [p.grad.clone() for p in lora_parameters(m)]
    m.zero_grad(set_to_none=True)
    return out


# ----------------------------------------------------------------------------------------- bnpo
@pytest.mark.parametrize("which", ["train", "val"])
def test_bnpo_is_the_mean_over_every_micro_batch_the_partial_last_one_included(world, which):
    """bnpo (TRL): L = (1 / M) sum_m [sum over micro-batch m's tokens of L_t / its token count], M = ceil(N / mb)
    micro-batches. Reference: each micro-batch's backward alone (one micro-batch, so M = 1 there), summed, / M."""
    m, train, val = world
    data, adv = (train, TRAIN_ADV) if which == "train" else (val, VAL_ADV)
    N = data[0].size(0)
    for mb, beta in itertools.product(range(1, N + 1), (0.0, 0.1)):
        c = cfg(mb, loss_type="bnpo")
        backward(m, as_batch(data, adv), c, beta)
        got = grads(m)
        parts = []
        for s in range(0, N, mb):
            rows = slice(s, min(s + mb, N))
            backward(m, as_batch(data, adv, rows), cfg(rows.stop - rows.start, loss_type="bnpo"), beta)
            parts.append(grads(m))
        M = -(-N // mb)
        assert len(parts) == M
        for g, *ps in zip(got, *parts):
            torch.testing.assert_close(g, sum(ps) / M, rtol=1e-5, atol=1e-7 * sum(ps).abs().max().item())


def test_bnpo_in_two_processes_makes_the_single_process_update(tiny_setup, tmp_path, chars_reward):
    """Each rank holds half the batch; bnpo must still divide by the micro-batches of the WHOLE batch
    (2 ranks x 1 micro-batch each = 2, as one process with micro-batches of 4 out of 8 rows)."""
    from test_distributed import assert_same_run, run_ranks
    from test_train_grpo import run
    one, two = tmp_path / "one", tmp_path / "two"
    run(tiny_setup, one, "--max_iters=2", "--loss_type=bnpo")
    run_ranks(2, tiny_setup, two, "--max_iters=2", "--loss_type=bnpo")
    assert_same_run(one, two, [1, 2])


# ----------------------------------------------------------------------------------- curriculum
@pytest.mark.parametrize("window", [1, 2, 4, 8])
def test_curriculum_moves_up_when_the_moving_accuracy_equals_the_threshold(window):
    """'reaches the threshold': a mean exactly equal to it moves up (values exact in binary, so the mean
    is exact too); one step's worth below it does not."""
    for threshold in (0.25, 0.5, 0.75, 1.0):
        c = Curriculum([(1, 5), (2, 5), (3, 5)], "+", threshold=threshold, window=window)
        for _ in range(window - 1):
            assert not c.observe(threshold)
        assert c.observe(threshold) and c.level == 1, (threshold, window)
        # below it by the smallest step one accuracy can make here: it stays
        c = Curriculum([(1, 5), (2, 5)], "+", threshold=threshold, window=window)
        moved = [c.observe(threshold) for _ in range(window - 1)] + [c.observe(threshold - 1 / 64)]
        assert not any(moved) and c.level == 0, (threshold, window)


# ------------------------------------------------------------------------- TracIn's validation loss
@pytest.mark.parametrize("how", ["summed", "matrix"])
def test_tracin_validation_loss_has_no_kl_term(world, how):
    """influence_i = <g_i, G>: g_i of the train loss WITH beta * KL, G of the validation loss WITHOUT it
    (the validation loss asks what helps the answers, not what stays near the reference). Reference: G from
    a plain backward at beta 0, the g_i from the hooks at beta; and G at beta would give other influences."""
    m, train, val = world
    beta = 0.5
    opt = torch.optim.AdamW(lora_parameters(m), lr=0.1)
    c = cfg(4, beta=beta, tracin_influence=how, tracin_selection="positive")
    _, infl, _, _ = tracin_backward(m, opt, as_batch(train, TRAIN_ADV), as_batch(val, VAL_ADV), c)
    m.zero_grad(set_to_none=True)
    with ghost.install_ghost_hooks(m) as hooks:
        backward(m, as_batch(train, TRAIN_ADV), cfg(4), beta)
        train_grads = ghost.per_sample_grads(hooks.collect("train"))
    m.zero_grad(set_to_none=True)
    ref = {}
    for b in (0.0, beta):
        backward(m, as_batch(val, VAL_ADV), cfg(3), b)
        ref[b] = ghost.summed_inner_products(train_grads, ghost.summed_gradient(m))
    scale = ref[0.0].abs().max()
    assert (ref[beta] - ref[0.0]).abs().max() > 1e-2 * scale  # the KL term would change the influences
    assert (infl - ref[0.0]).abs().max() <= 1e-5 * scale
