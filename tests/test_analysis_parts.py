# The attribution's and the report's smaller parts against expectations written out: which recorded rollouts
# are attributed (every nonzero advantage, negative ones too) and their text (stop ids removed), the summed
# ranking (positive sums only), the checkpoint shares (absolute values), the names of the checkpoints shown
# (the last ones), the answer's verdict, the default output paths, and the room greedy answers leave.
# Run: python -m pytest -q tests/test_analysis_parts.py
import json
import re

import pytest
import tiktoken

from analysis import attribute, report
from analysis.audit import greedy_answers
from configurator import UserError
from test_sampling_edges import bigram_gpt

ENC = tiktoken.Encoding("bytes", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                        special_tokens={"<|endoftext|>": 256})
EOT = 256


def test_load_rollouts_keeps_every_nonzero_advantage_with_its_prompt_and_clean_text(tmp_path):
    toks = [list(b"ab") + [EOT, EOT], list(b"c") + [EOT, EOT, EOT], list(b"de") + [EOT, EOT], list(b"fgh") + [EOT]]
    masks = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    rec = {"iter": 3, "prompts": ["P0", "P1"], "answers": [1, 2], "completion_tokens": toks,
           "completion_mask": masks, "rewards": [1.0, 0.0, 0.5, 0.5], "advantages": [0.7, -0.7, 0.0, -0.0]}
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "iter": 4, "advantages": [-1.0, 0.0, 2.0, 0.0]}) + "\n")
    got = [(s["iter"], s["prompt"], s["answer"], s["completion"], s["advantage"])
           for s in attribute.load_rollouts(str(path), ENC)]
    # group size 2: rows 0-1 answer P0, rows 2-3 P1; the stop id is no text; zero advantages are left out
    assert got == [(3, "P0", 1, "ab", 0.7), (3, "P0", 1, "c", -0.7), (4, "P0", 1, "ab", -1.0), (4, "P1", 2, "de", 2.0)]


def entry(i, score, contributions=(1.0,)):
    return {"index": i, "tracin_score": score, "checkpoint_contributions": list(contributions), "reward": 1.0,
            "advantage": 0.5, "iter": 1, "prompt": f"p{i}", "completion": f"c{i}"}


def result(entries, num_checkpoints=1):
    return {"scores": entries, "num_checkpoints": num_checkpoints}


def test_summed_helpful_lists_positive_sums_only_in_descending_order():
    a = [entry(0, 1.0), entry(1, -2.0), entry(2, 0.5), entry(3, 0.0), entry(4, 3.0)]
    b = [entry(0, 0.5), entry(1, 2.0), entry(2, -0.5), entry(3, 0.0), entry(4, -1.0)]
    got = report.summed_helpful([{"result": result(a)}, {"result": result(b)}], top_k=10)
    # sums: 0: 1.5, 1: 0.0, 2: 0.0, 3: 0.0, 4: 2.0 -> only 4 and 0, in that order
    assert [(e["index"], e["summed_score"]) for e in got] == [(4, 2.0), (0, 1.5)]
    assert [e["index"] for e in report.summed_helpful([{"result": result(a)}], top_k=2)] == [4, 0]


def shares(html):
    return [float(x) for x in re.findall(r'<td class="num">([-0-9.]+)%</td>', html)]


def test_checkpoint_shares_add_absolute_influence_and_name_the_last_checkpoints():
    """Helpful and harmful influence must not cancel: contributions +1 / -1 on two checkpoints are 50 % each.
    With fewer scored checkpoints than names (mode 'simple' scores the last one), the last names are shown."""
    res = result([entry(0, 0.0, (1.0, -1.0)), entry(1, 0.0, (-1.0, 1.0))], num_checkpoints=2)
    html = report.checkpoint_bars(res, ["ckpt_000000.pt", "ckpt_000002.pt", "ckpt_000003.pt"])
    assert shares(html) == [50.0, 50.0]
    assert "ckpt_000002.pt" in html and "ckpt_000003.pt" in html and "ckpt_000000.pt" not in html
    res = result([entry(0, 0.0, (3.0, -1.0)), entry(1, 0.0, (0.0, -4.0))], num_checkpoints=2)
    assert shares(report.checkpoint_bars(res, None)) == [37.5, 62.5]


@pytest.mark.parametrize("correct,word", [(True, "correct"), (False, "wrong"), (None, "unknown")])
def test_the_answers_verdict(correct, word):
    res = {**result([entry(0, 1.0)]), "num_train_samples": 1, "mean_influence_score": 1.0, "max_influence_score": 1.0,
           "most_influential_positive": [entry(0, 1.0)], "most_influential_negative": []}
    html = report.question_section(1, {"question": "q", "completion": "a", "correct": correct, "result": res},
                                   {"defect": False})
    assert f"(correct: {word})" in html


def test_a_default_output_path_may_replace_a_file_a_named_one_may_not(tmp_path):
    """A default path lives in the run directory and is replaced; a path the user named is never overwritten
    unless tracin.py wrote it."""
    path = tmp_path / "tracin_report.html"
    path.write_text("the user's own page")
    attribute.check_output_path({"html": str(path)}, "html", ".html", named=False)
    with pytest.raises(UserError, match="exists and was not written by analysis.attribute"):
        attribute.check_output_path({"html": str(path)}, "html", ".html", named=True)
    path.write_text("<!DOCTYPE html>\n<html><head><title>TracIn attribution report</title>")
    attribute.check_output_path({"html": str(path)}, "html", ".html", named=True)


def test_greedy_answers_leave_the_last_place_of_the_context_for_end_of_text():
    """A model that never stops (0 -> 0, the rest a cycle that never reaches 0 = its stop id): the answer fills
    the context up to its last place, which the test row's end-of-text takes."""
    f = list(range(1, 16)) + [1]
    f[0] = 0
    m = bigram_gpt(f)  # context 32
    enc = type("Enc", (), {"eot_token": 0, "stop_tokens": (0,), "n_vocab": 16})()
    for P in (5, 20, 29, 30):
        (answer,) = greedy_answers(m, enc, [[3] * P], 64)
        assert len(answer) == m.config.block_size - 1 - P, P
        assert 0 not in answer


def test_an_audit_test_question_longer_than_the_context_is_named():
    from analysis.audit import find_wrong
    f = list(range(1, 16)) + [1]
    f[0] = 0
    m = bigram_gpt(f)  # context 32; the byte tokenizer: one token a character, plus the prompt's newline
    ok = {"question": "1+1", "answer": 2, "solution": "#### 2"}
    for n in (31, 40, 500):  # a prompt of 30 tokens (29 characters + newline) is the longest that fits
        examples = [ok] * 3 + [{**ok, "question": "7" * n}] + [ok]
        with pytest.raises(UserError, match=rf"test question 3 of the split \('7+'...\) is {n + 1} tokens; the "
                                            r"model's context of 32 leaves no room"):
            find_wrong(m, ENC_SMALL, examples, 5, "arith", 8, batch=2)
    wrong, seen = find_wrong(m, ENC_SMALL, [ok, {**ok, "question": "7" * 29}], 5, "arith", 8)
    assert seen == 2


ENC_SMALL = type("Enc", (), {"eot_token": 0, "stop_tokens": (0,), "n_vocab": 16,
                             "encode": staticmethod(lambda text, **k: [3] * len(text)),
                             "decode": staticmethod(lambda toks: "x" * len(toks))})()
