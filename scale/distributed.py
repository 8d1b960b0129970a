"""
More than one process (one per GPU, or several on a CPU) through PyTorch's own torch.distributed,
launched by torchrun as in nanoGPT:

    torchrun --standalone --nproc_per_node=2 train_grpo.py config/tiny_grpo.py

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK in each process's environment. Without them
(`python train_grpo.py ...`) setup() initialises nothing and every helper here is a no-op, so a
single process runs exactly the code it ran before.

This file holds primitives only; the step calls them in sight, where they act (grep `distributed.`).
One GRPO step under torchrun, in the order it runs (train_grpo.grpo_step; the numbers are its steps):
  0. set-up (train_grpo.main, `with distributed.process_group(...)`): one process group (gloo on the
     CPU, nccl on CUDA) and the (host, PID) of every rank, for `lost_peer`; every rank seeds its
     generators alike, so LoRA starts the same everywhere; rank 0 alone takes the out_dir lock.
  1. prompts: every rank draws the same batch (the same seed, the same random.Random).
  2. pass 1, sampling (grpo.sample_rollouts): every rank draws the same uniforms for the whole batch,
     samples its contiguous share of the prompts (`split`; TracIn's 'pg' validation prompts join
     them in the one call) with its columns of the uniforms, and the shares are gathered on every
     rank in the single-process layout (`gather_sampled`); so 1 and N processes draw the same tokens
     up to rounding (a row's logits differ by about 3e-8 with the batch it is computed in: a token
     changes only where its uniform falls that close to a step of the distribution).
  3. rewards and advantages: every rank scores the whole batch (grpo.score_rollouts).
  4-6. passes 3 and 2, the loss and backward (grpo.grpo_updates, tracin.tracin_backward): rank r keeps
     its contiguous rows (grpo.rank_part: whole groups; the loss divides by the whole batch's counts).
     TracIn: each rank captures the per-rollout gradients of its rows and computes the validation
     gradient itself, over the whole validation batch (the same G on every rank); the selection sees
     every rank's influence (`all_gather_cat`) and each rank writes its rows' share of the kept
     rollouts' gradient (`shard`).
  7. update (grpo.update): the LoRA gradients and the step's statistics summed over the ranks right
     before the clip (`sum_grads`, `sum_stats`), so every rank takes the single-process update, up to
     the order of float sums (loss_type 'bnpo' divides by each micro-batch's tokens: equal where the
     ranks' micro-batches are the single process's).
  8. log and checkpoint: rank 0 alone (`is_main`, `print0`). Evaluation: each rank scores a
     contiguous run of whole chunks of the test problems and the counts are summed
     (runs/evaluate.evaluate).
A rank that ends mid-job (kill -9): the training loops name it (`lost_peer`), with where the run
stopped and how to resume it; an error ends a rank at once (`fail`).
train_base.py does the same with its batch of training rows (train_base.rank_rows); with dropout > 0
each rank draws its own masks, so the run is equivalent but no longer equal to one process's.
"""
import os
import socket
import time
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

# torchrun's environment is read in configurator (no torch there); the knob checks ask it here
from configurator import UserError, exit_now, launched, launched_world_size  # noqa: F401
from fileio import pid_alive

# A rank that waits longer than this in a collective (its peer died, or is stuck) fails instead of
# waiting forever. It must exceed the longest stretch one rank works alone: rank 0's checkpoint and log
# writes while the others wait at the next collective (the evaluation is shared, unevenly when the test
# chunks do not split evenly).
TIMEOUT = timedelta(minutes=10)
_state = {"rank": 0, "world_size": 1, "peers": []}  # this process's place in the job, set by setup()


def setup(device):
    """(rank, world_size, device) of this process. Under torchrun: the process group is initialised
    (nccl between GPUs, gloo on CPU: nccl moves only CUDA tensors) and each rank takes the GPU
    cuda:LOCAL_RANK of its node. Otherwise (0, 1, device) and nothing is initialised."""
    if not launched():
        return 0, 1, device
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if device.startswith("cuda"):
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", local + 1))  # torchrun's processes here
        if per_node > gpus:  # each rank of the node finds it: local rank 0 says it, all end (2)
            if local == 0:
                raise UserError(no_gpu(device, per_node, gpus))
            raise SystemExit(2)
        device = f"cuda:{local}"
        torch.cuda.set_device(device)  # nccl uses the current device for this rank's communicator
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", timeout=TIMEOUT)
    _state.update(rank=rank, world_size=world)
    peers = [None] * world  # (host, PID) of every rank: a rank that dies can then be named
    dist.all_gather_object(peers, (socket.gethostname(), os.getpid()))
    _state["peers"] = peers
    return rank, world, device


def no_gpu(device, per_node, gpus):
    """Why torchrun's per_node processes of this node do not each have a GPU, and the fix."""
    if not gpus:
        return (f"device={device!r} but torch.cuda.is_available() is False on this machine "
                f"(torch {torch.__version__}); use --device=cpu, or install a CUDA build of torch")
    return (f"device={device!r} under torchrun: {per_node} processes on this machine, one GPU "
            f"each, but it has {gpus}; start at most --nproc_per_node={gpus}")


def lost_ranks():
    """The ranks on this machine whose process has ended (their PID gone, or a zombie)."""
    host = socket.gethostname()
    return [(r, peer[1]) for r, peer in enumerate(_state["peers"])  # None: the gather failed
            if peer and peer[0] == host and r != rank() and not pid_alive(peer[1])]


# what gloo and nccl say when the other end of a collective is gone or silent
GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "timed out",
        "Timed out", "NCCL communicator was aborted")


def lost_peer(e):
    """Why a collective failed, in one line, where another rank ended mid-job (kill -9, out of
    memory) or stopped answering; None for any other error, or in one process. The training loops
    add where the run stopped and how to resume it."""
    text = str(e)
    if world_size() == 1 or not isinstance(e, RuntimeError):
        return None
    lost = lost_ranks()
    for _ in range(40 if not lost and any(g in text for g in GONE) else 0):
        time.sleep(0.05)  # a killed process closes its sockets before it is seen as ended
        lost = lost_ranks()
        if lost:
            break
    if not lost and not any(g in text for g in GONE):
        return None
    who = ", ".join(f"rank {r} (PID {pid})" for r, pid in lost)
    what = (f"{who} ended during a step" if lost else
            "a rank stopped answering during a step (it ended on another machine, or is stuck)")
    said = (text.splitlines() or [type(e).__name__])[0].split("] ")[-1].split(". ")[0]
    return f"{what}, so this job cannot go on ({said[:80]})"


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


def print0(*args, **kw):
    """print on rank 0 only (every rank computes the same numbers; one of them says them)."""
    if is_main():
        print(*args, **kw)


def sum_grads(params):
    """LoRA gradients summed over the ranks in place, a missing one as zeros. Not DDP: few small
    tensors; no wrapper around a model also run with LoRA off (pass 3) or without grad (pass 1)."""
    if world_size() > 1:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        all_reduce_sum([p.grad for p in params])


def sum_stats(stats):
    """A step's statistics summed over the ranks, in place (a list becomes [its sum]); same keys."""
    if world_size() > 1:
        keys = sorted(stats)
        total = sum_floats([sum(stats[k]) if isinstance(stats[k], list) else stats[k] for k in keys])
        stats.update({k: [t] if isinstance(stats[k], list) else t for k, t in zip(keys, total)})
    return stats


def sum_floats(values):
    """Python floats summed over the ranks: one all-reduce of a float64 tensor for all of them."""
    if world_size() == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64,
                     device=f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def splits_evenly(n, world):
    """n rows (or prompts) in equal shares over `world` processes: what shard relies on, so that
    every rank's update is one process's (checks/grpo_knobs.py says it by the knob that sets n)."""
    return n % world == 0


def shard(n):
    """This rank's contiguous rows of a global batch of n rows (slice), in equal shares."""
    assert splits_evenly(n, world_size()), f"{n} rows over {world_size()} processes"
    return split(n)


def split(n, r=None):
    """Rank r's (default: this one's) contiguous slice of n items; the first n % world ranks take one
    more, a rank may get none (it still joins the collectives that follow)."""
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
        exit_now(code)


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
    at the end. A refusal or an OS error in the block, with more than one rank, names the rank that
    meets it (`error: rank 1: ...`: every rank may print its line). Not torn down after an error: the
    group stays up while configurator.cli_main ends the process at once (os._exit, as fail does),
    since destroying it can wait on ranks that are still working."""
    try:
        yield setup(device)[2]
    except UserError as e:
        if world_size() == 1:
            raise
        raise UserError(f"rank {rank()}: {e}") from None
    except OSError as e:  # said as cli_main says it, the rank first
        if world_size() == 1:
            raise
        where = f"{e.filename}: " if e.filename else ""
        raise UserError(f"rank {rank()}: {where}{e.strerror or e}") from None
    teardown()


def teardown():
    """Release the process group at the end of a run (a no-op in a single process)."""
    if dist.is_initialized():
        dist.barrier()  # a rank that finishes first must not tear down while rank 0 still evaluates or writes
        dist.destroy_process_group()
    _state.update(rank=0, world_size=1, peers=[])


def finish():
    """End a torchrun process once its work is done and the group torn down, skipping the interpreter's
    finalisation: gloo's worker threads can abort the process there ('terminate called without an
    active exception', SIGABRT) although every file is written and closed. A no-op without torchrun."""
    if launched():
        exit_now(0)


def gather_sampled(idx, pad_left, mask, pad_id, n_prompts, num_samples):
    """Every rank's sampled rows (rank r: split(n_prompts, r) of the prompts, num_samples rows each,
    padded to its own widest prompt and longest completion) on every rank, laid out as one process
    would: prompts left-padded to the widest of all, completions to the longest, in rank order."""
    if world_size() == 1:
        return idx, pad_left, mask
    shares = [split(n_prompts, r) for r in range(world_size())]
    counts = [num_samples * (s.stop - s.start) for s in shares]  # rows of each rank
    p, t = idx.size(1) - mask.size(1), mask.size(1)
    P, T = (int(v) for v in all_gather_cat(torch.tensor([[p, t]], device=idx.device)).max(0).values)
    most, n = max(counts), idx.size(0)  # all_gather needs equal shapes: pad every share to the largest
    idx = torch.cat([idx.new_full((n, P - p), pad_id), idx, idx.new_full((n, T - t), pad_id)], 1)
    idx = torch.cat([idx, idx.new_full((most - n, P + T), pad_id)])
    mask = torch.cat([torch.cat([mask, mask.new_zeros(n, T - t)], 1), mask.new_zeros(most - n, T)])
    pad_left = torch.cat([pad_left + (P - p), pad_left.new_zeros(most - n)])
    keep = torch.cat([torch.arange(r * most, r * most + c) for r, c in enumerate(counts)]).to(idx.device)
    return all_gather_cat(idx)[keep], all_gather_cat(pad_left)[keep], all_gather_cat(mask)[keep]

