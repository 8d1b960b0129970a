"""
A run's base, for every script that puts an adapter on it (runs/loading.load_policy: sampling, attribution,
export; train_grpo.py's resume): what the adapter is bound to (base_identity: the tensors' fingerprint
from model.base_fingerprint, the configuration, the tokenizer and its chat format), what changed when it
is refused (check_same_base), where the base is now (resolve_base, one message for a moved base), and
the one test of a base's path (base_exists: a link to a disk not mounted is not a missing base).
"""
import hashlib
import os
from dataclasses import asdict

from configurator import UserError
from data.tasks import PROJECT

# What defines a base besides its tensors: the GPTConfig switches (RoPE's theta, the norm's epsilon and kind, a
# tied head, ...) and the tokenizer with its chat format; an adapter trained on one is refused on another.
# Not compared: dropout and grad_checkpoint (a run's knobs: dropout is off, checkpointing is exact) and
# block_size (the longest context, not what a position computes; GPT-2's wpe shape is in the tensors).
RUN_KNOBS = ("dropout", "grad_checkpoint", "block_size")
TOKENIZER_PARTS = {"vocabulary": "_mergeable_ranks", "special tokens": "_special_tokens", "split pattern": "_pat_str",
                   "NFC normalisation": "nfc", "end-of-text id": "eot_token", "stop ids": "stop_tokens",
                   "chat format": "chat", "chat template": "chat_template"}


def short_hash(value):
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def base_identity(tensors_fp, model, enc):
    """Everything an adapter is bound to: {'tensors': base_fingerprint, 'config': {GPTConfig field: value},
    'tokenizer': {part: hash}}; a checkpoint stores it as base_identity (beside base_fingerprint)."""
    config = {k: v for k, v in asdict(model.config).items() if k not in RUN_KNOBS}
    parts = {name: getattr(enc, attr, None) for name, attr in TOKENIZER_PARTS.items()}
    parts["vocabulary"] = sorted((parts["vocabulary"] or {}).items())  # a dict's order is not its content
    parts["special tokens"] = sorted((parts["special tokens"] or {}).items())
    return {"tensors": tensors_fp, "config": config, "tokenizer": {k: short_hash(v) for k, v in parts.items()}}


def base_changes(saved, found):
    """What differs between two base identities, in words; only the parts both hold are compared (a run
    made before base_identity existed stored the tensors' fingerprint only)."""
    changes = []
    if saved.get("tensors") and found.get("tensors") and saved["tensors"] != found["tensors"]:
        changes.append(f"its weights (fingerprint {saved['tensors']}, now {found['tensors']})")
    old, new = saved.get("config"), found.get("config")
    if old is not None and new is not None:
        changes += [f"{k} {old.get(k, 'unset')!r} -> {new.get(k, 'unset')!r}" for k in sorted(old.keys() | new.keys())
                    if old.get(k) != new.get(k)]
    old, new = saved.get("tokenizer"), found.get("tokenizer")
    if old is not None and new is not None:
        changes += [f"the tokenizer's {k}" for k in TOKENIZER_PARTS if old.get(k) != new.get(k)]
    return changes


def check_same_base(adapter_ckpt, adapter_path, found, base_path):
    """A LoRA adapter is a difference to ONE base, its weights, configuration and tokenizer: on another
    (retrained, reconfigured, another chat template) it means something else. Refuse it, naming what
    changed. found: base_identity's dict, or a tensors fingerprint alone."""
    found = found if isinstance(found, dict) else {"tensors": found}
    saved = {**(adapter_ckpt.get("base_identity") or {}), "tensors": adapter_ckpt.get("base_fingerprint")}
    changes = base_changes(saved, found)
    if changes:
        raise UserError(f"{adapter_path} was trained on another base than {base_path} holds now (changed: "
                        f"{'; '.join(changes)}): the base was retrained, edited or replaced; put the original base "
                        f"back, or train a new adapter on this one")


def dangling_link(path):
    """The first part of path (itself, or a folder on the way) that is a symbolic link to nothing, or
    None: a link into a disk that is not mounted is not a missing file, and never replaced by one."""
    parts, prefix = os.path.normpath(path).split(os.sep), ""
    for part in parts:
        prefix = os.path.join(prefix, part) if prefix or part else os.sep
        if not os.path.lexists(prefix):
            return None  # missing from here on: nothing further is a link
        if os.path.islink(prefix) and not os.path.exists(prefix):
            return prefix
    return None


def base_exists(path, what="base_ckpt"):
    """Whether the base at path is there; a dangling symbolic link (a disk not mounted) is refused by
    name, so that no script takes it for a missing base (train_grpo.py would train a new one over it).
    The one test every script makes of a base's path."""
    link = dangling_link(path)
    if link is not None:
        raise UserError(f"{what} {path}: {link} is a symbolic link to {os.readlink(link)}, which does "
                        "not exist (a disk not mounted?): mount it or mend the link; it is left as it is")
    return os.path.exists(path)


def resolve_base(ckpt, ckpt_path, given=""):
    """The base a GRPO checkpoint was trained on, found the same way by every script (sample, attribution,
    export, resume): `given` (--base_ckpt=PATH) if given; else where it was when the run started (its
    absolute path), as recorded (relative to the working directory), or relative to the project. The
    adapter is then checked against it (check_same_base), so a wrong base is refused, never used."""
    stored = ckpt.get("base_ckpt", "")
    if given:
        if not base_exists(given, "--base_ckpt"):
            raise UserError(f"--base_ckpt={given} not found (the base {ckpt_path} was trained on was {stored})")
        return given
    looked = [p for p in (ckpt.get("base_abspath"), stored, None if os.path.isabs(stored) else
                          os.path.join(PROJECT, stored)) if p]
    found = next((p for p in looked if os.path.exists(p)), None)
    for p in looked if found is None else ():  # a link to a disk not mounted: said so
        base_exists(p, f"the base that {ckpt_path} was trained on,")
    if found is None:
        where = ", ".join(dict.fromkeys(os.path.abspath(p) for p in looked))
        raise UserError(f"the base {stored} that {ckpt_path} was trained on is not found (looked at {where}): it was "
                        f"moved or deleted; put it back, or name where it is now with --base_ckpt=PATH")
    return found
