"""
Supervised training of the small base GPT on the task, so that GRPO has
a policy to improve.

    python train_base.py config/tiny_base.py  # about a minute on a 2-core CPU
    python train_base.py config/tiny_base.py --init_from=resume
    # 2 processes (scale/distributed.py):
    torchrun --standalone --nproc_per_node=2 train_base.py config/tiny_base.py

Loss: next-token cross-entropy on the solution tokens only (the question
is given, not learned). Prints one line per log_interval, evaluates greedy
test accuracy every eval_interval, and writes out_dir/ckpt.pt atomically
(a crash mid-write never leaves half a checkpoint).
"""
# configurator first: a Ctrl-C during the slow imports below (torch)
# is one line, not a traceback
from configurator import (Interrupted, UserError, check, check_adam_lr,
                          check_choice, check_decay, check_finite,
                          check_nonnegative, check_positive, cli_main,
                          configure, quiet_start)
quiet_start(__name__)
import math
import os
import random
import time
from contextlib import nullcontext
from types import SimpleNamespace

import torch

from scale import distributed
from data.datadir import (check_task_data, data_fingerprint, load_split,
                          load_tokenizer)
from data.gsm_synth.prepare import TEMPLATES
from scale.device import check_device
from runs.checkpoint import (CheckpointWriteError, load_checkpoint,
                             save_checkpoint)
from checks.base_knobs import (build_model, check_batch, check_eval_cache,
                               check_loads, check_resume, check_same_data)
from runs.base import base_exists
from runs.rundir import run_lock, stop_note
from data.prompts import encode_prompt, encode_text
from data.tasks import base_data, check_base_knobs, portable_path, resolve_data_dir
import runs.evaluate  # (its EVAL_BATCH, named in place: a global number here would be a knob)
from runs.evaluate import evaluate, get_lr

# -----------------------------------------------------------------------------
# default config values (override with a config file and/or --key=value)
out_dir = "out/base"
init_from = "scratch"  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
seed = 1337
device = "cpu"         # 'cpu', 'cuda', 'cuda:1', 'mps'
# 'arith' (data/gsm_synth) or 'countdown' (data/countdown/searched.py)
task = "arith"
# task 'arith': synthetic GSM8K-style problems (data/gsm_synth/prepare.py)
task_steps = 2         # operations per problem
# problems have task_min_steps..task_steps operations (0 = task_steps)
task_min_steps = 0
task_max_operand = 20  # operands drawn from 1..task_max_operand
task_ops = "+-"        # any of '+-*/'
# share of training solutions that stop one step early (see prepare.py)
task_noise = 0.0
n_train = 20000
# task 'countdown': reach a target from every given number once;
# solutions show a search (data/countdown)
countdown_numbers = 3       # numbers per problem
countdown_max_number = 12   # numbers drawn from 1..countdown_max_number
countdown_max_target = 100  # targets at most this
# a reference solution shows 0..this many missed tries before the hit
countdown_max_misses = 3
# searched solutions per training problem (each with other misses)
countdown_variants = 1
# two-number problems added to the training rows: the search's arithmetic
countdown_pairs = 0
# every try sets its result beside the target: "70-5=65 vs 43 no."
countdown_check = False
# the tries walked in one fixed order, some skipped, to the first hit
countdown_ordered = False
# each try's last step the one that comes closest to the target
countdown_closest = False
# share of training solutions that stop at their last miss (RL's room)
countdown_give_up = 0.0
# model
n_layer = 4
n_head = 4
n_embd = 128
block_size = 96
dropout = 0.0
bias = False
# optimisation (AdamW, warmup then cosine decay to min_lr)
batch_size = 64
max_iters = 2000
learning_rate = 3e-3
min_lr = 3e-4
# cosine reaches min_lr here; 0 = max_iters
# (set it to stop early and resume later)
lr_decay_iters = 0
warmup_iters = 100
weight_decay = 0.1
beta1, beta2 = 0.9, 0.99
grad_clip = 1.0
# logging / evaluation
log_interval = 50
eval_interval = 500
eval_n = 200  # test problems scored greedily at each eval
max_new_tokens = 40
# 'bfloat16': autocast (weights and AdamW stay float32); 'float32';
# 'auto': bf16 where the device runs it fast (CUDA with bf16,
# CPUs with AMX / AVX512-BF16)
dtype = "auto"
# -----------------------------------------------------------------------------
defaults = {k: v for k, v in dict(globals()).items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str))}


def load_task(cfg, verbose=True):
    """Prepare the task data if missing; return (data_dir, tokenizer)."""
    # (its errors name this script's keys: countdown_variants)
    data_dir = base_data(cfg, verbose)
    return data_dir, load_tokenizer(data_dir)


def tokenize_examples(enc, examples):
    """(prompt ids, completion ids + EOT) per example."""
    return [(encode_prompt(enc, e["question"]),
             encode_text(enc, e["solution"]) + [enc.eot_token])
            for e in examples]


def get_batch(pairs, batch_size, rng, device):
    """Right-padded (x, y) with y = -1 on prompt tokens and padding:
    only solutions are learned."""
    rows = [pairs[rng.randrange(len(pairs))] for _ in range(batch_size)]
    T = max(len(p) + len(c) for p, c in rows) - 1
    x = torch.zeros(batch_size, T, dtype=torch.long)
    y = torch.full((batch_size, T), -1, dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        seq = torch.tensor(p + c)
        x[i, :len(seq) - 1] = seq[:-1]
        y[i, len(p) - 1:len(seq) - 1] = seq[len(p):]
    return x.to(device), y.to(device)


def validate(cfg):
    """Every knob, before any work or file is written
    (one line: key, value, what is allowed)."""
    check(cfg, "out_dir", cfg["out_dir"] != "",
          "give a directory, e.g. --out_dir=out/base")
    check_finite(cfg, "grad_clip")
    check_choice(cfg, "init_from", ("scratch", "resume"))
    check_choice(cfg, "task", ("arith", "countdown"))
    # the task's data knobs, sizes bounded; others' refused
    check_base_knobs(cfg, defaults)
    check_positive(cfg, "batch_size", "learning_rate", "grad_clip",
                   "log_interval", "eval_interval", "eval_n",
                   "max_new_tokens", "n_layer", "n_head", "n_embd",
                   "block_size", "n_train", "task_steps",
                   "countdown_variants", "task_max_operand")
    check(cfg, "max_iters", cfg["max_iters"] >= 1,
          "must be >= 1 (0 would leave a random-weights base for GRPO)")
    check_nonnegative(cfg, "min_lr", "warmup_iters", "lr_decay_iters",
                      "weight_decay")
    check(cfg, "n_embd", cfg["n_embd"] % cfg["n_head"] == 0,
          f"must be a multiple of n_head={cfg['n_head']}")
    for k in ("dropout", "beta1", "beta2"):
        check(cfg, k, 0 <= cfg[k] < 1, "must be in [0, 1)")
    check_adam_lr(cfg, cfg["beta1"], "learning_rate", "min_lr")
    check_decay(cfg)
    check(cfg, "max_new_tokens", cfg["max_new_tokens"] < cfg["block_size"],
          f"must be < block_size={cfg['block_size']}: "
          "a question and its answer share the context")
    ops = cfg["task_ops"]
    check(cfg, "task_ops", ops != "" and set(ops) <= set(TEMPLATES),
          f"one or more of the operations {''.join(TEMPLATES)!r}, e.g. '+-'")
    check(cfg, "task_noise", 0 <= cfg["task_noise"] <= 1, "must be in [0, 1]")
    steps = cfg["task_steps"]
    check(cfg, "task_min_steps", 0 <= cfg["task_min_steps"] <= steps,
          f"must be in [0, task_steps={steps}] "
          "(0 = every problem has task_steps operations)")
    check(cfg, "task_noise", cfg["task_noise"] == 0 or steps >= 2,
          "needs task_steps >= 2 (a noisy solution stops one step early)")
    # checked before any process group
    world = distributed.launched_world_size()
    check(cfg, "batch_size", cfg["batch_size"] % world == 0,
          f"must split evenly over the {world} processes")


def main(argv):
    cfg = configure(defaults, argv)
    ckpt = None
    # the saved run's config; only what argv gives overrides it
    if cfg["init_from"] == "resume":
        path = os.path.join(cfg["out_dir"], "ckpt.pt")
        ckpt = load_checkpoint(path)
        kinds = dict(model=dict, model_args=dict, config=dict,
                     optimizer=dict, rng=dict, iter_num=int)
        not_base = ("lora" in ckpt
                    or any(not isinstance(ckpt.get(k), t) for k, t in kinds.items())
                    or not isinstance(ckpt.get("data_dir", ""), str)
                    or not isinstance(ckpt["rng"].get("torch"), torch.Tensor))
        if not_base:
            raise UserError(
                f"{path} is not a train_base.py checkpoint "
                "(a GRPO run's, or changed since): "
                "give the out_dir of the base to resume")
        cfg = configure(defaults, argv, saved=ckpt.get("config", {}))
        check_resume(cfg, ckpt, path)
    validate(cfg)
    # torchrun: cuda:LOCAL_RANK
    with distributed.process_group(cfg["device"]) as cfg["device"]:
        # 'auto' resolved; bf16 autocast or none
        cfg["dtype"], amp = check_device(cfg["device"], cfg["dtype"])
        # from here, a second run in this out_dir is refused
        # (rank 0 locks it for the whole job)
        lock = run_lock(cfg["out_dir"]) if distributed.is_main() else nullcontext()
        with lock:
            run = setup(cfg, ckpt)
            # every pass computes in this precision
            # (bf16 autocast, or the weights' own)
            run.amp = amp
            # before iter 0
            check_eval_cache(run.model, run.enc, run.test, cfg, runs.evaluate.EVAL_BATCH,
                             amp)
            # weights and optimizer state now live in the model and
            # optimizer: free the loaded copy
            del ckpt
            return train(cfg, run)


def setup(cfg, ckpt):
    """The task data, the model and its optimizer: new, or restored from
    the checkpoint `ckpt`."""
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    # (a link to a disk not mounted is refused, never written over)
    if ckpt is None and base_exists(ckpt_path, "checkpoint") and distributed.is_main():
        raise UserError(
            f"{ckpt_path} exists: continue that run with --init_from=resume, "
            "or train a new base with another --out_dir "
            f"(or delete {ckpt_path})")
    torch.manual_seed(cfg["seed"])
    metrics = {} if ckpt is None else ckpt.get("metrics", {})
    run = SimpleNamespace(ckpt_path=ckpt_path,
                          rng=random.Random(cfg["seed"]),
                          iter_num=0,
                          elapsed_before=0.0,
                          last_ckpt=None,
                          metrics=metrics)
    # rank 0 writes any missing task data, the others then read it
    with distributed.main_first():
        run.data_dir, run.enc = task_files(cfg, ckpt)
    # another task's rows put in its place: refused
    check_task_data(run.data_dir, cfg["task"], resuming=ckpt is not None)
    splits = {s: load_split(run.data_dir, s) for s in ("train", "val", "test")}
    # checkpoints record it
    run.data_fingerprint = data_fingerprint(run.data_dir)
    if ckpt is not None:
        check_same_data(ckpt, ckpt_path, run.data_dir, run.enc,
                        run.data_fingerprint)
    run.train_pairs = tokenize_examples(run.enc, splits["train"])
    run.test = splits["test"][:cfg["eval_n"]]
    block_size = cfg["block_size"]
    longest = max(len(p) + len(c) for p, c in run.train_pairs)
    if longest > block_size:
        raise UserError(f"training sequences reach {longest} tokens "
                        f"but block_size={block_size}")
    check_batch(cfg, longest, run.enc.n_vocab)  # its logits fit the memory
    longest = max(len(encode_prompt(run.enc, e["question"]))
                  for e in run.test)
    # now, not at the first evaluation
    if longest + cfg["max_new_tokens"] > block_size:
        raise UserError(
            f"config key 'max_new_tokens' = {cfg['max_new_tokens']} "
            f"is not allowed: the longest test question ({longest} tokens) "
            f"+ max_new_tokens must fit block_size={block_size}: "
            f"give at most {block_size - longest}")
    run.model_args = dict(block_size=block_size,
                          vocab_size=run.enc.n_vocab,
                          n_layer=cfg["n_layer"],
                          n_head=cfg["n_head"],
                          n_embd=cfg["n_embd"],
                          dropout=cfg["dropout"],
                          bias=cfg["bias"])
    # the weights' shapes (check_resume: cfg's too); dropout as configured now
    if ckpt is not None:
        run.model_args = {**ckpt["model_args"], "dropout": cfg["dropout"]}
    run.model = build_model(run.model_args, cfg["device"], ckpt, ckpt_path)
    if ckpt is not None:
        run.iter_num = run.last_ckpt = ckpt["iter_num"]
        run.elapsed_before = ckpt.get("train_seconds", 0.0)
        torch.set_rng_state(ckpt["rng"]["torch"])
        run.rng.setstate(ckpt["rng"]["python"])
        print(f"resuming from {ckpt_path} at iter {run.iter_num}")
    n_params = run.model.num_params() / 1e6
    distributed.print0(f"GPT with {n_params:.2f}M parameters, "
                       f"vocab {run.enc.n_vocab}")
    # gains, biases: no weight decay
    decay = [p for p in run.model.parameters() if p.dim() >= 2]
    no_decay = [p for p in run.model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    run.optimizer = torch.optim.AdamW(groups, lr=cfg["learning_rate"],
                                      betas=(cfg["beta1"], cfg["beta2"]))
    if ckpt is not None:
        try:
            run.optimizer.load_state_dict(ckpt["optimizer"])
        # groups or sizes of another model
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"{ckpt_path}: its optimizer state does not fit "
                            f"the model ({e}); "
                            "train a new base with another --out_dir") from None
    return run


def task_files(cfg, ckpt):
    """(data_dir, tokenizer): a resumed run's are those its checkpoint
    recorded (in this copy of the project); a new run's, or a resumed
    one's whose directory is gone, load_task's (built again from the saved
    knobs; check_same_data then compares them with the checkpoint's)."""
    recorded = ""
    if ckpt is not None:
        recorded = resolve_data_dir(ckpt.get("data_dir", ""))
    if recorded and os.path.isdir(recorded):
        return recorded, load_tokenizer(recorded)
    return load_task(cfg)


def rank_rows(x, y):
    """Under torchrun: this rank's contiguous rows of the whole batch
    (every rank drew all of it from the same seeded stream) and the factor
    that turns the mean loss over its target tokens into its share of the
    mean over the whole batch's, so that the summed gradients are the
    single-process gradient. In one process: (x, y, 1.0)."""
    if distributed.world_size() == 1:
        return x, y, 1.0
    rows = distributed.shard(x.size(0))
    share = ((y[rows] != -1).sum() / (y != -1).sum()).item()
    return x[rows], y[rows], share


def train(cfg, run):
    """Training loop: a line per log_interval, an evaluation and
    a checkpoint per eval_interval."""
    model, optimizer, rng = run.model, run.optimizer, run.rng

    def checkpoint(metrics):
        # every rank holds the same weights; rank 0 writes them
        if distributed.is_main():
            elapsed = run.elapsed_before + time.time() - t_start
            rng_state = {"torch": torch.get_rng_state(),
                         "python": rng.getstate()}
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "model_args": run.model_args,
                "iter_num": run.iter_num,
                "config": dict(cfg),
                # relative to the project
                "data_dir": portable_path(run.data_dir),
                # the data it is bound to
                "data_fingerprint": run.data_fingerprint,
                "train_seconds": elapsed,
                "metrics": metrics,
                "rng": rng_state}
            # ckpt.pt is replaced only by a state that loads
            check_loads(state, run.ckpt_path)
            save_checkpoint(state, run.ckpt_path)
        run.last_ckpt = run.iter_num

    t_start = t_log = time.time()
    metrics = run.metrics  # a resumed run's last evaluation until the next
    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    try:
        while run.iter_num < cfg["max_iters"]:
            lr = get_lr(run.iter_num, decay_iters, cfg["learning_rate"],
                        cfg["min_lr"], cfg["warmup_iters"])
            for g in optimizer.param_groups:
                g["lr"] = lr
            batch = get_batch(run.train_pairs, cfg["batch_size"], rng,
                              cfg["device"])
            x, y, share = rank_rows(*batch)
            model.train()
            with run.amp:
                _, loss = model(x, targets=y)
            if share != 1.0:
                loss = loss * share
            loss.backward()
            # summed over ranks by an explicit all-reduce per tensor: one
            # code path with the single process; DDP would overlap it with
            # the backward, which pays off only for a large model
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            distributed.all_reduce_sum(grads)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            run.iter_num += 1
            it = run.iter_num
            at_eval = it % cfg["eval_interval"] == 0 or it == cfg["max_iters"]
            at_log = it % cfg["log_interval"] == 0
            if at_eval or at_log:  # whole batch's loss: ranks' shares summed
                loss_value = distributed.sum_floats([loss.item()])[0]
            if (at_eval or at_log) and not math.isfinite(loss_value):
                last = run.ckpt_path if run.last_ckpt is not None else "none"
                raise UserError(
                    f"the training loss is {loss_value} at iter {it}: "
                    "training diverged; lower learning_rate "
                    f"(last checkpoint: {last})")
            if at_log and distributed.is_main():
                dt = (time.time() - t_log) / cfg["log_interval"]
                t_log = time.time()
                elapsed = run.elapsed_before + time.time() - t_start
                print(f"iter {it:5d} | loss {loss_value:.4f} | lr {lr:.2e}"
                      f" | {dt * 1000:.0f} ms/iter"
                      f" | {elapsed:.0f}s")
            if at_eval:  # every rank scores its share of the test problems
                with run.amp:
                    metrics = evaluate(model, run.enc, run.test,
                                       cfg["max_new_tokens"],
                                       task=cfg["task"])
            if at_eval and distributed.is_main():
                accuracy = metrics["accuracy"]
                print(f"eval  {it:5d} | test accuracy {accuracy:.3f} "
                      f"(greedy, {len(run.test)} problems)")
            if at_eval:
                checkpoint(metrics)
    # Ctrl-C, full disk, a rank lost under torchrun (distributed.lost_peer):
    # where to go on from
    except (KeyboardInterrupt, CheckpointWriteError, RuntimeError) as e:
        lost = distributed.lost_peer(e)
        if isinstance(e, RuntimeError) and lost is None:
            raise
        note = stop_note("train_base.py", cfg["out_dir"], run.last_ckpt,
                         remove_files=False)
        where = (f"train_base.py stopped at iter {run.iter_num} "
                 f"of {cfg['max_iters']}; {note}")
        if isinstance(e, KeyboardInterrupt):
            raise Interrupted(where) from None
        raise UserError(f"{lost or e}; {where}") from None
    total = run.elapsed_before + time.time() - t_start
    acc = ""
    if "accuracy" in metrics:
        acc = f", test accuracy {metrics['accuracy']:.3f}"
    distributed.print0(f"done: {run.iter_num} iters in {total:.0f}s{acc}, "
                       f"checkpoint {run.ckpt_path}")
    return metrics


if __name__ == "__main__":
    cli_main(main)
