"""
The checks of train_grpo.py's knobs, run before any work or any file is written: one line naming the key,
the value and what is allowed (a typo'd key or a wrong type is caught earlier, by configurator.configure).
Where it plugs in: train_grpo.main calls validate(cfg) once, after the config is read (and a resumed run's
merged in). It refuses and changes nothing: the script fills in the task's reward functions itself.
The rules the lecture's records state (grpo.StepKnobs, grpo.LossKnobs, tracin.TracInKnobs: RULES;
tracin.capture_problem) are said here by the config key that sets each field (check_rules).
"""
import math
import os

from configurator import FLOAT32_MAX, UserError, check, check_adam_lr, check_choice, check_decay, check_finite, \
    check_nonnegative, check_positive, read_config_file
from checks.base_knobs import check_kv_cache
from data.curriculum import most_test_problems, parse_levels
from data.datadir import check_task_data
from data.prompts import encode_prompt
from data.tasks import TASKS, resolve_data_dir, task_rewards
from grpo import LossKnobs, StepKnobs
from runs.checkpoint import load_checkpoint
from rewards import REWARD_FUNCS
from model import MIN_TEMPERATURE
from runs.base import base_exists
from runs.loading import check_lora_targets
from scale import compiled, distributed
from tracin import TracInKnobs, capture_problem


def validate(cfg):
    """Every knob, before any work or any file is written: one line naming the key, the value and
    what is allowed (a typo'd key or a wrong type is caught earlier, by configure)."""
    check(cfg, "out_dir", cfg["out_dir"] != "", "give a directory, e.g. --out_dir=out/grpo")
    check_finite(cfg, "grad_clip")
    check(cfg, "base_ckpt", cfg["base_ckpt"] != "", "give the base checkpoint, e.g. --base_ckpt=out/base/ckpt.pt")
    base_dir = os.path.dirname(cfg["base_ckpt"]) if cfg["base_ckpt"].endswith(".pt") else cfg["base_ckpt"]
    check(cfg, "out_dir", os.path.realpath(cfg["out_dir"]) != os.path.realpath(base_dir or "."),
          f"is the base's directory: the run's ckpt.pt would replace {cfg['base_ckpt']} (or the model's "
          "files); give another directory, e.g. --out_dir=out/grpo")
    check_choice(cfg, "init_from", ("base", "resume"))
    check_positive(cfg, "batch_size", "learning_rate", "log_interval", "eval_interval", "eval_n", "eval_k",
                   "ckpt_interval", "max_skipped_steps", "lora_r", "lora_alpha", "tracin_val_batch_size",
                   "curriculum_window")
    check_nonnegative(cfg, "max_iters", "min_lr", "warmup_iters", "lr_decay_iters", "weight_decay")
    check_adam_lr(cfg, 0.9, "learning_rate", "min_lr")  # train_grpo's AdamW: torch's beta1, 0.9
    check_decay(cfg)
    check_rules(cfg, StepKnobs)
    check_rules(cfg, LossKnobs)
    check_rules(cfg, TracInKnobs, prefix="tracin_")
    world = distributed.launched_world_size()  # checked before any process group
    even = f"must split evenly over the {world} processes"
    check(cfg, "batch_size", distributed.splits_evenly(cfg["batch_size"], world), even)
    check(cfg, "tracin_val_batch_size", not cfg["tracin"] or
          distributed.splits_evenly(cfg["tracin_val_batch_size"], world), even)
    n = cfg["batch_size"] * cfg["group_size"]
    check(cfg, "micro_batch_size", cfg["micro_batch_size"] >= n or n % cfg["micro_batch_size"] == 0,
          f"batch_size*group_size = {n} completions must divide into micro-batches of this size")
    check(cfg, "temperature", cfg["temperature"] > 0, "must be > 0 in GRPO: with greedy sampling (0) every "
          "completion of a group is the same, every advantage is 0 and nothing can be learned")
    check(cfg, "temperature", cfg["temperature"] >= MIN_TEMPERATURE,
          f"must be >= {MIN_TEMPERATURE}: below it logits / temperature and the log-probs' "
          "gradients overflow float32 (NaN steps)")
    check(cfg, "top_k", cfg["top_k"] >= 0, "must be >= 0 (0 = off)")
    check(cfg, "top_p", 0 < cfg["top_p"] <= 1, "must be in (0, 1] (1 = off)")
    check(cfg, "lora_dropout", 0 <= cfg["lora_dropout"] < 1, "must be in [0, 1)")
    check(cfg, "defect_frac", 0 <= cfg["defect_frac"] <= 1, "must be in [0, 1]")
    levels = parse_levels(cfg["curriculum"])  # a bad level list is an error here, before any work
    most = most_test_problems(levels) if levels else cfg["eval_n"]
    last = ":".join(map(str, levels[-1])) if levels else ""
    check(cfg, "eval_n", cfg["eval_n"] <= most, f"at most {most} with this curriculum (the "
          f"distinct problems its last level {last} can give as a test set)")
    check(cfg, "defect_frac", cfg["defect_frac"] == 0 or not levels,
          "must be 0 with a curriculum: the planted wrong answers belong to the base's train split")
    check(cfg, "curriculum_threshold", 0 < cfg["curriculum_threshold"] <= 1, "must be in (0, 1]")
    capture = (cfg["num_iterations"], cfg["grad_checkpoint"], cfg["lora_dropout"])
    problem = capture_problem(*capture) if cfg["tracin"] else None  # what the hooks rely on
    if problem:
        key, why = problem
        if key is None:  # two knobs together: named in the message itself
            raise UserError(why)
        check(cfg, key, False, why)
    check_choice(cfg, "tracin_val_loss", ("pg", "nll"))
    check_choice(cfg, "task", tuple(TASKS))
    own = ""  # a train_base.py base's own data directory (none yet: it will be trained)
    if cfg["base_ckpt"].endswith(".pt"):  # a train_base.py base knows one task: the one it was (or will be) trained on
        trained_on, own = base_task(cfg["base_ckpt"], cfg["base_config"])
        check(cfg, "task", cfg["task"] == trained_on, f"must be {trained_on!r}, the task of the base "
              f"{cfg['base_ckpt']} (another task needs a base trained on it, or a Hugging Face model directory)")
    check(cfg, "task", cfg["task"] == "arith" or not levels,
          "must be 'arith' with a curriculum (its levels are arith problems)")
    check(cfg, "task", cfg["task"] in ("arith", "countdown") or not cfg["defect_frac"],
          "must be 'arith' or 'countdown' with a planted defect (data/defect.planted_answer)")
    given = cfg["data_dir"] and os.path.abspath(cfg["data_dir"])
    if own and given and given != os.path.abspath(own):  # (runs/loading.load_base says so too)
        raise UserError(f"data_dir={cfg['data_dir']} is for a Hugging Face base directory; the base "
                        f"checkpoint {cfg['base_ckpt']} was trained on its own task data ({own}): "
                        "leave data_dir ''")
    # (and a resumed run's: another task's data put in its place)
    check_task_data(cfg["data_dir"], cfg["task"], base=cfg["base_ckpt"] if own else "")
    funcs, weights = task_rewards(cfg)  # () = the task's (train_grpo.main fills them in so)
    names = all(isinstance(f, str) and f in REWARD_FUNCS for f in funcs)  # (a nested list: no name)
    check(cfg, "reward_funcs", len(funcs) > 0 and names and len(set(funcs)) == len(funcs),
          f"a non-empty list of distinct names from {sorted(REWARD_FUNCS)}")
    numbers = all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
                  for w in weights)
    check(cfg, "reward_weights", len(weights) == len(funcs) and numbers,
          f"one finite number per reward function ({len(funcs)}: {', '.join(funcs)})")
    # rewards lie in [-1, 1]: the weighted sum, and its square in the group's std, must fit a float32
    check(cfg, "reward_weights", sum(abs(w) for w in weights) <= 1e18,
          "must add up (in absolute value) to at most 1e18: a larger reward overflows float32")
    check(cfg, "lora_targets", len(cfg["lora_targets"]) > 0, "name at least one layer, e.g. ('c_attn',)")
    check_lora_targets(cfg["lora_targets"])
    auto = cfg["compile"] == "auto"
    check(cfg, "compile", auto or any(cfg["compile"] is c for c in (None, True, False)),  # not 1 == True
          "must be True, False or 'auto' (None: on a GPU where it pays, scale/compiled.choose)")
    if cfg["compile"] is True:  # torch.compile and a C++ compiler where it runs on CPU (scale/compiled.py)
        compiled.check_compile(cfg["device"])
    check_lora_scaling(cfg)


def check_rules(cfg, record, prefix=""):
    """The rules a lecture record states (record.RULES, asserted when one is made), each said by the
    config key that sets its field: prefix + field."""
    for field, (holds, why) in record.RULES.items():
        check(cfg, prefix + field, holds(cfg[prefix + field]), why)


def base_task(base_ckpt, base_config):
    """(task, data directory) a train_base.py checkpoint was trained on; a missing one will be trained
    with base_config (its task, and no directory yet: '')."""
    if base_exists(base_ckpt) and os.path.isfile(base_ckpt):
        ckpt = load_checkpoint(base_ckpt)
        return ckpt.get("config", {}).get("task", "arith"), resolve_data_dir(ckpt.get("data_dir", ""))
    config = read_config_file(base_config) if os.path.isfile(base_config) else {}
    return config.get("task", "arith"), ""


def step_knobs(cfg, lr):
    """The knobs whose size a diverging adapter (steps skipped for NaN/Inf) can come from, with their
    values: the learning rate, the adapter's scaling lora_alpha / lora_r (its output grows with it)
    and the KL weight beta (a huge one overflows the loss); no setting of one fixes another's."""
    scaling = f"lora_alpha / lora_r ({cfg['lora_alpha']} / {cfg['lora_r']}, the adapter's scaling)"
    beta = f" or beta ({cfg['beta']:g}, the KL weight)" if cfg["beta"] else ""
    return f"learning_rate ({lr:.1e}), {scaling}{beta}"


def check_rewards_read(cfg, answer):
    """Each reward function must read this task's answers (`answer`, one of them, is tried): one that
    cannot (countdown's on an arith number) would score nothing, every step, without a word."""
    for name in cfg["reward_funcs"]:
        try:
            REWARD_FUNCS[name]("", answer)
        except Exception as e:  # noqa: BLE001 (whatever it raises, it raises at every step)
            raise UserError(f"config key 'reward_funcs': {name} cannot score the {cfg['task']} task's "
                            f"answers ({type(e).__name__}: {str(e)[:80]}); give this task's, e.g. "
                            f"{TASKS[cfg['task']]['rewards']}") from None


def check_sampling_cache(cfg, model, longest, eval_batch):
    """Sampling's KV cache, this process's rollouts (TracIn 'pg': the training and validation
    prompts, sampled in one call; or an evaluation chunk's eval_k samples each, if more) x the
    longest prompt + max_new_tokens, allocated once before iteration 0; with the decode step compiled,
    the training rollouts' static cache of that length's bucket beside it (scale/compiled.py)."""
    pg = cfg["tracin"] and cfg["tracin_val_loss"] == "pg"
    prompts = cfg["batch_size"] + (cfg["tracin_val_batch_size"] if pg else 0)
    mine = -(-prompts // distributed.launched_world_size())  # rank 0's share, the largest
    length = longest + cfg["max_new_tokens"]
    sampled, evaluated = mine * cfg["group_size"], min(eval_batch, cfg["eval_n"]) * cfg["eval_k"]
    # the decode step compiled (compile=True, or auto on a GPU: compiled.choose) samples over a static
    # cache of the length's bucket, held beside the prefill cache; evaluation samples eagerly
    on = cfg["compile"] is True or (cfg["compile"] is not False and cfg["device"].startswith("cuda"))
    static = compiled.bucket(length, model.config.block_size) if on else 0
    rows, columns = max((sampled, length + static), (evaluated, length), key=lambda rc: rc[0] * rc[1])
    beside = static and columns == length + static  # the training sampling's caches are the larger
    what = "sampling's + the compiled step's static" if beside else "sampling's"
    fix = "lower batch_size (or tracin_val_batch_size) x group_size, or eval_k (or max_new_tokens)"
    fix += ", or set compile=False" if beside else ""
    check_kv_cache(model, rows, columns, cfg["device"], what, fix)


def check_lora_scaling(cfg):
    """The adapter's scaling lora_alpha / lora_r multiplies its output in float32 (lora.py): above the
    largest float32 it is Inf, and Inf times the adapter's zero-initialised B is NaN in every step."""
    scaling, largest = cfg["lora_alpha"] / cfg["lora_r"], FLOAT32_MAX
    check(cfg, "lora_alpha", scaling <= largest, f"over lora_r = {cfg['lora_r']} gives the adapter's scaling "
          f"{scaling:.3g}, more than float32 holds ({largest:.3g}): no update could be finite; "
          f"give lora_alpha / lora_r of at most {largest:.3g}")


def check_question_lengths(cfg, model, enc, splits, data_dir):
    """Every prompt + max_new_tokens must fit the base's context: a question that fills the context
    alone is refused by its line, else max_new_tokens by the longest question. Returns that length."""
    lengths = ((len(encode_prompt(enc, e["question"])), s, n + 1)
               for s, rows in splits.items() for n, e in enumerate(rows))
    longest, split, line = max(lengths)
    block = model.config.block_size
    question = splits[split][line - 1]["question"]
    where = f"line {line} of {os.path.join(data_dir, split + '.jsonl')} ({question[:50]!r}...)"
    if longest >= block:  # no max_new_tokens could help: the question itself is at fault
        raise UserError(f"the question at {where} is {longest} tokens, the base's whole context {block}: "
                        "remove it")
    if longest + cfg["max_new_tokens"] > block:
        raise UserError(f"config key 'max_new_tokens' = {cfg['max_new_tokens']} is not allowed: the longest "
                        f"question, {longest} tokens at {where}, + max_new_tokens must fit the base's context "
                        f"of {block}: give at most {block - longest}, or remove that question")
    return longest
