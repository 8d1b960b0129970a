# The lecture's step functions called from a test's config dict: the records built from it as
# train_grpo.records builds them for a run (grpo.StepKnobs, tracin.TracInKnobs), a fresh
# PhaseTimer unless given, float32 (no autocast) unless given. Only the tests use it: a test can
# state its knobs as a run would, and still call one part of the step.
from contextlib import nullcontext
from dataclasses import replace

import grpo
import tracin
import train_grpo
from runs.metrics import PhaseTimer


def step_of(c, loss=None):
    """grpo.StepKnobs of config c (train_grpo.defaults for any key c lacks); loss: another
    LossKnobs in its place."""
    step, _ = train_grpo.records({**train_grpo.defaults, **c})
    return step if loss is None else replace(step, loss=loss)


def loss_of(c, **changes):
    """grpo.LossKnobs of config c, with `changes` (e.g. beta=0.0)."""
    return replace(step_of(c).loss, **changes)


def tracin_of(c):
    """tracin.TracInKnobs of config c (whatever its 'tracin' says)."""
    _, knobs = train_grpo.records({**train_grpo.defaults, **c, "tracin": True,
                                   "background_rewards": False})
    return knobs


def _run(timer, amp):
    return {"timer": timer or PhaseTimer(), "amp": amp}


def policy_backward(model, batch, c, knobs=None, timer=None, amp=nullcontext()):
    return grpo.policy_backward(model, batch, step_of(c, knobs), **_run(timer, amp))


def with_reference(model, batch, c, knobs=None, timer=None, amp=nullcontext()):
    return grpo.with_reference(model, batch, step_of(c, knobs), **_run(timer, amp))


def old_logprobs(model, batch, c, timer=None, amp=nullcontext()):
    return grpo.old_logprobs(model, batch, step_of(c), **_run(timer, amp))


def reference_logprobs(model, batch, c, timer=None, amp=nullcontext()):
    return grpo.reference_logprobs(model, batch, step_of(c), **_run(timer, amp))


def grpo_updates(model, optimizer, rollouts, c, timer=None, amp=nullcontext()):
    return grpo.grpo_updates(model, optimizer, rollouts, step_of(c), **_run(timer, amp))


def update(model, optimizer, c, stats, apply=True, timer=None):
    return grpo.update(model, optimizer, stats, grad_clip=c["grad_clip"],
                       timer=timer or PhaseTimer(), apply=apply)


def make_rollouts(model, enc, batches, c, generator, decode=None, timer=None,
                  amp=nullcontext()):
    return grpo.make_rollouts(model, enc, batches, step_of(c), generator, decode=decode,
                              **_run(timer, amp))


def sample_rollouts(model, enc, batches, c, generator, decode=None, timer=None,
                    amp=nullcontext()):
    return grpo.sample_rollouts(model, enc, batches, step_of(c), generator, decode=decode,
                                **_run(timer, amp))


def score_rollouts(enc, sampled, batches, c, timer=None):
    return grpo.score_rollouts(enc, sampled, batches, step_of(c), timer=timer or PhaseTimer())


def tracin_backward(model, optimizer, rollouts, val_batch, c, timer=None, amp=nullcontext()):
    return tracin.tracin_backward(model, optimizer, rollouts, val_batch, step_of(c), tracin_of(c),
                                  **_run(timer, amp))


def tracin_updates(model, optimizer, rollouts, val_batch, c, timer=None, amp=nullcontext()):
    return tracin.tracin_updates(model, optimizer, rollouts, val_batch, step_of(c), tracin_of(c),
                                 **_run(timer, amp))


def informative_rows(batch, c):
    return tracin.informative_rows(batch, c["loss_type"])


def grpo_step(model, optimizer, enc, prompts, c, generator, amp, val=None, decode=None):
    """train_grpo.grpo_step with the validation batch of a TracIn config as one argument: Prompts
    ('pg', sampled with the batch) or Rollouts ('nll')."""
    step, knobs = train_grpo.records({**train_grpo.defaults, **c})
    sampled = isinstance(val, grpo.Prompts)
    return train_grpo.grpo_step(model, optimizer, enc, prompts, step, knobs, generator=generator,
                                amp=amp, decode=decode, val_prompts=val if sampled else None,
                                val_rollouts=None if sampled else val)
