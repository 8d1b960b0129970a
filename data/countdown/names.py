"""
Where data/countdown/prepare.py and data/countdown/searched.py put a directory (one per set of
knobs, spelled in its name) and the command that builds one again. data/datadir.py names that
command when a directory is damaged.
"""
import os
import re
import shlex

ROOT = os.path.dirname(os.path.abspath(__file__))
SPLITS = ("train", "val", "test")
DEFAULTS = dict(n_train=20000, n_val=500, n_test=500, min_numbers=3, max_numbers=4, max_number=99,
                seed=1337, out=None)  # out None: data_dir_for(knobs)
SEARCHED_DEFAULTS = dict(n_numbers=3, max_number=12, max_target=100, max_misses=3, n_train=20000,
                         n_val=500, n_test=500, num_merges=300, seed=1337, variants=1,
                         pairs=0, check=False, ordered=False, closest=False, give_up=0.0)
NAME_KNOBS = (("n_train", "t"), ("n_val", "v"), ("n_test", "e"), ("num_merges", "b"), ("seed", "r"),
              ("variants", "k"), ("pairs", "p"), ("check", "c"), ("ordered", "o"),
              ("closest", "n"), ("give_up", "g"))


def data_dir_for(n_train=20000, n_val=500, n_test=500, min_numbers=3, max_numbers=4, max_number=99,
                 seed=1337):
    """prepare.py's directory: n{min_numbers}-{max_numbers}_m{max_number}, plus _t{n_train},
    _v{n_val}, _e{n_test}, _r{seed} when not the default."""
    knobs = (("t", "n_train", n_train), ("v", "n_val", n_val), ("e", "n_test", n_test),
             ("r", "seed", seed))
    extra = [f"_{letter}{v}" for letter, k, v in knobs if v != DEFAULTS[k]]
    return os.path.join(ROOT, f"n{min_numbers}-{max_numbers}_m{max_number}" + "".join(extra))


def searched_dir_for(n_numbers=3, max_number=12, max_target=100, max_misses=3, root=None, **extra):
    """searched.py's directory (under root, default ROOT); the split sizes, merges, seed,
    variants, pairs, check, ordered, closest and give_up are in the name when not the default
    (True as 1)."""
    name = f"search_n{n_numbers}_m{max_number}_x{max_target}_s{max_misses}"
    name += "".join(f"_{letter}{int(extra[k]) if isinstance(extra[k], bool) else extra[k]}"
                    for k, letter in NAME_KNOBS
                    if extra.get(k, SEARCHED_DEFAULTS[k]) != SEARCHED_DEFAULTS[k])
    return os.path.join(root or ROOT, name)


def is_searched(data_dir, meta=None):
    """Whether data_dir is searched.py's: its meta.json records n_numbers, or it is search_*."""
    return (isinstance(meta, dict) and "n_numbers" in meta) or \
        os.path.basename(os.path.normpath(data_dir)).startswith("search_")


def rebuild_command(data_dir, meta=None):
    """The command that builds data_dir again: its knobs from meta (its meta.json as read) or its
    name, --out where they would not put it. A searched-solution directory gets searched.py's
    command."""
    if is_searched(data_dir, meta):
        return searched_rebuild_command(data_dir)
    knobs = {k: v for k, v in DEFAULTS.items() if k != "out"}
    try:
        knobs.update({f"n_{k}": meta["sizes"][k] for k in SPLITS},
                     **{k: meta[k] for k in ("min_numbers", "max_numbers", "max_number", "seed")})
    except (KeyError, TypeError):
        name = os.path.basename(os.path.normpath(data_dir))
        m = re.fullmatch(r"n(\d+)-(\d+)_m(\d+)((?:_[tver]\d+)*)", name)
        if m:
            letters = {"t": "n_train", "v": "n_val", "e": "n_test", "r": "seed"}
            knobs.update(min_numbers=int(m[1]), max_numbers=int(m[2]), max_number=int(m[3]),
                         **{letters[x[0]]: int(x[1:]) for x in m[4].split("_")[1:]})
    args = [f"--{k}={v}" for k, v in knobs.items() if v != DEFAULTS[k]]
    if os.path.abspath(data_dir) != data_dir_for(**knobs):
        args.append(f"--out={data_dir}")
    return " ".join(["python data/countdown/prepare.py"] + [shlex.quote(a) for a in args])


def searched_rebuild_command(data_dir):
    """searched.py's command that builds data_dir again, from the knobs its name records."""
    m = re.fullmatch(r"search_n(\d+)_m(\d+)_x(\d+)_s(\d+)((?:_[tvebrkpcon]\d+|_g[\d.]+)*)",
                     os.path.basename(os.path.normpath(data_dir)))
    if not m:
        return "python data/countdown/searched.py with the knobs of the base that was trained on it"
    knobs = dict(zip(("n_numbers", "max_number", "max_target", "max_misses"),
                     map(int, m.groups()[:4])))
    letters = {letter: k for k, letter in NAME_KNOBS}
    for x in m[5].split("_")[1:]:  # a bool knob (its default False) is written as 1: "_c1"
        k = letters[x[0]]
        kind = type(SEARCHED_DEFAULTS[k])  # give_up a float: "_g0.5"
        knobs[k] = bool(int(x[1:])) if kind is bool else kind(x[1:])
    made = searched_dir_for(**knobs)
    where = "" if os.path.abspath(data_dir) == made else \
        f" (it writes {made}: move it to {data_dir})"
    args = [shlex.quote(f"--{k}={v}") for k, v in knobs.items()]
    return " ".join(["python data/countdown/searched.py"] + args) + where
