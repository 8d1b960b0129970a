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
from configurator import UserError
from data.gsm_synth.prepare import load_split

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
        from data.gsm_synth.prepare import prepare
    else:
        raise UserError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    return prepare()


def load_task_split(data_dir, split):
    """The split's rows, answers hashable (a countdown answer [numbers, target] becomes a tuple: the
    reward cache keys on it)."""
    freeze = lambda a: tuple(freeze(x) for x in a) if isinstance(a, list) else a  # noqa: E731
    return [{**r, "answer": freeze(r["answer"])} for r in load_split(data_dir, split)]


def set_instruction(enc, task):
    """Questions of gsm8k and countdown carry their instruction: an instruct model's user turn is the
    question alone (data.gsm_synth.prepare.encode_prompt reads enc.instruction)."""
    if task != "arith":
        enc.instruction = ""
    return enc
