"""Reward functions for GRPO on synthetic GSM8K-style arithmetic.

A completion looks like:

    12+5=17
    17-3=14
    #### 14

(the end-of-text token already stripped). Reference answers are ints.
Every reward function has the signature ``fn(completion, answer) -> float`` so
that new ones can be added to ``REWARD_FUNCS`` and selected by name from the
config without touching the training loop.
"""

import re

# The number after the final "####". Only horizontal whitespace may separate it
# from the marker, so a number on a *later* line is not taken as the answer.
# Thousands commas must be well grouped ("1,234", not "12,34") so that a stray
# comma list like "1,2,3" is not silently read as 123.
_ANSWER_RE = re.compile(r"[ \t]*([+-]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?")

# A well-formed final line: "#### <integer>" at the start of a line and at the
# end of the text (trailing whitespace/newlines allowed). Deliberately stricter
# than extract_answer: no commas, no "+", no decimals, no trailing words, so
# the format reward pushes the model towards one canonical output shape.
_FORMAT_RE = re.compile(r"(?m)^####[ \t]+-?\d+\s*\Z")

# Completions up to this many characters get no length penalty. The synthetic
# problems need a few short equations plus the answer line, which fits in 64.
LENGTH_TARGET = 64


def extract_answer(text: str) -> int | None:
    """Return the integer after the LAST '####' marker, or None.

    Accepts signs, thousands commas, surrounding spaces, trailing words
    ("#### 14 apples" -> 14) and whole decimals ("14.0" -> 14); a fractional
    answer ("14.5") is not an integer, so None. Never raises on a str.
    """
    marker = text.rfind("####")  # last marker wins: earlier ones may be drafts
    if marker < 0:
        return None
    m = _ANSWER_RE.match(text, marker + 4)
    if m is None:
        return None
    sign, digits, frac = m.groups()
    if frac is not None and frac.strip("0"):
        return None  # a real fraction; compare digits, not floats, to stay exact
    try:
        value = int(digits.replace(",", ""))
    except ValueError:  # e.g. Python's limit on very long digit strings
        return None
    return -value if sign == "-" else value


def correctness_reward(completion: str, answer: int) -> float:
    """1.0 if the extracted final answer equals the reference, else 0.0."""
    return 1.0 if extract_answer(completion) == answer else 0.0


def format_reward(completion: str, answer: int) -> float:
    """1.0 if the text ends with a '#### <integer>' line and has exactly one
    '####', else 0.0. Independent of correctness, so early in training the
    model is rewarded for learning the output shape before it can do the math.
    """
    if completion.count("####") != 1:
        return 0.0
    return 1.0 if _FORMAT_RE.search(completion) else 0.0


def length_reward(completion: str, answer: int) -> float:
    """Mild penalty for rambling: 0.0 up to LENGTH_TARGET characters, then
    linearly down to -1.0 at 4 * LENGTH_TARGET, clamped there.

    Never positive, so it cannot reward short wrong answers on its own; it only
    breaks ties between completions that are otherwise scored the same.
    """
    excess = len(completion) - LENGTH_TARGET
    if excess <= 0:
        return 0.0
    return -min(1.0, excess / (3 * LENGTH_TARGET))


CACHE_SIZE = 200_000  # entries of a reward cache before it is emptied

REWARD_FUNCS = {
    "correctness": correctness_reward,
    "format": format_reward,
    "length": length_reward,
}


def compute_rewards(
    completions: list[str],
    answers: list[int],
    reward_funcs: list[str],
    reward_weights: list[float],
    cache: dict | None = None,
) -> tuple[list[float], dict[str, list[float]], dict[str, int]]:
    """Score every completion with every named reward function.

    Returns (totals, per_func, errors):
      totals[i]      = sum_k reward_weights[k] * per_func[reward_funcs[k]][i]
      per_func[name] = raw (unweighted) values, one per completion
      errors[name]   = how many samples made that function raise
    A raising function scores 0.0 for that sample and training continues; one
    malformed sample should not kill a long run. The caller logs the counts.
    A function may return None for "cannot score this one": that value is NaN in
    per_func and left out of the total (as TRL's nansum); a completion that no
    function could score gets a NaN total, which the advantages leave out.
    cache: a dict kept by the caller across calls, (name, completion, answer) -> (value, raised);
    the reward functions are pure, so a completion seen before is not scored again. Its
    "hits" / "lookups" entries count how often that saved a call.
    """
    # Validate before doing any work so config mistakes fail fast and clearly.
    unknown = [name for name in reward_funcs if name not in REWARD_FUNCS]
    if unknown:
        raise ValueError(f"unknown reward function(s) {unknown}; known: {sorted(REWARD_FUNCS)}")
    if len(set(reward_funcs)) != len(reward_funcs):
        # Results are keyed by name, so a duplicate would be silently merged.
        raise ValueError(f"duplicate reward function names in {reward_funcs}")
    if len(reward_weights) != len(reward_funcs):
        raise ValueError(
            f"got {len(reward_weights)} reward_weights for {len(reward_funcs)} reward_funcs"
        )
    if len(completions) != len(answers):
        raise ValueError(f"got {len(completions)} completions but {len(answers)} answers")

    if cache is not None and len(cache) > CACHE_SIZE:  # a bound on memory: start afresh, keep the counts
        counts = {k: cache.get(k, 0) for k in ("hits", "lookups")}
        cache.clear()
        cache.update(counts)
    totals = [0.0] * len(completions)
    scored = [False] * len(completions)
    per_func: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for name, weight in zip(reward_funcs, reward_weights):
        fn = REWARD_FUNCS[name]  # looked up per call, so tests can monkeypatch
        values, n_errors = [], 0
        for i, (completion, answer) in enumerate(zip(completions, answers)):
            key = (name, completion, answer)
            if cache is not None and key in cache:
                (value, raised), cache["hits"] = cache[key], cache.get("hits", 0) + 1
            else:
                try:
                    value = fn(completion, answer)
                    value, raised = (float("nan") if value is None else float(value)), False
                except Exception:
                    value, raised = 0.0, True
                if cache is not None:
                    cache[key] = (value, raised)
            if cache is not None:
                cache["lookups"] = cache.get("lookups", 0) + 1
            n_errors += raised
            values.append(value)
            if value == value:  # not NaN: this function scored it
                totals[i] += weight * value
                scored[i] = True
        per_func[name] = values
        errors[name] = n_errors
    totals = [t if s else float("nan") for t, s in zip(totals, scored)]
    return totals, per_func, errors
