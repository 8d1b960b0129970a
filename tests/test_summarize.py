# Tests for analysis/summarize.py. Run: python -m pytest tests/test_summarize.py -q
# Reference: hand-written log.jsonl files and the values the table must show.
import json

import pytest

from analysis import summarize
from configurator import UserError


def write(run, lines):
    """lines: dicts, written as JSON, or strings, written as they are (malformed lines)."""
    run.mkdir()
    (run / "log.jsonl").write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return str(run)


def table(capsys, *runs):
    """The printed table's header and its rows split into cells (the run's name first)."""
    summarize.main(list(runs))
    rows = capsys.readouterr().out.strip().splitlines()
    return rows[0], [[c.strip() for c in row.split("|")[1:-1]] for row in rows[2:]]


EVAL0 = {"iter": 0, "elapsed": 0.0, "test/accuracy": 0.4}


def test_table(tmp_path, capsys):
    write(tmp_path / "std", [{"iter": 0, "elapsed": 0.0, "test/accuracy": 0.4},
                             {"iter": 1, "elapsed": 1.0, "step_seconds": 1.0},
                             {"iter": 2, "elapsed": 2.0, "step_seconds": 1.0, "test/accuracy": 0.6}])
    write(tmp_path / "tr", [{"iter": 0, "elapsed": 0.0, "test/accuracy": 0.4},
                            {"iter": 1, "elapsed": 2.0, "step_seconds": 2.0, "test/accuracy": 0.5,
                             "selection_rate": 0.5, "defect/selection_precision": 0.9, "defect/clean_base_rate": 0.8},
                            {"iter": 2, "elapsed": 4.0, "step_seconds": 2.0, "test/accuracy": 0.7,
                             "selection_rate": 0.3, "defect/selection_precision": 0.7, "defect/clean_base_rate": 0.8}])
    summarize.main([str(tmp_path / "std"), str(tmp_path / "tr")])
    rows = capsys.readouterr().out.strip().splitlines()
    assert "at 2 s" in rows[0]                      # the fastest run's wall time
    std, tr = rows[2].split("|"), rows[3].split("|")
    assert std[3].strip() == "0.600 (2)" and std[5].strip() == "1.00" and std[6].strip() == "-"
    assert tr[3].strip() == "0.700 (2)" and tr[4].strip() == "0.500 (1)"  # equal wall time: step 1
    assert tr[6].strip() == "0.40" and tr[7].strip() == "0.80 / 0.80"


def test_missing_log(tmp_path):
    with pytest.raises(UserError, match="no log.jsonl"):
        summarize.main([str(tmp_path)])
    with pytest.raises(UserError, match="usage"):
        summarize.main([])


def test_runs_without_an_evaluation_show_a_dash(tmp_path, capsys):
    # eval_interval larger than the run, or a run stopped before its first evaluation: step lines only
    no_eval = write(tmp_path / "no_eval", [{"iter": 1, "elapsed": 1.0, "step_seconds": 1.0},
                                           {"iter": 2, "elapsed": 2.0, "step_seconds": 3.0}])
    std = write(tmp_path / "std", [EVAL0, {"iter": 1, "elapsed": 5.0, "step_seconds": 5.0, "test/accuracy": 0.5}])
    header, (a, b) = table(capsys, no_eval, std)
    assert "at 5 s" in header                       # the run without an evaluation has no say in it
    assert a == [no_eval, "-", "-", "-", "2.00", "-", "- / -"]
    assert b == [std, "0.400", "0.500 (1)", "0.500 (1)", "5.00", "-", "- / -"]
    header, (a,) = table(capsys, no_eval)
    assert "at - s" in header and a[1:4] == ["-", "-", "-"]


def test_log_with_only_the_first_evaluation(tmp_path, capsys):
    header, (row,) = table(capsys, write(tmp_path / "start", [EVAL0]))
    assert "at 0 s" in header
    assert row[1:] == ["0.400", "0.400 (0)", "0.400 (0)", "-", "-", "- / -"]


def test_malformed_lines_are_skipped_with_a_warning(tmp_path, capsys):
    run = write(tmp_path / "run", [EVAL0, '{"iter": 1, "elap', {"iter": 2, "elapsed": 2.0, "step_seconds": 2.0},
                                   "", {"iter": 3, "elapsed": 3.0, "step_seconds": 1.0, "test/accuracy": 0.6}])
    summarize.main([run])
    said = capsys.readouterr()
    out, err = said.out.splitlines(), said.err.splitlines()
    assert any("log.jsonl line 2 is not valid JSON" in l for l in err)
    assert any("log.jsonl line 4 is not valid JSON" in l for l in err)
    assert not any("warning" in l for l in out)  # stdout is the table alone
    row = [c.strip() for c in out[-1].split("|")[1:-1]]
    assert row[1:5] == ["0.400", "0.600 (3)", "0.600 (3)", "1.50"]


@pytest.mark.parametrize("lines, it", [
    ([EVAL0, {"iter": 1, "elapsed": 1.0, "step_seconds": 1.0}, EVAL0], 0),  # a second run appended
    ([EVAL0, {"iter": 1, "elapsed": 1.0, "step_seconds": 1.0}, {"iter": 2, "elapsed": 2.0, "step_seconds": 1.0},
      {"iter": 1, "elapsed": 1.5, "step_seconds": 1.5}], 1),
])
def test_duplicate_iteration_is_an_error(tmp_path, lines, it):
    run = write(tmp_path / "mixed", lines)
    with pytest.raises(UserError, match=f"{run}/log.jsonl has two lines for iteration {it}:"):
        summarize.main([run])


@pytest.mark.parametrize("lines", [[], ["{", "not json"]])
def test_log_without_a_valid_line_is_an_error(tmp_path, lines):
    run = write(tmp_path / "bad", lines)
    with pytest.raises(UserError, match="holds no log line"):
        summarize.main([run])


def test_a_skipped_evaluation_is_no_accuracy(tmp_path, capsys):
    """An older run logged NaN for an evaluation it skipped (NaN/Inf logits): no 'nan' in the table."""
    write(tmp_path / "r", [EVAL0, {"iter": 1, "elapsed": 1.0, "step_seconds": 1.0, "test/accuracy": float("nan")}])
    _, rows = table(capsys, str(tmp_path / "r"))
    assert "nan" not in " ".join(rows[0][1:]).lower() and rows[0][2] == "0.400 (0)"
