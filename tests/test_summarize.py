# Tests for summarize.py. Run: python -m pytest tests/test_summarize.py -q
# Reference: two hand-written log.jsonl files and the values the table must show.
import json

import pytest

import summarize
from configurator import UserError


def write(run, lines):
    run.mkdir()
    (run / "log.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))


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
