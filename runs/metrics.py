"""
What a GRPO step writes down: the seconds of its phases (PhaseTimer, the `timer` each pass is handed),
one log.jsonl line (TRL's metric names), one rollouts.jsonl line (what post-hoc TracIn, tracin.py,
attributes to) and one console line.
"""
import math
import sys
import time
from contextlib import contextmanager

import torch

from rewards import HACKABLE
from data.tasks import TASKS
from data.datadir import answer_form
from runs.rundir import MAX_ITER, numbered_jsonl


class PhaseTimer:
    """Seconds per phase of one step: `with timer("policy"):` adds the
    block's wall time to timer.seconds["policy"], once the GPU has finished
    the work it queued (CUDA runs ahead of Python: without the wait a phase
    would be charged for its launch only)."""

    def __init__(self, *names):
        self.seconds = dict.fromkeys(names, 0.0)

    @contextmanager
    def __call__(self, name):
        t0 = time.time()
        yield
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - t0



def step_log(rollouts, result, cfg, cache=None):
    """One log.jsonl line, with TRL's metric names, from what train_grpo.grpo_step returned (rollouts
    None: sampling failed, the step was skipped; result: a grpo.StepResult)."""
    times = {f"time/{k}": v for k, v in result.times.items()}
    if rollouts is None:
        return {"skipped": True, "skip_reason": result.skip_reason, **times}
    stats, grad_norm, extra = result.stats, result.grad_norm, result.extra
    if rollouts.influence is not None:  # a TracIn step: what it kept, and the influences it chose by
        infl, keep = rollouts.influence, rollouts.selected
        extra = {"selection_rate": keep.float().mean().item(), "n_selected": int(keep.sum()),
                 "influence/mean": infl.mean().item(), "influence/std": infl.std().item(),
                 "influence/min": infl.min().item(), "influence/max": infl.max().item(), **extra}
    if result.skip_reason:
        extra = {**extra, "skip_reason": result.skip_reason}
    n, rewards, per_fn, mask = len(rollouts), rollouts.rewards, rollouts.per_fn, rollouts.mask
    ntok = max(stats["num_tokens"], 1)  # completion tokens the loss counted (every rank's, every update)
    nanmean = lambda v: torch.tensor(v, dtype=torch.float64).nanmean().item()  # None scores are NaN
    scored = rewards[~rewards.isnan()]
    # the loss of one update (the micro-batches' losses add up to it), a mean over mu updates
    loss = sum(stats["losses"]) / stats.get("updates", 1)
    return {"loss": loss, "reward": scored.mean().item(), "reward_std": scored.std().item(),
            **{f"rewards/{k}": nanmean(v) for k, v in per_fn.items()}, "rewards/unscored": n - scored.numel(),
            **{f"rewards/{k}": v for k, v in (rollouts.parse_counts or {}).items()},  # countdown: parsed?
            **({"rewards/cache_hit_rate": cache.hits / cache.lookups} if cache is not None and cache.lookups else {}),
            "accuracy": nanmean(per_fn[correct]) if (correct := TASKS[cfg.get("task", "arith")]["correct"]) in per_fn
            else float("nan"),
            **hack_rates(per_fn),
            "frac_reward_zero_std": rollouts.n_zero_std / (n // cfg["group_size"]),
            "kl": stats["kl_sum"] / ntok, "entropy": stats["ent_sum"] / ntok,
            "completions/mean_length": mask.sum(1).float().mean().item(),
            "completions/clipped_ratio": rollouts.truncated.float().mean().item(),
            "clip_ratio": stats["clipped_tokens"] / ntok, "clip_ratio/low": stats["clipped_low"] / ntok,
            "clip_ratio/high": stats["clipped_high"] / ntok, "grad_norm": grad_norm,
            "skipped": result.skip_reason is not None, "reward_errors": sum(rollouts.errors.values()), **extra,
            **times}


def hack_rates(per_fn):
    """{'hack_rate': share of the rollouts a hackable reward paid (1) and its exact one refused}, when
    a run scores both (rewards.HACKABLE: the exact one at weight 0 beside the hackable one)."""
    return {"hack_rate": sum(h == 1.0 and e != 1.0 for h, e in zip(per_fn[hack], per_fn[exact]))
            / len(per_fn[hack]) for hack, exact in HACKABLE.items() if hack in per_fn and exact in per_fn}


def rollout_record(questions, answers, rollouts, cfg):
    """One rollouts.jsonl line: what post-hoc TracIn (tracin.py) attributes to."""
    T = rollouts.mask.size(1)
    return {"prompts": questions, "answers": answers, "completion_tokens": rollouts.idx[:, -T:].tolist(),
            "completion_mask": rollouts.mask.tolist(), "rewards": rollouts.rewards.tolist(),
            "advantages": rollouts.advantages.tolist(),
            **({"influence": rollouts.influence.tolist(), "selected": rollouts.selected.tolist()}
               if cfg["tracin"] else {})}


RECORD_KEYS = ("iter", "prompts", "answers", "completion_tokens", "completion_mask", "rewards", "advantages")


def read_records(path, vocab_size, needs=(), form=None, numbered=False, unused=()):
    """The records of a rollouts.jsonl that can be read back (record_problem); any other is skipped
    with a warning naming its line. needs: keys a reader needs beyond RECORD_KEYS (a TracIn run's);
    form: the answers' form it reads (data.datadir.answer_form: 'countdown'), or None. A record of an
    iteration read already (a file copied onto itself) is read once, with one warning.
    numbered: (line number, record) pairs, for a reader that names a record it refuses.
    unused: optional keys the reader never reads, left unchecked (a bad value drops no record)."""
    records, seen, repeats = [], {}, []
    for n, r in numbered_jsonl(path):
        problem = record_problem({k: v for k, v in r.items() if k not in unused}, vocab_size, needs, form)
        if problem:
            print(f"warning: {path} line {n}: the record {problem}; skipped", file=sys.stderr)
        elif r["iter"] in seen:
            repeats.append((n, r["iter"]))
        else:
            seen[r["iter"]] = n
            records.append((n, r) if numbered else r)
    if repeats:
        n, it = repeats[0]
        print(f"warning: {path}: {len(repeats)} records repeat an earlier record's iteration "
              f"(first: line {n}, iter {it}, as line {seen[it]}): a file copied onto itself? "
              f"each iteration read once", file=sys.stderr)
    return records


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _flag(x):  # a TracIn run's selected / a planted defect: true or false (1 or 0)
    return type(x) is bool or (_number(x) and x in (0, 1))


def record_problem(r, vocab_size, needs=(), form=None):
    """Why a rollouts.jsonl record cannot be read back (None: it can), as rollout_record writes it:
    P prompts and answers, N = G P rollouts, each with token ids below vocab_size and a 0/1 mask;
    with a TracIn run's influence (numbers) and selected (true / false); answers of the form given."""
    missing = [k for k in (*RECORD_KEYS, *needs) if k not in r]
    if missing or not r["prompts"]:
        return f"lacks {missing or 'prompts'}"
    if type(r["iter"]) is not int or not 0 <= r["iter"] <= MAX_ITER:
        return "has an iter that is not a whole number from 0 to 2**53"
    if not all(isinstance(r[k], list) for k in RECORD_KEYS[1:]):
        return "has a field that is not a list"
    P, N = len(r["prompts"]), len(r["rewards"])
    extra = (("defective", P, _flag), ("selected", N, _flag), ("influence", N, _number))
    present = [(k, n, ok) for k, n, ok in extra if k in r]
    if not all(isinstance(r[k], list) for k, _, _ in present):
        return "has a field that is not a list"
    lengths = [len(r[k]) for k in ("completion_tokens", "completion_mask", "advantages")]
    optional = [len(r[k]) == n for k, n, _ in present]
    if len(r["answers"]) != P or N % P or any(n != N for n in lengths) or not all(optional):
        return "has lists of mismatched lengths"
    for k, _, ok in present:
        if not all(map(ok, r[k])):
            what = "a number" if ok is _number else "true or false"
            return f"has a value of {k} that is not {what}"
    if form and not all(answer_form(a) == form for a in r["answers"]):
        return f"has an answer that is not of the task's form ({FORMS.get(form, form)})"
    if not (all(isinstance(p, str) for p in r["prompts"]) and all(map(_number, r["rewards"]))
            and all(_number(a) and math.isfinite(a) for a in r["advantages"])):  # rewards: NaN unscored
        return "has a prompt that is not text, a reward that is not a number or an advantage that is not finite"
    token = lambda t: isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
    for toks, m in zip(r["completion_tokens"], r["completion_mask"]):
        if not (isinstance(toks, list) and isinstance(m, list) and len(toks) == len(m)
                and all(map(token, toks)) and all(x in (0, 1) for x in m)):
            return f"has a completion that is not token ids below {vocab_size} with a 0/1 mask of its length"
    return None


FORMS = {"countdown": "[numbers, target], whole numbers", "number": "a whole number"}


def print_step(log, cfg, lr):
    """One |-separated line per log_interval steps."""
    if log.get("reward") is None:  # sampling gave NaN/Inf: no rollouts, no statistics
        print(f"iter {log['iter']:4d} | skipped ({log['skip_reason']}) | lr {lr:.1e}")
        return
    acc = log["accuracy"]  # NaN when the task's correctness reward is not among reward_funcs (or never scored)
    print(f"iter {log['iter']:4d} | reward {log['reward']:.3f} | acc {'-' if acc != acc else f'{acc:.3f}'} | "
          f"zero_std {log['frac_reward_zero_std']:.2f} | kl {log['kl']:.4f} | ent {log['entropy']:.3f} | "
          f"len {log['completions/mean_length']:.1f} | lr {lr:.1e} | {log['step_seconds'] * 1000:.0f} ms "
          f"(gen {log['time/generation'] * 1000:.0f}, policy {log['time/policy'] * 1000:.0f}, "
          f"ref {log['time/reference'] * 1000:.0f}) | mem {log['mem_max_alloc_mb']:.0f} MB"
          + (f" | selected {log['n_selected']}/{cfg['batch_size'] * cfg['group_size']} "
             f"(infl {log['influence/mean']:+.2e})" if cfg["tracin"] else "")
          + (f" | level {log['curriculum/level']}" if "curriculum/level" in log else ""))


class NoSignal:
    """Steps in which every group scored alike: every advantage is 0, so the step learns nothing. After
    `patience` of them in a row, one warning naming the likely causes; summary() for the run's last line."""

    def __init__(self, patience=5):
        self.patience, self.in_a_row, self.steps, self.total, self.warned = patience, 0, 0, 0, False

    def after_step(self, log, verbose=True):
        self.total += 1
        if log.get("frac_reward_zero_std") != 1.0:
            self.in_a_row = 0
            return
        self.steps, self.in_a_row = self.steps + 1, self.in_a_row + 1
        if self.in_a_row == self.patience and not self.warned and verbose:
            self.warned = True
            print(f"warning: {self.patience} steps in a row without a learning signal (every group's completions "
                  f"scored alike, every advantage 0): the base may be too weak for the task, a reward may never fire "
                  f"(see rewards/<fn> in log.jsonl), or the model may not follow the prompt's format (see the "
                  f"completions in rollouts.jsonl)")

    def summary(self):
        return f"; {self.steps} of {self.total} steps had no learning signal" if self.steps else ""


class Skips:
    """Steps skipped for NaN/Inf (the update left the weights untouched), counted against the steps
    that could learn: a skipped step adds to the run of skips, a step that was not skipped and had a
    learning signal (some group of unequal rewards; a TracIn step that kept none of its rollouts
    counts too) ends it, and a step without one (every advantage 0: nothing to learn) does neither, so
    steps with nothing to learn between skipped ones cannot make a diverged adapter look like a
    learning run. after_step says
    when `limit` skips in a row must stop the run; diverged(), at its end, whether (nearly) every step
    that could learn was skipped; summary() for the run's last line and log.jsonl."""

    def __init__(self, limit):
        self.limit, self.in_a_row, self.trained, self.total, self.reasons = limit, 0, 0, 0, {}

    def after_step(self, log):
        """Count the step's log line; when the run must stop, say why ('5 steps in a row skipped
        (non-finite logits)'), else None. A line after the first skip gets skipped_steps, the run's
        count so far."""
        self.total += 1
        if log["skipped"]:
            self.in_a_row += 1
            self.reasons[log["skip_reason"]] = self.reasons.get(log["skip_reason"], 0) + 1
        elif log.get("frac_reward_zero_std") != 1.0:
            self.in_a_row, self.trained = 0, self.trained + 1
        if self.reasons:
            log["skipped_steps"] = sum(self.reasons.values())
        if self.in_a_row >= self.limit:
            return f"{self.in_a_row} steps in a row skipped ({log['skip_reason']})"
        return None

    def diverged(self):
        """None, unless more than 9 in 10 of the steps that could learn were skipped (the adapter
        hardly moved): then e.g. '8 of the 8 steps that could learn skipped (non-finite logits: 8)'."""
        skipped = sum(self.reasons.values())
        if skipped <= 0.9 * (skipped + self.trained):
            return None
        return f"{skipped} of the {skipped + self.trained} steps that could learn skipped ({self.why()})"

    def why(self):
        return ", ".join(f"{why}: {n}" for why, n in self.reasons.items())

    def summary(self):
        """E.g. '; 3 of 8 steps skipped (non-finite loss or gradient: 2, non-finite logits: 1)', or ''
        when none was."""
        return f"; {sum(self.reasons.values())} of {self.total} steps skipped ({self.why()})" if self.reasons else ""
