"""
Checkpoint files, for every script: written atomically (a crash leaves the previous file whole),
read with torch.load(weights_only=True) (no arbitrary code) and one-line errors, a GPT built from a
train_base.py checkpoint, a GRPO checkpoint's adapter put on a model (load_adapter: one line where it
does not fit), and the fingerprint that binds an adapter to its base's weights.
Nothing here runs inside a step: train_base.py and train_grpo.py (runs/state.save_run) save, every script loads.
"""
import hashlib
import io
import os
import re

import torch

from configurator import UserError
from lora import load_lora_state_dict, lora_state_dict
from model import GPT, GPTConfig
from pretrained.hf import hf_tensors

class CheckpointWriteError(UserError):
    """A checkpoint that could not be written (disk full, read-only): a training loop adds where
    it can go on from."""


def save_checkpoint(obj, path):
    """Write atomically: a crash mid-write leaves the previous file intact, never half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    buf = io.BytesIO()
    torch.save(obj, buf)  # in memory first: saving to a full disk reports "unexpected pos", not why
    try:
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
        os.replace(tmp, path)  # atomic rename on POSIX and Windows
    except OSError as e:  # disk full, read-only, ...: the OS's own reason
        raise CheckpointWriteError(f"cannot write checkpoint {path}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):  # failed or interrupted (Ctrl-C) mid-write: no half file left
            os.remove(tmp)


def load_checkpoint(path, map_location="cpu"):
    """torch.load with weights_only=True (no arbitrary code), with one-line errors."""
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path}")
    if os.path.isdir(path):  # torch.load's IsADirectoryError would read as a corrupt file
        kinds = {"config.json": "a Hugging Face model directory",
                 "ckpt.pt": f"a run directory (its checkpoint: {path}/ckpt.pt)"}
        what = next((v for k, v in kinds.items() if os.path.isfile(f"{path}/{k}")), "a directory")
        raise UserError(f"{path} is {what}, not a checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        code = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))  # weights_only refused it, unrun
        if code:
            raise UserError(f"checkpoint {path} holds {code[1]}, not only tensors and plain data: "
                            f"refused, since loading it could run code") from None
        first_line = (str(e).splitlines() or [""])[0][:120]
        raise UserError(f"checkpoint {path} is corrupt or not a checkpoint "
                        f"({type(e).__name__}: {first_line})") from None
    if not isinstance(ckpt, dict):  # a bare tensor or list saved with torch.save
        raise UserError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint (a dict)")
    return ckpt


def load_adapter(model, sd):
    """A checkpoint's LoRA weights into the model's adapter (lora.load_lora_state_dict), refused in one
    line unless each weight the model has is there, in its shape, and no other."""
    own = lora_state_dict(model)
    if set(own) != set(sd):
        missing, extra = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
        raise UserError(f"LoRA weights do not fit this model: missing {missing[:3]}, unexpected {extra[:3]} "
                        "(were they saved with other lora_targets?)")
    for k, v in sd.items():
        if own[k].shape != v.shape:
            raise UserError(f"LoRA weight {k} has shape {tuple(v.shape)}, model expects {tuple(own[k].shape)} "
                            "(another lora_r, or a base of another shape?)")
    load_lora_state_dict(model, sd)


def model_from_checkpoint(ckpt, path="checkpoint", **overrides):
    """Build a GPT from a base checkpoint's model_args and weights; a mismatch is a clear error."""
    if "lora" in ckpt:  # a GRPO run's: an adapter, not a model
        raise UserError(f"{path} is a train_grpo.py checkpoint (a LoRA adapter on the base "
                        f"{ckpt.get('base_ckpt')}), not a base model: "
                        f"give a base, e.g. the one it was trained on")
    if "model_args" not in ckpt or "model" not in ckpt:
        raise UserError(f"{path} is not a base model checkpoint (no model_args/model)")
    args = {**ckpt["model_args"], **overrides}
    try:
        model = GPT(GPTConfig(**args))
    except (TypeError, AssertionError) as e:
        raise UserError(f"{path} has model_args this GPT cannot build ({e})") from None
    sd = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    try:
        model.load_state_dict(sd)
    except RuntimeError as e:
        lines = str(e).splitlines()
        raise UserError(f"{path} does not match the GPT architecture {ckpt['model_args']}: "
                        f"{lines[1].strip() if len(lines) > 1 else e}") from None
    return model


def base_fingerprint(path, model):
    """sha256 (16 hex digits) of every tensor's name, dtype, shape and bytes: two bases of the same
    shape but other weights (retrained, another seed) get different fingerprints. A Hugging Face
    directory's are the tensors as its files store them, whatever dtype they were loaded in."""
    if os.path.isdir(path):
        return tensors_fingerprint(hf_tensors(path))
    return tensors_fingerprint(model.state_dict().items())


def tensors_fingerprint(named_tensors):
    h = hashlib.sha256()
    for k, t in sorted(named_tensors, key=lambda kv: kv[0]):
        t = t.detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
