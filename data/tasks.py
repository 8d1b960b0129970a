"""
The tasks a GRPO run can train on (config key `task`): where the data comes from, which rewards
score a completion by default, and which of them says "correct" (logged accuracy, test accuracy).

    arith      the tiny GPT's synthetic arithmetic (data/gsm_synth/prepare.py), answers '#### N'
    gsm8k      GSM8K from the official JSONL files you download (data/gsm8k/prepare.py), '#### N'
    countdown  Countdown, generated offline (data/countdown/prepare.py), <think>...</think><answer>EXPR</answer>

Every task's data directory holds train / val / test .jsonl rows {question, solution, answer}. The
questions of gsm8k and countdown carry their own instruction; arith's do not (the tiny GPT learned
the format from examples), so an instruct model gets data/gsm_synth's CHAT_INSTRUCTION added.
"""
import os
import re

from configurator import UserError, named
from data.countdown import searched
from data.datadir import load_split
from data.gsm_synth.names import DEFAULTS as SYNTH_DEFAULTS, ROOT as SYNTH_ROOT, data_dir_for
from data.gsm_synth.names import knobs_from_name
from data.gsm_synth.prepare import BASE_KEYS as ARITH_KEYS, check_knobs as check_arith
from data.gsm_synth.prepare import prepare as prepare_synth

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this copy of the project

TASKS = {  # reward functions and weights by default, and the one that says "correct"
    "arith": dict(rewards=("correctness", "format"), weights=(1.0, 0.1), correct="correctness"),
    "gsm8k": dict(rewards=("gsm8k", "format"), weights=(1.0, 0.1), correct="gsm8k"),
    "countdown": dict(rewards=("countdown", "think_format"), weights=(1.0, 0.1), correct="countdown"),
}


def task_rewards(cfg):
    """(reward function names, weights) of a run: the config's, or where it names none, its task's
    (and their weights, unless it gives them)."""
    task = TASKS[cfg.get("task", "arith")]
    if not cfg["reward_funcs"]:
        return tuple(task["rewards"]), tuple(cfg["reward_weights"] or task["weights"])
    return tuple(cfg["reward_funcs"]), tuple(cfg["reward_weights"])


def task_data(task, data_dir=""):
    """The task's data directory: the one given, or the task's default (built offline if missing;
    gsm8k's from the downloaded files, see data/gsm8k/prepare.py)."""
    if data_dir:
        return data_dir
    if task == "gsm8k":
        from data.gsm8k.prepare import prepare
    elif task == "countdown":
        from data.countdown.prepare import prepare
    elif task == "arith":
        prepare = prepare_synth
    else:
        raise UserError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    return prepare()


# train_base.py's data knobs: {task: {prepare.py's knob: the config key}} (n_train is both tasks')
BASE_KEYS = {"arith": ARITH_KEYS, "countdown": searched.BASE_KEYS}


def check_base_knobs(cfg, defaults):
    """train_base.py's data knobs, before any work: one set away from its default that the task does
    not read (countdown_variants with task='arith') is refused, and the task's own are checked as
    its prepare.py checks them, each error naming the config key."""
    task = cfg["task"]
    for other, keys in BASE_KEYS.items():
        for key in sorted(set(keys.values()) - set(BASE_KEYS[task].values())):
            if cfg[key] != defaults[key]:
                raise UserError(f"{named(cfg, key)} does nothing with "
                                f"task={task!r} (only task={other!r} reads it): remove it, or give "
                                f"--task={other}")
    knobs = {k: cfg[key] for k, key in BASE_KEYS[task].items()}
    if task == "countdown":
        d = searched.DEFAULTS
        searched.check_knobs(**knobs, n_val=d["n_val"], n_test=d["n_test"],
                             num_merges=d["num_merges"], keys=BASE_KEYS[task])
    else:
        d = SYNTH_DEFAULTS
        check_arith(**knobs, n_val=d["n_val"], n_test=d["n_test"], keys=BASE_KEYS[task])


def base_data(cfg, verbose=True):
    """train_base.py's task data for its knobs (built if missing); errors name its config keys."""
    knobs = {k: cfg[key] for k, key in BASE_KEYS[cfg["task"]].items()}
    prepare = searched.prepare if cfg["task"] == "countdown" else prepare_synth
    return prepare(**knobs, verbose=verbose, keys=BASE_KEYS[cfg["task"]])


def portable_path(data_dir):
    """A data directory as a checkpoint records it: relative to the project root when it lies inside it
    ('data/gsm_synth/s2_m20_as_n0'), so that a second copy of the project reads its own data; else absolute."""
    if not data_dir:
        return data_dir
    rel = os.path.relpath(os.path.abspath(data_dir), PROJECT)
    return os.path.abspath(data_dir) if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def resolve_data_dir(stored):
    """The data directory a checkpoint or a saved config records, in this copy of the project: a relative one
    against the project root (never the working directory); an absolute one as it is, unless it is another
    copy's task data (<project>/data/<task>/<dir>, older checkpoints): then this copy's. A missing
    data/gsm_synth directory is built again from the knobs in its name (prepare.py is deterministic); any
    other missing one is named, with the command that builds it, when its files are read."""
    if not stored:
        return stored
    path = os.path.join(PROJECT, stored) if not os.path.isabs(stored) else stored
    other = re.fullmatch(r"(.*)/data/(gsm_synth|gsm8k|countdown)/([^/]+)/?", path.replace(os.sep, "/"))
    if other and os.path.normpath(other[1]) != PROJECT and (
            not os.path.exists(path) or os.path.isfile(os.path.join(other[1], "data", other[2], "prepare.py"))):
        path = os.path.join(PROJECT, "data", other[2], other[3])
    path = os.path.normpath(path)
    knobs = knobs_from_name(path)
    if not os.path.exists(path) and os.path.dirname(path) == SYNTH_ROOT and knobs and data_dir_for(**knobs) == path:
        prepare_synth(**knobs)  # the same directory, byte for byte
    return path


def load_task_split(data_dir, split):
    """The split's rows, answers hashable (a countdown answer [numbers, target] becomes a tuple: the
    reward cache keys on it)."""
    freeze = lambda a: tuple(freeze(x) for x in a) if isinstance(a, list) else a  # noqa: E731
    return [{**r, "answer": freeze(r["answer"])} for r in load_split(data_dir, split)]


def set_instruction(enc, task):
    """Questions of gsm8k and countdown carry their instruction: an instruct model's user turn is the
    question alone (data/prompts.encode_prompt reads enc.instruction)."""
    if task != "arith":
        enc.instruction = ""
    return enc
