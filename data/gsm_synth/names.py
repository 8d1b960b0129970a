"""
Where data/gsm_synth/prepare.py puts a directory (one per set of knobs, spelled in its name) and the
command that builds one again. data/datadir.py names that command when a directory is damaged.
"""
import os
import re
import shlex

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = dict(steps=2, max_operand=20, ops="+-", noise=0.0, n_train=20000, n_val=500, n_test=500,
                num_merges=150, seed=1337, min_steps=0, root=ROOT)
SPLITS = ("train", "val", "test")
# knobs that change the data but are not in the directory name at their defaults (letter in the
# name)
EXTRA_KNOBS = (("n_train", "t"), ("n_val", "v"), ("n_test", "e"), ("num_merges", "b"),
               ("seed", "r"), ("min_steps", "l"))


def data_dir_for(steps, max_operand, ops, noise=0.0, root=ROOT, **extra):
    """One directory per set of knobs, so two sets never share (or silently reuse) a directory:
    s{steps}_m{max_operand}_{ops}_n{noise %}, plus _t{n_train}, _v{n_val}, ... when not the
    default."""
    safe_ops = ops.replace("+", "a").replace("-", "s").replace("*", "m").replace("/", "d")
    name = f"s{steps}_m{max_operand}_{safe_ops}_n{noise * 100:.10g}"
    name += "".join(f"_{letter}{extra[k]}" for k, letter in EXTRA_KNOBS
                    if extra.get(k, DEFAULTS[k]) != DEFAULTS[k])
    return os.path.join(root, name)


def knobs_from_name(data_dir):
    """The knobs data_dir_for() spelled in the directory's name ({} if the name is not one of
    its)."""
    name = os.path.basename(os.path.normpath(data_dir))
    m = re.fullmatch(r"s(\d+)_m(\d+)_([asmd]+)_n([\d.e-]+)((?:_[tvebrl]\d+)*)", name)
    if not m:
        return {}
    letters = {letter: k for k, letter in EXTRA_KNOBS}
    ops = m[3].translate(str.maketrans("asmd", "+-*/"))
    return dict(steps=int(m[1]), max_operand=int(m[2]), ops=ops, noise=float(m[4]) / 100,
                **{letters[x[0]]: int(x[1:]) for x in m[5].split("_")[1:]})


def rebuild_command(data_dir, meta=None):
    """The command line that builds data_dir again, byte for byte: its knobs from meta (its
    meta.json as read, None if unreadable), or from its name when meta lacks them."""
    named = knobs_from_name(data_dir)
    try:
        knobs = {k: meta[k] for k in ("steps", "max_operand", "ops", "noise")}
        knobs.update({f"n_{k}": meta["sizes"][k] for k in SPLITS}, seed=meta["seed"],
                     min_steps=meta.get("min_steps", 0))
        # the merges ASKED for (meta.json records a non-default number; older ones: the name's
        # _b), never the number learned (vocab_size - 257), which a small training split leaves
        # below it
        asked = named.get("num_merges", DEFAULTS["num_merges"])
        knobs["num_merges"] = meta.get("num_merges", asked)
    except (KeyError, TypeError, AttributeError):
        if not named:
            return "python data/gsm_synth/prepare.py with the knobs of the run that made it"
        knobs = named
    root = os.path.dirname(os.path.abspath(data_dir))
    knobs["root"] = root if root != ROOT else None
    args = [shlex.quote(f"--{k}={v}") for k, v in knobs.items()
            if k in ("steps", "max_operand", "ops", "noise") or v not in (None, DEFAULTS[k])]
    return " ".join(["python data/gsm_synth/prepare.py"] + args)
