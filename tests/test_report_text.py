# The HTML report shows every character of a run's or user's text that could reorder or hide text as its
# code point written out: bidirectional overrides, embeddings, isolates and marks, zero-width characters,
# every other format character (Unicode category Cf), controls, separators, lone surrogates, invisible
# fillers and variation selectors. Ordinary text of any script stays as it is.
# Run: python -m pytest -q tests/test_report_text.py
#
# Independent references: the lists below are written out from the Unicode standard (UAX #9 for the bidi
# controls); Python's unicodedata gives every Cf / Cc / Zl / Zp code point; the written page is read back
# and scanned character by character.
import html
import os
import re
import sys
import unicodedata

import pytest

from analysis.report import esc, write_report

BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C]  # UAX #9's explicit controls
ZERO_WIDTH = [0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, 0x180E, 0x00AD, 0x2061, 0x2062, 0x2063, 0x2064]
TAGS = [0xE0001, *range(0xE0020, 0xE0080)]  # invisible tag characters (emoji tag sequences, "ASCII smuggling")
INVISIBLE = [0x034F, 0x115F, 0x1160, 0x3164, 0xFFA0, 0x17B4, 0x17B5, *range(0xFE00, 0xFE10), 0xE0100, 0xE01EF]
OTHER = [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0xD800, 0xDC80, 0xDFFF,
         0xE000, 0xF8FF, 0x0378, 0x10FFFF]  # C0, C1, separators, lone surrogates, private use, unassigned


def every(categories):
    return [cp for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp)) in categories]


HIDDEN = sorted(set(BIDI + ZERO_WIDTH + TAGS + INVISIBLE + OTHER + every(("Cf", "Cc", "Zl", "Zp"))) - {9, 10})
ESCAPE = re.compile(r"\\x([0-9a-f]{2})|\\u([0-9a-f]{4})|\\U([0-9a-f]{8})")


def decoded(shown):
    """The code points an escaped text names, escapes turned back into their characters."""
    return ESCAPE.sub(lambda m: chr(int(next(g for g in m.groups() if g), 16)), html.unescape(shown))


def test_every_hiding_or_reordering_character_is_shown_as_its_code_point():
    assert len(HIDDEN) > 250 and len(BIDI) == 12
    for cp in HIDDEN:
        text = f"a{chr(cp)}b"
        out = esc(text)
        assert out.isascii() and out.isprintable(), hex(cp)  # nothing left that a page could hide
        assert decoded(out) == text, hex(cp)  # and it says which character was there


@pytest.mark.parametrize("text", ["Mia has 3 apples.", "Mia hat 3 Äpfel, Œuvre, naïve (e\u0301)",
                                  "ミアはりんごを3個持っています。", "Миа 3 яблока", "مريم لديها ٣ تفاحات",
                                  "מיה יש לה 3 תפוחים", "मिया के पास ३ सेब हैं", "🍎🍏 x3 👩‍👩‍👧", "tab\there\nnew line",
                                  "\u00a0non-breaking\u2003em space\u3000ideographic"])
def test_ordinary_text_of_any_script_stays_as_it_is(text):
    # the ZWJ of an emoji family sequence is a format character too: shown, the emoji themselves kept
    assert esc(text) == html.escape(text.replace("\u200d", "\\u200d"), quote=True)


def test_the_written_page_holds_no_hidden_character(tmp_path):
    """A page whose question, answer, prompts, completions, run path and checkpoint names each hold every
    hidden character: read back, no character of it is one (but the page's own newlines)."""
    hostile = "x" + "".join(map(chr, HIDDEN)) + "\u202eevil\u202c<b>&"
    entry = {"index": 0, "tracin_score": 1.0, "checkpoint_contributions": [0.5, 0.5], "reward": 1.0,
             "advantage": 0.5, "iter": 1, "prompt": hostile, "completion": hostile, "defective": True}
    result = {"scores": [entry], "most_influential_positive": [entry], "most_influential_negative": [],
              "num_checkpoints": 2, "num_train_samples": 1, "mean_influence_score": 1.0,
              "max_influence_score": 1.0, "checkpoint_weights": [1.0, 1.0]}
    path = tmp_path / "r.html"
    write_report(str(path), [{"question": hostile, "completion": hostile, "correct": None, "result": result}] * 2,
                 {"run": hostile, "mode": hostile, "n_probe": 1, "layer_filter": hostile, "top_k": 3,
                  "checkpoints": [hostile, hostile]})
    page = path.read_text(encoding="utf-8")
    bad = {hex(ord(c)) for c in page if c != "\n" and ord(c) in set(HIDDEN)}
    assert not bad
    assert page.count("\\u202eevil\\u202c&lt;b&gt;&amp;") >= 8  # each place shows it, escaped


def test_the_report_never_replaces_a_file_that_is_not_its_own(tmp_path):
    """A file at the report's path that tracin.py did not write (made after the check, or named):
    left as it is, no temporary file left beside it; the report's own file is replaced."""
    from analysis.attribute import written_here
    from configurator import UserError
    entry = {"index": 0, "tracin_score": 1.0, "checkpoint_contributions": [1.0], "reward": 1.0,
             "advantage": 0.5, "iter": 1, "prompt": "p", "completion": "c"}
    result = {"scores": [entry], "most_influential_positive": [entry],
              "most_influential_negative": [], "num_checkpoints": 1, "num_train_samples": 1,
              "mean_influence_score": 1.0, "max_influence_score": 1.0, "checkpoint_weights": [1.0]}
    args = ([{"question": "q", "completion": "c", "correct": None, "result": result}],
            {"run": "r", "mode": "simple", "n_probe": 1, "layer_filter": "", "top_k": 1,
             "checkpoints": ["ckpt_000001.pt"]})
    path = tmp_path / "report.html"
    write_report(str(path), *args, ours=written_here)
    write_report(str(path), *args, ours=written_here)  # its own: replaced
    assert written_here(str(path))
    path.write_text("<html>a user's page</html>")
    with pytest.raises(UserError, match="was not written by analysis.attribute: it is left as it is"):
        write_report(str(path), *args, ours=written_here)
    assert path.read_text() == "<html>a user's page</html>"
    assert os.listdir(tmp_path) == ["report.html"]
