# One rule for digits in every reward: only ASCII 0-9 make a number. Every decimal digit of every other
# script (Unicode category Nd: full-width, Arabic-Indic, Devanagari, mathematical bold, ...), digits that
# are not Nd but that str.isdigit() takes (superscripts, circled), and a number mixing scripts: no reward
# reads any of them as a number, where the same text in ASCII digits scores.
# Run: python -m pytest -q tests/test_reward_digits.py
import sys
import unicodedata

import pytest

import rewards
from rewards import (compute_rewards, correctness_reward, countdown_reward, extract_answer, format_reward,
                     gsm8k_reward)


def digit_blocks():
    """The zero of each run of ten consecutive Nd code points valued 0..9, except ASCII's."""
    zeros = []
    for cp in range(sys.maxunicode + 1):
        if cp != ord("0") and unicodedata.category(chr(cp)) == "Nd" and unicodedata.digit(chr(cp)) == 0:
            if all(unicodedata.digit(chr(cp + d), None) == d for d in range(10)):
                zeros.append(cp)
    return zeros


BLOCKS = digit_blocks()
# not Nd, but str.isdigit() (and for some int()) takes them: superscripts, subscripts, circled
OTHER = {"2": "\u00b2", "1": "\u00b9", "3": "\u2083", "4": "\u2463", "7": "\u2466"}


def spell(n, zero):
    return "".join(chr(zero + int(c)) if c.isdigit() else c for c in str(n))


def variants(n):
    """(text, ascii?) spellings of n: ASCII, each other script whole, each script in one place only."""
    s = str(n)
    out = [(s, True)]
    for zero in BLOCKS:
        out.append((spell(n, zero), False))
        for i in range(len(s)):  # one digit from another script
            out.append((s[:i] + chr(zero + int(s[i])) + s[i + 1:], False))
    for i, c in enumerate(s):
        if c in OTHER:
            out.append((s[:i] + OTHER[c] + s[i + 1:], False))
    return out


def test_every_script_is_found():
    assert len(BLOCKS) >= 60  # Unicode 15 has ~70 such runs; the test must not pass on an empty list
    assert 0xFF10 in BLOCKS and 0x0660 in BLOCKS and 0x06F0 in BLOCKS and 0x0966 in BLOCKS and 0x1D7CE in BLOCKS


@pytest.mark.parametrize("n", [7, 72, 305, 1234])
def test_answer_rewards_read_only_ascii_digits(n):
    """#### line (arith correctness, format, gsm8k) and \\boxed{} (gsm8k): a number iff it is ASCII."""
    for text, ascii_ in variants(n):
        want = 1.0 if ascii_ else 0.0
        assert (extract_answer(f"#### {text}") == n) is ascii_, text
        assert extract_answer(f"#### {text}") in (n if ascii_ else None, None), text  # never another number
        assert correctness_reward(f"3+4=7\n#### {text}", n) == want, text
        assert correctness_reward(f"#### {text} apples", n) == want, text
        assert format_reward(f"3+4=7\n#### {text}\n", n) == want, text
        assert gsm8k_reward(f"So #### {text}", n) == want, text
        assert gsm8k_reward(f"The answer is \\boxed{{{text}}}.", n) == want, text
        assert gsm8k_reward(f"\\boxed{{-{text}}}", -n) == want, text
        assert gsm8k_reward(f"#### {text}.0", n) == want, text
        # a non-ASCII number after "####" is no number: gsm8k then reads the \boxed{} (ASCII), as with no ####
        assert gsm8k_reward(f"\\boxed{{{n}}} #### {text}", n) == 1.0, text


@pytest.mark.parametrize("numbers,target", [([3, 4], 7), ([12, 5, 3], 20), ([25, 4], 100)])
def test_countdown_reads_only_ascii_digits(numbers, target):
    expr = "+".join(map(str, numbers)) if target == sum(numbers) else "*".join(map(str, numbers))
    assert countdown_reward(f"<think>x</think><answer>{expr}</answer>", [numbers, target]) == 1.0
    for k, m in enumerate(numbers):
        for text, ascii_ in variants(m)[1:]:
            spelled = [str(x) if j != k else text for j, x in enumerate(numbers)]
            e = ("+" if target == sum(numbers) else "*").join(spelled)
            assert countdown_reward(f"<answer>{e}</answer>", [numbers, target]) == 0.0, e
            assert countdown_reward(f"<answer>{e}</answer>", [numbers, target]) == float(ascii_), e


def test_compute_rewards_applies_the_rule_in_every_function():
    """All answer rewards at once, weighted: a non-ASCII spelling scores nothing, not even format (which a
    wrong ASCII answer gets)."""
    funcs = ["correctness", "format", "gsm8k"]
    for text, ascii_ in variants(72)[::7]:
        totals, per, errors = compute_rewards([f"#### {text}", "#### 71"], [72, 72], funcs, [1.0, 0.5, 2.0])
        assert not any(errors.values())
        assert totals == [3.5 if ascii_ else 0.0, 0.5], text


def test_to_int_is_the_one_gate():
    assert rewards.to_int("-", "1,234") == -1234 and rewards.to_int("", "072") == 72
    for bad in ["７２", "7２", "\u0667", "\u00b2", "", "1" * 5000]:
        assert rewards.to_int("", bad) is None, bad
