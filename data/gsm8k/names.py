"""
Where data/gsm8k/prepare.py puts a directory (n_val and seed in its name) and the command that
builds one again from the official files. data/datadir.py names that command when a directory is
damaged.
"""
import os
import re
import shlex

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = dict(train_file=os.path.join(ROOT, "train.jsonl"),
                test_file=os.path.join(ROOT, "test.jsonl"),
                n_val=500, seed=1337, out=None)  # out None: ROOT/prepared (a suffix per other knob)


def data_dir_for(n_val=500, seed=1337):
    """ROOT/prepared, with _v{n_val} / _r{seed} when not the default, so two sets of knobs never
    share it."""
    extra = [f"_{k}{v}" for k, v, default in (("v", n_val, 500), ("r", seed, 1337)) if v != default]
    return os.path.join(ROOT, "prepared" + "".join(extra))


def rebuild_command(data_dir, meta=None):
    """The command that builds data_dir again from the official files (data/gsm8k/*.jsonl): n_val
    and seed from meta (its meta.json as read) or its name, --out where they would not put it."""
    try:
        knobs = {"n_val": meta["n_val"], "seed": meta["seed"]}
    except (KeyError, TypeError):
        name = os.path.basename(os.path.normpath(data_dir))
        m = re.fullmatch(r"prepared(?:_v(\d+))?(?:_r(\d+))?", name)
        knobs = {"n_val": int(m[1] or 500), "seed": int(m[2] or 1337)} if m else \
            {"n_val": 500, "seed": 1337}
    args = [f"--{k}={v}" for k, v in knobs.items() if v != DEFAULTS[k]]
    if os.path.abspath(data_dir) != data_dir_for(**knobs):
        args.append(f"--out={data_dir}")
    return " ".join(["python data/gsm8k/prepare.py"] + [shlex.quote(a) for a in args])
