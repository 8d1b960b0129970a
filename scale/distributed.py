"""
More than one process (one per GPU, or several on a CPU) through PyTorch's own torch.distributed,
launched by torchrun as in nanoGPT:

    torchrun --standalone --nproc_per_node=2 train_grpo.py config/tiny_grpo.py

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK in each process's environment. Without them
(`python train_grpo.py ...`) setup() initialises nothing and every helper here is a no-op, so a
single process runs exactly the code it ran before.

How a GRPO step is split over the ranks: the lecture's step (train_grpo.grpo_step and grpo.py) knows
nothing of ranks; under torchrun, wrap_step() rebinds the few names the step calls, once at setup:
  - sampling (grpo.generate -> sample_share): every rank draws the same prompts (same seeded stream)
    and the same uniforms for the whole batch (sample.generate's u, one per row and step), then
    samples ITS contiguous share of the prompts with its columns of u; so a completion's tokens depend
    only on (seed, step, global row), and 1 and N processes draw the same tokens. The generator and
    Python RNG states stay identical on every rank, so a checkpoint is the same whichever rank writes
    it. The shares are gathered on every rank in the single-process layout, and every rank scores the
    whole batch (rewards are cheap; rank 0 logs them all).
  - the gradient (grpo_updates, tracin_backward -> on_rank_share): rank r keeps its contiguous
    batch_size / world_size prompts (whole groups, so the advantages are those of one process) for
    passes 3 and 2 and the backward; the loss divides by the whole batch's counts (rank_share), and the
    LoRA gradients and loss statistics are summed over the ranks before the clip (update ->
    summed_first), so the update is the single-process update of the same batch.
  - TracIn: each rank captures the per-rollout gradients of its share and computes the whole validation
    gradient itself (the validation batch is the same on every rank, so G is the single-process G);
    the selection sees every rank's influence (tracin.select_rollouts -> select_globally: a 'topk'
    threshold is global) and each rank sums its kept rollouts' gradients, summed over ranks as above.
  - evaluation is shared: each rank scores a contiguous run of whole chunks of the test problems and
    the counts are summed (train_base.evaluate); whole chunks keep each chunk's pass@k seed and draws.
  - rank 0 alone takes the out_dir lock, logs and writes checkpoints.
train_base.py does the same with its batch of training rows (train_base.rank_rows); with dropout > 0
each rank draws its own masks, so the run is equivalent but no longer equal to one process's.

Not split: scoring and TracIn's validation pass (replicated, above); the reference log-probs with
background_rewards.
"""
import functools
import os
import sys
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

import grpo
import tracin
from configurator import UserError
from grpo import batch_counts
from lora import lora_parameters

# A rank that waits longer than this in a collective (its peer died, or is stuck) fails instead of
# waiting forever. It must exceed the longest stretch one rank works alone: rank 0's checkpoint and log
# writes while the others wait at the next collective (the evaluation is shared, unevenly when the test
# chunks do not split evenly).
TIMEOUT = timedelta(minutes=10)
_state = {"rank": 0, "world_size": 1}  # this process's place in the job, set by setup()


def launched():
    """Started by torchrun (or anything that sets its environment variables)?"""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def launched_world_size():
    """The number of processes torchrun started (1 without torchrun), known before setup(): for the
    knob checks that run before any process group exists."""
    return int(os.environ["WORLD_SIZE"]) if launched() else 1


def setup(device):
    """(rank, world_size, device) of this process. Under torchrun: the process group is initialised
    (nccl between GPUs, gloo on CPU: nccl moves only CUDA tensors) and each rank takes the GPU
    cuda:LOCAL_RANK of its node. Otherwise (0, 1, device) and nothing is initialised."""
    if not launched():
        return 0, 1, device
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if device.startswith("cuda"):
        device = f"cuda:{local}"
        torch.cuda.set_device(device)  # nccl uses the current device for this rank's communicator
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", timeout=TIMEOUT)
    _state.update(rank=rank, world_size=world)
    return rank, world, device


def rank():
    return _state["rank"]


def world_size():
    return _state["world_size"]


def is_main():
    """Rank 0: the one process that writes files (logs, checkpoints) and prints progress."""
    return _state["rank"] == 0


def all_reduce_sum(tensors):
    """Sum each tensor over the ranks, in place (the same values on every rank afterwards)."""
    if world_size() > 1:
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return tensors


def sum_floats(values):
    """Python floats summed over the ranks: one all-reduce of a float64 tensor for all of them."""
    if world_size() == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64,
                     device=f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def shard(n):
    """This rank's contiguous rows of a global batch of n rows (slice); n must divide evenly."""
    if n % world_size():
        raise UserError(f"{n} rows do not split evenly over {world_size()} processes")
    return split(n)


def split(n, r=None):
    """Rank r's (default: this rank's) contiguous part of n items when n need not divide evenly (slice):
    the first n % world ranks take one more item; a rank may get none (it still joins the collectives
    that follow)."""
    r = rank() if r is None else r
    per, extra = divmod(n, world_size())
    start = r * per + min(r, extra)
    return slice(start, start + per + (r < extra))


def all_gather_cat(t):
    """Every rank's tensor t (the same shape on each), concatenated along dim 0 in rank order, on every rank."""
    if world_size() == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def fail(code):
    """End this process at once after an error, under torchrun. A normal exit would run the process
    group's destructors, which can wait on the other ranks; os._exit does not, and the closed
    connections make the other ranks' collectives fail (gloo) or torchrun stops them (nccl)."""
    if world_size() > 1:
        _exit_now(code)


def _exit_now(code):
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)


@contextmanager
def main_first():
    """Rank 0 runs the block first (it writes files, e.g. the task data), then the others (they read them)."""
    if not is_main():  # (world_size() > 1 here)
        dist.barrier()
    yield
    if is_main() and world_size() > 1:
        dist.barrier()


@contextmanager
def process_group(device):
    """`with process_group(device) as device:` setup() on entry (yields this rank's device), teardown()
    at the end. Not after an error: the group stays up for the error handler (configurator.cli_main
    -> fail), since destroying it can wait on ranks that are still working."""
    yield setup(device)[2]
    teardown()


def teardown():
    """Release the process group at the end of a run (a no-op in a single process)."""
    if dist.is_initialized():
        dist.barrier()  # a rank that finishes first must not tear down while rank 0 still evaluates or writes
        dist.destroy_process_group()
    _state.update(rank=0, world_size=1)


def finish():
    """End a torchrun process once its work is done and the group torn down, skipping the interpreter's
    finalisation: gloo's worker threads can abort the process there ('terminate called without an
    active exception', SIGABRT) although every file is written and closed. A no-op without torchrun."""
    if launched():
        _exit_now(0)


# -----------------------------------------------------------------------------
# the seam: wrappers around the lecture's sampling and gradient, installed once by wrap_step

def wrap_step(step_module):
    """Under torchrun, once at setup: rebind the names the GRPO step calls (step_module: the module that
    holds grpo_step, train_grpo or __main__) so that each rank samples and back-propagates its share
    (the module docstring says how). A no-op in a single process, and when the names are wrapped already."""
    if world_size() == 1 or hasattr(grpo.generate, "__wrapped__"):
        return
    grpo.generate = functools.wraps(grpo.generate)(sample_share(grpo.generate))
    for name in ("grpo_updates", "tracin_backward"):
        f = getattr(step_module, name)
        setattr(step_module, name, functools.wraps(f)(on_rank_share(f, gather=name == "tracin_backward")))
    tracin.select_rollouts = functools.wraps(tracin.select_rollouts)(select_globally(tracin.select_rollouts))
    for module in (grpo, step_module):  # the step calls update for TracIn, grpo_updates for standard GRPO
        module.update = functools.wraps(module.update)(summed_first(module.update))


def sample_share(generate):
    """generate over this rank's contiguous share of the prompts with its columns of the whole batch's
    uniforms, the rows of every rank gathered in the single-process layout (gather_sampled)."""
    def sampled(model, prompts, max_new_tokens, eot_id, num_samples=1, temperature=1.0, generator=None, **kw):
        n, device = len(prompts), next(model.parameters()).device
        shares = [split(n, r) for r in range(world_size())]  # whole prompts: a group never spans two ranks
        mine, u = shares[rank()], None
        if temperature > 0:  # the uniforms of ALL rows, as one process would draw them: (S, n * num_samples)
            u = torch.rand(max_new_tokens, n * num_samples, generator=generator, device=device)
            u = u[:, mine.start * num_samples:mine.stop * num_samples]
        out = generate(model, prompts[mine], max_new_tokens, eot_id, num_samples, temperature, u=u, **kw)
        pad_id = (eot_id[0] if eot_id else 0) if isinstance(eot_id, (tuple, list)) else eot_id
        return gather_sampled(*out, pad_id, [num_samples * (s.stop - s.start) for s in shares])
    return sampled


def rank_share(rollouts, micro_batch_size):
    """This process's contiguous rows of the global batch, with the global counts the loss divides by
    (grpo.policy_backward reads them), so the ranks' gradients add up to the single-process one. A rank's
    share is whole prompts, so the group-relative advantages are those of the single process. bnpo
    divides by each micro-batch's tokens: equal to the single process when micro-batches do not
    straddle ranks."""
    rows = shard(rollouts["idx"].size(0))
    share = {k: rollouts[k][rows] for k in ("idx", "pad_left", "mask", "advantages", "old_logp", "ref_logp")
             if rollouts.get(k) is not None}
    share["global_counts"] = dict(**batch_counts(rollouts["mask"]),
                                  num_micro_batches=world_size() * -(-(rows.stop - rows.start) // micro_batch_size))
    return share


def on_rank_share(backward, gather=False):
    """grpo_updates / tracin_backward on this rank's share of the scored rollouts; with gather (TracIn) the
    per-rollout influence and selection are gathered, so the step has them for the whole batch."""
    def on_share(model, optimizer, rollouts, *args):
        out = backward(model, optimizer, rank_share(rollouts, args[-1]["micro_batch_size"]), *args)
        if not gather:
            return out
        stats, influence, keep = out  # of this rank's share -> of the whole batch, in global order
        return stats, all_gather_cat(influence), all_gather_cat(keep.to(torch.uint8)).bool()
    return on_share


def select_globally(select):
    """tracin.select_rollouts over every rank's influence (a 'topk' threshold is global); this rank's rows."""
    def selected(influence, *args, **kw):
        keep = select(all_gather_cat(influence), *args, **kw)
        return keep[shard(keep.numel())]
    return selected


def summed_first(update):
    """grpo.update after the LoRA gradients and the loss statistics are summed over the ranks (in place),
    before the clip, so every rank clips, skips or steps identically. An explicit all_reduce rather than
    DDP: the LoRA tensors are few and small (one call each is cheap), the three passes and the TracIn
    hooks stay plain module calls, and no DDP wrapper sits around a model that also runs with LoRA
    disabled (the reference pass) or without grad (sampling)."""
    def summed(model, optimizer, cfg, stats, nothing_kept):
        for p in lora_parameters(model):
            if p.grad is None:  # every rank must all-reduce the same list of tensors
                p.grad = torch.zeros_like(p)
        all_reduce_sum([p.grad for p in lora_parameters(model)])
        keys = ("kl_sum", "clipped", "clipped_low", "clipped_high", "ent_sum")
        total = sum_floats([sum(stats["losses"])] + [stats[k] for k in keys])
        stats.update(losses=[total[0]], **dict(zip(keys, total[1:])))
        return update(model, optimizer, cfg, stats, nothing_kept)
    return summed


def gather_sampled(idx, pad_left, mask, pad_id, counts):
    """Every rank's sampled rows on every rank, laid out as one process sampling them all lays them
    out: prompts left-padded to the widest of all, completions padded to the longest, rows in rank
    order. counts[r] = rows of rank r; rank r's prompts were left-padded to
    its own widest and its completions cut after its own longest (sample.generate)."""
    if world_size() == 1:
        return idx, pad_left, mask
    p, t = idx.size(1) - mask.size(1), mask.size(1)
    P, T = (int(v) for v in all_gather_cat(torch.tensor([[p, t]], device=idx.device)).max(0).values)
    most, n = max(counts), idx.size(0)  # all_gather needs equal shapes: pad every share to the largest
    idx = torch.cat([idx.new_full((n, P - p), pad_id), idx, idx.new_full((n, T - t), pad_id)], 1)
    idx = torch.cat([idx, idx.new_full((most - n, P + T), pad_id)])
    mask = torch.cat([torch.cat([mask, mask.new_zeros(n, T - t)], 1), mask.new_zeros(most - n, T)])
    pad_left = torch.cat([pad_left + (P - p), pad_left.new_zeros(most - n)])
    keep = torch.cat([torch.arange(r * most, r * most + c) for r, c in enumerate(counts)]).to(idx.device)
    return all_gather_cat(idx)[keep], all_gather_cat(pad_left)[keep], all_gather_cat(mask)[keep]

