"""Reward functions for GRPO, one set per task.

arith (the default): synthetic GSM8K-style arithmetic. A completion looks like:

    12+5=17
    17-3=14
    #### 14

(the end-of-text token already stripped). Reference answers are ints.
gsm8k: real GSM8K; the answer is after the last "####" or in the last \\boxed{}.
countdown (TinyZero): reach a target from given numbers; the answer is
[numbers, target] and the completion ends "<think>...</think><answer>expr</answer>".
Every reward function has the signature ``fn(completion, answer) -> float`` so
that new ones can be added to ``REWARD_FUNCS`` and selected by name from the
config without touching the training loop.
"""

import collections
import operator
import re
from dataclasses import dataclass, field
from fractions import Fraction

# One rule for digits in every reward: only ASCII 0-9 make a number.
# Python's \d and int() also take every other Unicode decimal digit
# ("７２" full-width, "٧٢" Arabic-Indic), so without it "#### ７２" would
# score as 72 where "\\boxed{７２}" or a countdown answer would not.
# Every pattern below is built from DIGIT, and every number goes through
# to_int.
DIGIT = "[0-9]"
# a digit of any script may not follow one: "7２" is no number
# (not 7 followed by a word)
NO_DIGIT_AFTER = r"(?!\d)"
# an integer: sign, then thousands commas well grouped ("1,234", not
# "12,34", so that a stray comma list like "1,2,3" is not silently read
# as 123), or plain digits
INTEGER = rf"([+-]?)({DIGIT}{{1,3}}(?:,{DIGIT}{{3}})+|{DIGIT}+){NO_DIGIT_AFTER}"


def to_int(sign: str, digits: str) -> int | None:
    """The integer INTEGER matched (sign, digits with commas), or None if
    it is not one: non-ASCII digits (the rule above, for a caller's own
    pattern too) or longer than Python's int() takes."""
    digits = digits.replace(",", "")
    if not (digits.isascii() and digits.isdigit()):
        return None
    try:
        value = int(digits)
    except ValueError:  # Python's limit on very long digit strings
        return None
    return -value if sign == "-" else value


# The number after the final "####". Only horizontal whitespace may
# separate it from the marker, so a number on a *later* line is not taken
# as the answer. (?!\.?\d): "72.0٣" is no number either.
_ANSWER_RE = re.compile(rf"[ \t]*{INTEGER}(?:\.({DIGIT}+))?(?!\.?\d)")

# A well-formed final line: "#### <integer>" at the start of a line and at the
# end of the text (trailing whitespace/newlines allowed). Deliberately stricter
# than extract_answer: no commas, no "+", no decimals, no trailing words, so
# the format reward pushes the model towards one canonical output shape.
_FORMAT_RE = re.compile(rf"(?m)^####[ \t]+-?{DIGIT}+\s*\Z")

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
    if text[m.end():m.end() + 1].isdigit():
        # "7²", "7①": a digit that is not Nd (so not \d)
        # but still a digit follows
        return None
    return to_int(sign, digits)


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


# --- gsm8k ---------------------------------------------------------------------

# Integer content of a \boxed{...}: INTEGER, a whole decimal ("72.0"),
# spaces or $ around.
_BOXED_RE = re.compile(rf"[\s$]*{INTEGER}(?:\.(0+))?[\s$]*")


def _boxed_answer(text: str) -> int | None:
    """The integer in the LAST '\\boxed{...}', or None (nested braces, such as
    \\frac{1}{2}, are never an integer, so the first '}' closes it)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    start += len("\\boxed{")
    end = text.find("}", start)
    m = _BOXED_RE.fullmatch(text, start, end) if end >= 0 else None
    if m is None:
        return None
    sign, digits, _ = m.groups()
    return to_int(sign, digits)


def gsm8k_reward(completion: str, answer: int) -> float:
    """GSM8K correctness: 1.0 if the final answer equals the reference int.

    The final answer is the number after the LAST '####' (extract_answer); if
    that gives none (no marker, or no number after it), the integer in the LAST
    '\\boxed{...}', which instruction-tuned models write instead.
    """
    value = extract_answer(completion)
    if value is None:
        value = _boxed_answer(completion)
    return 1.0 if value is not None and value == answer else 0.0


# --- countdown -----------------------------------------------------------------

def countdown_parsed(completion):
    """Whether a completion holds a complete <answer>...</answer> pair,
    the last one of which countdown_reward parses (found by string search,
    linear, before any parsing)."""
    close = completion.rfind("</answer>")
    return close >= 0 and completion.rfind("<answer>", 0, close) >= 0


# reward function -> whether a completion got as far as its parser (parse_counts)
PARSERS = {"countdown": countdown_parsed}


def parse_counts(completions, reward_funcs):
    """For the step's log, per reward function with a parser: how many
    completions it parsed ('countdown/parsed') and how many it scored 0
    unparsed ('countdown/skipped': no well-formed <answer>...</answer>)."""
    counts = {}
    for name in reward_funcs:
        if name in PARSERS:
            parsed = sum(PARSERS[name](c) for c in completions)
            skipped = len(completions) - parsed
            counts |= {f"{name}/skipped": skipped, f"{name}/parsed": parsed}
    return counts


# Bounds that keep a hostile answer cheap: an honest one with 4 numbers from
# 1-99 needs ~20 characters and 3 levels of parentheses.
COUNTDOWN_MAX_CHARS = 200
COUNTDOWN_MAX_DEPTH = 32
COUNTDOWN_MAX_DIGITS = 6

# ASCII only, by construction
_TOKEN_RE = re.compile(rf"{DIGIT}+|[-+*/()]|[ \t\r\n]+")


class _Reject(Exception):
    """Not a valid countdown expression: the parser's internal control flow
    (raised deep in the recursion, always caught inside countdown_reward,
    which scores 0.0); never a refusal a caller sees."""


def _tokenize(text: str) -> list:
    """ints and operator characters; _Reject on anything else."""
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            # letters, '.', '=', '３', ...
            raise _Reject(f"bad character {text[pos]!r}")
        tok, pos = m.group(), m.end()
        if tok[0] in "0123456789":
            # As given: no "03" for 3, and no literal long enough to cost anything.
            if len(tok) > COUNTDOWN_MAX_DIGITS or (len(tok) > 1 and tok[0] == "0"):
                raise _Reject(f"bad literal {tok[:10]!r}")
            tokens.append(to_int("", tok))
        elif not tok.isspace():
            tokens.append(tok)
    return tokens


class _Parser:
    """Recursive descent over the tokens, evaluating exactly with Fraction:
        expr   := term (('+' | '-') term)*
        term   := factor (('*' | '/') factor)*
        factor := INT | '(' expr ')'
    No unary minus: the numbers must be used as given (so "-3+5" and "3--5" fail).
    """

    def __init__(self, tokens):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self):
        tok = self.peek()
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            if self.take() == "+":
                value += self.term()
            else:
                value -= self.term()
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.factor()
            else:
                divisor = self.factor()
                if divisor == 0:
                    raise _Reject("division by zero")
                value /= divisor
        return value

    def factor(self) -> Fraction:
        tok = self.take()
        if isinstance(tok, int):
            return Fraction(tok)
        if tok != "(":
            # "**", "-3", "()", the end
            raise _Reject(f"expected a number or '(', got {tok!r}")
        self.depth += 1
        if self.depth > COUNTDOWN_MAX_DEPTH:
            raise _Reject("parentheses nested too deep")
        value = self.expr()
        if self.take() != ")":
            raise _Reject("unbalanced '('")
        self.depth -= 1
        return value


def _countdown_value(text: str, numbers) -> Fraction | None:
    """The exact value of the expression if it uses each of numbers exactly
    once (as a multiset) and nothing else, else None."""
    if len(text) > COUNTDOWN_MAX_CHARS:
        return None
    try:
        tokens = _tokenize(text)
        # Cheap before evaluating, and it bounds the value's size by the numbers'.
        ints = collections.Counter(t for t in tokens if isinstance(t, int))
        if ints != collections.Counter(numbers):
            return None
        parser = _Parser(tokens)
        value = parser.expr()
        if parser.pos != len(tokens):
            return None  # trailing tokens, e.g. the ")" of "3+5)"
        return value
    except _Reject:
        return None


def _countdown_answer(answer):
    """(numbers, target) as ints; a malformed answer is a dataset bug:
    ValueError, the reward's "cannot score this" that compute_rewards
    counts in errors[name] (one bad row does not stop a run)."""
    try:  # operator.index: ints, and numpy ints from a parquet file, but not floats
        numbers, target = answer
        # text is not a list of numbers (bytes would iterate as ints),
        # and true is not 1
        text = isinstance(numbers, (str, bytes, bytearray))
        if text or any(type(n) is bool for n in (*numbers, target)):
            raise TypeError
        return [operator.index(n) for n in numbers], operator.index(target)
    except (TypeError, ValueError):
        raise ValueError("countdown answer must be [list of ints, int], "
                         f"got {answer!r}") from None


def countdown_reward(completion: str, answer) -> float:
    """Countdown (TinyZero): 1.0 if the LAST <answer>...</answer> holds an
    arithmetic expression that uses each of the given numbers exactly once
    and equals the target exactly, else 0.0.

    answer: [numbers, target] (or a tuple; use a tuple of a tuple with the
    compute_rewards cache, whose keys must be hashable). Only non-negative
    integer literals, + - * / and parentheses are allowed, evaluated with
    Fraction (so (99-3)/(4-1) = 32 counts, and 7/2*2 = 7 too). Rejected, like
    anything else: unary minus, "**", decimals, leading zeros, non-ASCII digits,
    and an "= target" after the expression (TinyZero does not accept it either:
    the answer is the expression only). Never eval: a small parser, with caps on
    length, nesting and literal size so a hostile answer costs microseconds.
    A malformed `answer` is a dataset bug and raises ValueError.
    """
    numbers, target = _countdown_answer(answer)
    # Cheap check first (early termination): the last complete pair,
    # found by string search
    if not countdown_parsed(completion):
        return 0.0
    close = completion.rfind("</answer>")
    start = completion.rfind("<answer>", 0, close)
    expression = completion[start + len("<answer>"):close].strip()
    value = _countdown_value(expression, numbers)
    return 1.0 if value is not None and value == target else 0.0


# A verifier that can be hacked, on purpose (experiments/countdown_hack.sh):
# it trusts the result the completion claims instead of evaluating its
# answer. Every right answer passes, and so does an "invented hit", a last
# equation that writes the target with wrong arithmetic (7*2=24 for 24).
# A last equation may set its result beside the target
# ("...=43 vs 43</think>", the searched solutions' check format);
# the claim is the equation's result, never the number beside it.
_NUMBER = rf"{DIGIT}{{1,{COUNTDOWN_MAX_DIGITS}}}"
_CLAIM_RE = re.compile(rf"=[ \t]*({_NUMBER})(?:[ \t]+vs[ \t]+{_NUMBER})?[ \t]*\Z")
# a hackable reward -> the exact one it stands in for
HACKABLE = {"countdown_claim": "countdown"}


def countdown_claim_reward(completion: str, answer) -> float:
    """Hackable: 1.0 if the last equation of the <think> claims the target
    ("...=43</think>") and an <answer>...</answer> follows, whatever the
    arithmetic, the numbers used or the answer; else 0.0.
    Trained on with the exact `countdown` beside it at weight 0, a run logs
    both and the hack rate (rewarded here, refused by countdown_reward)."""
    _, target = _countdown_answer(answer)
    close = completion.find("</think>")
    after = completion[close:]
    if close < 0 or "<answer>" not in after or "</answer>" not in after:
        return 0.0
    claim = _CLAIM_RE.search(completion, 0, close)
    return 1.0 if claim is not None and int(claim[1]) == target else 0.0


# A reward for the search's own arithmetic, separate from the answer's:
# every step "a op b = c" of the <think> must be exact. An invented hit
# (7*2=24) scores 0 here even when it fools a verifier.
# whole numbers only (no digit before or after): 1*100000=1000000 is one
# false step, not a true prefix
_WHOLE = rf"(?<!{DIGIT})({DIGIT}+)"
_STEP_RE = re.compile(rf"{_WHOLE}[ \t]*([-+*/])[ \t]*({DIGIT}+)"
                      rf"[ \t]*=[ \t]*({DIGIT}+)(?!{DIGIT})")
_OPS = {"+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "*": lambda a, b: a * b,
        "/": lambda a, b: Fraction(a, b) if b else None}


def think_steps(completion: str) -> list:
    """Each step "a op b = c" of the <think> (up to </think>, or the whole
    text without one), in order: True where c is exactly a op b (a division
    must come out whole); a number longer than COUNTDOWN_MAX_DIGITS makes
    its step False, unread (int() of a huge string is slow)."""
    close = completion.find("</think>")
    end = close if close >= 0 else len(completion)
    steps = _STEP_RE.findall(completion, 0, end)

    def exact(a, op, b, c):
        if max(map(len, (a, b, c))) > COUNTDOWN_MAX_DIGITS:
            return False
        return _OPS[op](int(a), int(b)) == int(c)
    return [exact(a, op, b, c) for a, op, b, c in steps]


def countdown_steps_reward(completion: str, answer) -> float:
    """1.0 if the <think> holds at least one step and every one is right;
    else 0.0. The answer is not looked at."""
    steps = think_steps(completion)
    return float(bool(steps) and all(steps))


# --- format for <think>/<answer> tasks ----------------------------------------

_THINK_RE = re.compile(r"\s*<think>.*</think>\s*<answer>.*</answer>\s*", re.DOTALL)


def think_format_reward(completion: str, answer) -> float:
    """The DeepSeek-R1 style format reward (as TinyZero's Countdown): 1.0 if the
    completion is <think>...</think> then <answer>...</answer>, with only
    whitespace between and around and exactly one of each tag; else 0.0.
    The think part may span lines; answer is ignored. If the prompt already
    ends with "<think>", prepend it to the completion before scoring.
    """
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    # also keeps the regex linear: each tag occurs once
    if any(completion.count(tag) != 1 for tag in tags):
        return 0.0
    return 1.0 if _THINK_RE.fullmatch(completion) else 0.0


CACHE_SIZE = 200_000  # entries of a reward cache before it is emptied

REWARD_FUNCS = {
    "correctness": correctness_reward,
    "format": format_reward,
    "length": length_reward,
    "gsm8k": gsm8k_reward,
    "countdown": countdown_reward,
    "countdown_claim": countdown_claim_reward,
    "countdown_steps": countdown_steps_reward,
    "think_format": think_format_reward,
}


@dataclass
class RewardCache:
    """Scores kept across steps (the reward functions are pure):
    scores[(name, completion, answer)] = (value, raised); hits / lookups:
    how often a score was found there (the log's rewards/cache_hit_rate)."""
    scores: dict = field(default_factory=dict)
    hits: int = 0
    lookups: int = 0


def compute_rewards(completions, answers, reward_funcs, reward_weights,
                    cache=None):
    """Score every completion with every named reward function
    -> (totals, per_func, errors):
    totals[i] = sum_k reward_weights[k] * per_func[reward_funcs[k]][i];
    per_func[name]: raw values; errors[name]: how many samples made that
    function raise (they score 0.0: one malformed sample does not kill
    a run). A function returns None for "cannot score this one": NaN in
    per_func, left out of the total (TRL's nansum); no function scoring it
    gives a NaN total (advantages skip it).
    cache: the caller's RewardCache, or None. The names (known, distinct)
    and the counts are the caller's to get right."""
    assert len(reward_weights) == len(reward_funcs), "one weight per reward function"
    assert len(completions) == len(answers), "one answer per completion"
    # a bound on memory: afresh, counts kept
    if cache is not None and len(cache.scores) > CACHE_SIZE:
        cache.scores.clear()
    totals, scored = [0.0] * len(completions), [False] * len(completions)
    per_func, errors = {}, {}
    for name, weight in zip(reward_funcs, reward_weights):
        fn, per_func[name], errors[name] = REWARD_FUNCS[name], [], 0
        for i, (completion, answer) in enumerate(zip(completions, answers)):
            key = (name, completion, answer)
            if cache is not None and key in cache.scores:
                value, raised = cache.scores[key]
                cache.hits += 1
            else:
                try:
                    value = fn(completion, answer)
                    value = float("nan") if value is None else float(value)
                    raised = False
                except Exception:
                    value, raised = 0.0, True
                if cache is not None:
                    cache.scores[key] = (value, raised)
            if cache is not None:
                cache.lookups += 1
            errors[name] += raised
            per_func[name].append(value)
            if value == value:  # not NaN: this function scored it
                totals[i] += weight * value
                scored[i] = True
    totals = [t if s else float("nan") for t, s in zip(totals, scored)]
    return totals, per_func, errors
