"""
Curriculum by difficulty for GRPO: training problems are drawn from easy to hard, and the run moves
to the next level when its moving training accuracy passes a threshold.

    python train_grpo.py config/hard_curriculum.py          # curriculum = "1:10,2:10,3:10,3:20"

A level is `steps:max_operand` (data/gsm_synth/prepare.py's knobs): problems with that many
operations, operands up to max_operand. Problems are generated on the fly by prepare.make_problem
from the run's own prompt stream (so they are checkpointed and resumed with it) and encoded by the
base's byte-level tokenizer, which encodes any text. The LAST level is the target: the test set is
eval_n problems of that level (at most as many as the data's test split holds, as without a
curriculum), the same for every seed and for a one-level curriculum, which is
the no-curriculum baseline on the same task ("3:20").

Why it can help: GRPO learns only from groups whose rewards differ. On problems the policy almost
never solves, nearly every group is all-wrong (frac_reward_zero_std near 1) and the step is
wasted; on easier problems the groups are mixed and the gradient is informative.
"""
import random

from configurator import UserError
from data.datadir import MAX_ROWS, read_meta
from data.gsm_synth.prepare import MAX_STEPS, TEMPLATES, count_problems, distinct_problems
from data.gsm_synth.prepare import make_problem
from scale import distributed

TEST_SEED = 20240601  # the target level's test problems: one fixed set, whatever the run's seed


def parse_levels(text):
    """'1:20,2:20,3:20' -> [(1, 20), (2, 20), (3, 20)]; '' -> [] (no curriculum)."""
    levels = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            steps, max_operand = (int(x) for x in part.split(":"))
        except ValueError:
            steps = max_operand = 0
        if not 1 <= steps <= MAX_STEPS or max_operand < 1:
            raise UserError(f"config key 'curriculum' = {text!r} is not allowed: levels are steps:max_operand "
                            f"with steps in [1, {MAX_STEPS}], max_operand >= 1, easy to hard, e.g. "
                            f"'1:20,2:20,3:20' ('' = off)")
        levels.append((steps, max_operand))
    return levels


def most_test_problems(levels):
    """The most test problems the last level can give (eval_n's bound, checked before any work): its
    distinct problems with every operation, at most MAX_ROWS."""
    steps, max_operand = levels[-1]
    return min(count_problems(steps, max_operand, "".join(TEMPLATES)), MAX_ROWS)


def from_config(cfg, data_dir, encode, block_size, train_split):
    """train_grpo.py's Curriculum and its test set, or (None, None) with cfg['curriculum'] = ''.
    Every level must fit the context; the test problems are not base training questions. encode: a
    question -> the prompt's token ids, as the run encodes it (data/prompts.encode_prompt with the base's
    tokenizer)."""
    levels = parse_levels(cfg["curriculum"])
    if not levels:
        return None, None
    try:  # the operators of the run's data: a data/gsm_synth directory's meta.json says them
        meta = read_meta(data_dir)
        ops, why = meta.get("ops"), "names no operators ('ops')"
    except (OSError, ValueError) as e:
        ops, why = None, f"cannot be read ({getattr(e, 'strerror', None) or e})"
    if not (isinstance(ops, str) and ops and set(ops) <= set("+-*/")):
        raise UserError(f"curriculum: {data_dir}/meta.json {why}: a curriculum draws arith problems, "
                        "so it needs a data/gsm_synth directory (python data/gsm_synth/prepare.py)")
    c = Curriculum(levels, ops, cfg["curriculum_threshold"], cfg["curriculum_window"])
    c.check_fits(lambda q: len(encode(q)), block_size - cfg["max_new_tokens"])
    # eval_n bounded as without a curriculum, by the size of the data's test split: each of
    # eval_n=10**6 problems would be generated greedily at every evaluation (about an hour)
    n = min(cfg["eval_n"], meta["sizes"]["test"])
    if n < cfg["eval_n"]:
        distributed.print0(f"curriculum: eval_n={cfg['eval_n']} bounded by the test split's "
                           f"size, as without a curriculum: {n} test problems")
    return c, c.test_set(n, {e["question"] for e in train_split})


class Curriculum:
    """The current level, and the training accuracies seen at it (the moving window)."""

    def __init__(self, levels, ops, threshold, window):
        self.levels, self.ops, self.threshold, self.window = levels, ops, threshold, window
        self.level, self.recent = 0, []

    def draw(self, rng):
        """One problem of the current level, from the run's prompt stream `rng`."""
        steps, max_operand = self.levels[self.level]
        question, solution, answer = make_problem(rng, steps, max_operand, self.ops)
        return {"question": question, "solution": solution, "answer": answer}

    def observe(self, accuracy):
        """After a step: record its training accuracy; move up a level when the mean of the last
        `window` steps at this level reaches the threshold. Returns True when it moved."""
        if accuracy != accuracy or self.level == len(self.levels) - 1:  # NaN (skipped step), or the top
            return False
        self.recent = (self.recent + [accuracy])[-self.window:]
        if len(self.recent) == self.window and sum(self.recent) / self.window >= self.threshold:
            self.level, self.recent = self.level + 1, []
            return True
        return False

    def check_fits(self, prompt_tokens, room):
        """Refuse, before any work, a level whose prompts do not fit: the longest of 500 drawn (a
        fixed stream) must leave the completion `room` tokens. prompt_tokens: question -> length."""
        for steps, max_operand in self.levels:
            rng = random.Random(TEST_SEED + steps)
            longest = max(prompt_tokens(make_problem(rng, steps, max_operand, self.ops)[0]) for _ in range(500))
            if longest > room:
                raise UserError(f"curriculum level {steps}:{max_operand} does not fit the base's context: its prompts "
                                f"reach {longest} tokens, only {room} fit beside max_new_tokens; use fewer steps or "
                                f"smaller operands in that level, or lower max_new_tokens")

    def after_step(self, log, it, verbose=True):
        """Log the level step `it` trained at (a one-level run logs none), then perhaps move up
        (printed where verbose: one process of several)."""
        if len(self.levels) > 1:
            log["curriculum/level"] = self.level + 1
            if self.observe(log.get("accuracy", float("nan"))) and verbose:
                print(f"curriculum: {self.describe()} from iter {it}")
            log["curriculum/moving_accuracy"] = self.moving_accuracy()

    def moving_accuracy(self):
        return sum(self.recent) / len(self.recent) if self.recent else float("nan")

    def describe(self):
        steps, max_operand = self.levels[self.level]
        return f"level {self.level + 1}/{len(self.levels)} ({steps}-step problems, operands <= {max_operand})"

    def test_set(self, n, exclude=()):
        """n distinct problems of the target (last) level, none of whose questions is in `exclude`
        (the base's training questions)."""
        steps, max_operand = self.levels[-1]
        rng = random.Random(TEST_SEED)
        out = distinct_problems(n, lambda: make_problem(rng, steps, max_operand, self.ops), exclude)
        if len(out) == n:
            return out
        raise UserError(f"only {len(out)} distinct test problems at curriculum level {steps}:{max_operand}; "
                        f"lower eval_n or raise the last level's max_operand")

    def state_dict(self):
        return {"level": self.level, "recent": list(self.recent)}

    def load_state_dict(self, state, verbose=True):
        """A checkpoint's level and window; None (the run had no curriculum) or a level this
        curriculum does not have: its first level, said in one line (where verbose)."""
        if state is None or state["level"] >= len(self.levels):
            if verbose:
                print(f"curriculum: the checkpoint's level does not exist in this curriculum; {self.describe()}")
            return
        self.level, self.recent = state["level"], list(state["recent"])
