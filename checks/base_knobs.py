"""
The checks of a train_base.py run beyond its knobs (train_base.validate): what a resumed base
is bound to (its weights' shapes, the data and tokenizer it was trained on), whether its model
and its evaluation's KV cache can be allocated, and whether a checkpoint loads before it
replaces ckpt.pt. Where it plugs in: train_base.main calls check_resume once the saved config
is merged in; setup, check_same_data and build_model; check_eval_cache runs before iteration 0;
every checkpoint passes check_loads.
"""
import os
from contextlib import nullcontext

import torch

from configurator import UserError, named, set_in
from model import GPT, GPTConfig
from runs.checkpoint import CheckpointWriteError, model_from_checkpoint
from data.datadir import changed_data
from data.prompts import encode_prompt

# what a resumed run may not change: the weights' shapes, the knobs that pick its data and tokenizer
MODEL_KNOBS = ("n_layer", "n_head", "n_embd", "block_size", "bias")
DATA_KNOBS = ("task", "n_train", "task_steps", "task_min_steps", "task_max_operand", "task_ops",
              "task_noise", "countdown_numbers", "countdown_max_number", "countdown_max_target",
              "countdown_max_misses", "countdown_variants", "countdown_pairs",
              "countdown_check", "countdown_ordered", "countdown_closest", "countdown_give_up")


def check_resume(cfg, ckpt, path):
    """A resumed base goes on training ONE model on ONE data set: a knob that shapes the weights
    (compared with the checkpoint's model_args) or picks the data and tokenizer (with its saved
    config) keeps its value; an older checkpoint without a key is not compared on it."""
    shapes = {k: v for k, v in ckpt["model_args"].items() if k in MODEL_KNOBS}
    saved = {**ckpt.get("config", {}), **shapes}
    for k in MODEL_KNOBS + DATA_KNOBS:
        if k in saved and saved[k] != cfg[k]:
            what = "shapes the weights" if k in MODEL_KNOBS else "picks the task data and tokenizer"
            where = set_in(cfg, k)
            leave = f"remove {k} from {where}" if where else f"leave --{k} out"
            raise UserError(f"{named(cfg, k)} cannot change on resume: {path} was trained with "
                            f"{saved[k]!r} and it {what}; {leave} to go on with that run, or "
                            "start a new out_dir to train a new base")


def check_same_data(ckpt, path, data_dir, enc, fingerprint):
    """A resumed base reads the data and tokenizer it was trained on: a directory rebuilt from other
    files (another prepare.py, a hand edit) swaps what its token ids mean. fingerprint: the directory's
    now (data/datadir.data_fingerprint). A checkpoint made before data_fingerprint was recorded is
    compared on its vocabulary size only."""
    changed = changed_data(ckpt.get("data_fingerprint"), fingerprint)
    vocab = ckpt["model_args"].get("vocab_size", enc.n_vocab)
    if vocab != enc.n_vocab and "tokenizer" not in changed:
        changed.insert(0, f"tokenizer ({enc.n_vocab} tokens, the model's {vocab})")
    if changed:
        raise UserError(f"{data_dir} is not the data {path} was trained on (changed: "
                        f"{', '.join(changed)}): it was rebuilt from other files; put the original "
                        f"back, or start a new out_dir to train a new base on it")


def build_model(args, device, ckpt, path):
    """The GPT of model_args (or the checkpoint's, with its weights) on device. Too large to
    allocate is one line naming the knob to lower: block_size when its position table
    (block_size x n_embd) is the largest part, else n_layer or n_embd. Weights whose training
    state (weights, gradients, AdamW's two moments: 16 bytes a float32 parameter) exceeds the
    memory there are refused before any is allocated (n_layer=10**9 would take minutes to fail,
    and a machine that overcommits memory may kill the process instead)."""
    L, n, block = args["n_layer"], args["n_embd"], args["block_size"]
    need = 16 * (12 * L * n * n + (args.get("vocab_size", 0) + block) * n)  # at least
    have = memory_of(device)
    try:
        if have and need > have:
            raise MemoryError(f"its weights, gradients and AdamW state take {need / 2 ** 30:.3g} "
                              f"GiB of the {have / 2 ** 30:.3g} GiB there")
        model = GPT(GPTConfig(**args)) if ckpt is None else \
            model_from_checkpoint(ckpt, path, dropout=args["dropout"])
        return model.to(device)
    except (RuntimeError, MemoryError, TypeError, OverflowError) as e:  # TypeError: beyond 64 bits
        raise UserError(f"cannot allocate the model on {device} (block_size={block}, n_layer={L}, "
                        f"n_embd={n}): {first_line(e)}; lower "
                        f"{'block_size' if block >= 12 * L * n else 'n_layer or n_embd'}") from None


def memory_of(device):
    """Bytes of memory where the model is built (this machine's) and put (a GPU's); 0 = unknown."""
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        return 0
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        have = min(have, torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return have


def check_batch(cfg, longest, vocab_size):
    """A training batch's logits (batch_size x its longest sequence x vocab, float32: the largest
    activation) must fit the memory there: refused before iteration 0, not at it with a traceback
    (or the kernel's kill)."""
    need, have = 4 * cfg["batch_size"] * longest * vocab_size, memory_of(cfg["device"])
    if have and need > have:
        raise UserError(f"config key 'batch_size' = {cfg['batch_size']} is not allowed: a batch's "
                        f"logits ({cfg['batch_size']} x {longest} tokens x {vocab_size}) take "
                        f"{need / 2 ** 30:.3g} GiB of the {have / 2 ** 30:.3g} GiB there; lower it")


def check_eval_cache(model, enc, test, cfg, batch, amp):
    """The evaluation's KV cache (batch rows x the longest test prompt + max_new_tokens), checked
    before iteration 0 by check_kv_cache."""
    rows = min(batch, len(test))
    length = max(len(encode_prompt(enc, e["question"])) for e in test) + cfg["max_new_tokens"]
    check_kv_cache(model, rows, length, cfg["device"], "the evaluation's",
                   "lower max_new_tokens (or eval_n, n_layer, n_embd)", amp)


def check_kv_cache(model, rows, length, device, what, fix, amp=nullcontext()):
    """A KV cache of rows x length positions, every layer, is allocated once before iteration 0:
    too large is one line then (`what` names whose, `fix` what to lower), not a traceback after
    training. One larger than the memory there is refused without trying (build_model)."""
    c, p, have = model.config, next(model.parameters()), memory_of(device)
    width = (c.n_kv_head or c.n_head) * (c.n_embd // c.n_head)  # a layer's keys at one position
    try:
        with amp:  # the run's precision
            kind = p.device.type  # the dtype model.new_cache will choose
            dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else p.dtype
            need = 2 * c.n_layer * rows * length * width * dtype.itemsize  # keys and values
            if need > have > 0:
                raise MemoryError(f"it takes {need / 2 ** 30:.3g} GiB of the {have / 2 ** 30:.3g} "
                                  f"GiB there")
            cache = model.new_cache(rows, length)
        del cache  # only whether it fits was in question
    except (RuntimeError, MemoryError) as e:
        raise UserError(f"cannot allocate {what} KV cache ({rows} rows x {length} positions x "
                        f"{model.config.n_layer} layers on {device}): {first_line(e)}; {fix}"
                        ) from None


def check_loads(state, path):
    """A checkpoint is written only if it loads: its model_args build a GPT (on the meta device: no
    memory) whose tensors have the shapes of its weights, and its config resumes (check_resume)."""
    try:
        with torch.device("meta"):
            want = GPT(GPTConfig(**state["model_args"])).state_dict()
        check_resume(state["config"], state, path)
    except (TypeError, AssertionError, UserError) as e:
        raise CheckpointWriteError(f"not writing {path}, which would not load ({e})") from None
    have = state["model"]
    bad = sorted(k for k in want.keys() | have.keys()
                 if k not in want or k not in have or want[k].shape != have[k].shape)
    if bad:
        raise CheckpointWriteError(f"not writing {path}: its weights do not fit its model_args "
                                   f"{state['model_args']} ({bad[0]}), so it would not load")


def first_line(e):
    return (str(e).splitlines() or [type(e).__name__])[0][:160]
