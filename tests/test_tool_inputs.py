# The tools around a run given damaged or mistaken input: a rollouts.jsonl record that is JSON but not
# what rollout_record writes (skipped by name, the good ones kept), attributions of different rollouts
# summed into one figure (refused), a log value that is null or text (left out, never a crash), a full
# disk during a JSON result (the earlier file kept whole), two runs of one name, a seed beyond 64 bits.
# References: records written out by hand, the good record's rollouts read alone, the bytes of the
# earlier file. Run: python -m pytest -q tests/test_tool_inputs.py
import errno
import json
import os

import pytest

from analysis import attribute, audit, plot, report, summarize
from configurator import UserError
import fileio
from runs import rundir
from runs.metrics import record_problem
from test_analysis_parts import ENC, EOT, entry, result

MATPLOTLIB = "matplotlib draws the figures: not in requirements.txt (.ci/run installs it)"

GOOD = {"iter": 3, "prompts": ["P0", "P1"], "answers": [1, 2],
        "completion_tokens": [list(b"ab") + [EOT], list(b"c") + [EOT, EOT], list(b"de") + [EOT],
                              list(b"fg") + [EOT]],
        "completion_mask": [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]],
        "rewards": [1.0, float("nan"), 0.5, 0.0], "advantages": [0.7, 0.0, 0.5, -0.5]}


def damaged(**changes):
    rec = json.loads(json.dumps(GOOD))
    for k, v in changes.items():
        if v is None and k in rec:
            del rec[k]
        else:
            rec[k] = v
    return rec


BAD = [
    (dict(rewards=[]), "mismatched lengths"),
    (dict(advantages=[0.7, 0.0, 0.5]), "mismatched lengths"),
    (dict(answers=[1]), "mismatched lengths"),
    (dict(selected=[True]), "mismatched lengths"),
    (dict(prompts="P0P1"), "not a list"),
    (dict(iter="one"), "iter that is not a whole number"),
    (dict(advantages=[0.7, None, 0.5, -0.5]), "advantage that is not finite"),
    (dict(advantages=[float("nan")] * 4), "advantage that is not finite"),
    (dict(rewards=["a", "b", "c", "d"]), "reward that is not a number"),
    (dict(prompts=["P0", 5]), "prompt that is not text"),
    (dict(completion_tokens=[[99999, 1, 2], [1, 2, 3], [1, 2, 3], [1, 2, 3]]), "token ids below 257"),
    (dict(completion_tokens=[[-5, 1, 2], [1, 2, 3], [1, 2, 3], [1, 2, 3]]), "token ids below"),
    (dict(completion_tokens=[[1.5, 1, 2], [1, 2, 3], [1, 2, 3], [1, 2, 3]]), "token ids below"),
    (dict(completion_mask=[[1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]]), "mask of its length"),
    (dict(completion_mask=["abc", [1, 1, 0], [1, 1, 1], [1, 1, 1]]), "mask of its length"),
    (dict(answers=None), "lacks ['answers']"),
    (dict(selected=["no", "no", "yes", "no"]), "value of selected that is not true or false"),
    (dict(selected=[2, 0, 1, 0]), "value of selected that is not true or false"),
    (dict(defective=["no", True]), "value of defective that is not true or false"),
    (dict(influence=[None, 0.1, 0.2, 0.3]), "value of influence that is not a number"),
    (dict(influence=[True, 0.1, 0.2, 0.3]), "value of influence that is not a number"),
    (dict(influence="0.1"), "not a list"),
    (dict(iter=10 ** 400), "iter that is not a whole number from 0 to 2**53"),
    (dict(iter=-1), "iter that is not a whole number from 0 to 2**53"),
]


@pytest.mark.parametrize("changes, said", BAD)
def test_a_record_that_is_json_but_not_a_rollout_record_is_skipped_by_name(tmp_path, capsys, changes,
                                                                           said):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(GOOD) + "\n")
    alone = attribute.load_rollouts(str(path), ENC)
    assert len(alone) == 3  # the three nonzero advantages (a NaN reward: unscored, still read)
    path.write_text(json.dumps(damaged(**changes)) + "\n" + json.dumps(GOOD) + "\n")
    assert attribute.load_rollouts(str(path), ENC) == alone
    err = capsys.readouterr().err
    assert f"{path} line 1: the record " in err and said in err and "line 2" not in err


def test_the_record_check_passes_what_a_run_writes():
    assert record_problem(GOOD, 257) is None
    assert record_problem({**GOOD, "selected": [True] * 4, "influence": [0.1] * 4,
                           "defective": [False, True]}, 257) is None
    assert "below 3" in record_problem(GOOD, 3)  # the model's vocabulary bounds the ids


@pytest.mark.parametrize("answers, form, ok", [
    ([[[1, 2], 3], [[4, 5, 6], 9]], "countdown", True),
    ([1, 2], "countdown", False),               # a number where [numbers, target] is read
    (["7", [[1, 2], 3]], "countdown", False),   # text
    ([[1, 2, 3], [[1, 2], 3]], "countdown", False),  # no target
    ([[[1.5, 2], 3], [[1, 2], 3]], "countdown", False),  # not whole numbers
    ([[[1, 2], None], [[1, 2], 3]], "countdown", False),
    ([1, 2], "number", True),
    ([[[1, 2], 3], 2], "number", False),
    (["x", 2], None, True),                     # a reader that reads no answer checks none
])
def test_answers_are_checked_for_the_form_a_reader_reads(answers, form, ok):
    problem = record_problem({**GOOD, "answers": answers}, 257, form=form)
    assert (problem is None) == ok
    assert ok or "answer that is not of the task's form" in problem


@pytest.mark.parametrize("copies", [2, 3])
def test_a_rollouts_file_with_every_record_repeated_is_read_once_with_a_word(tmp_path, capsys, copies):
    later = {**GOOD, "iter": 4}
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(later) + "\n")
    once = attribute.load_rollouts(str(path), ENC)
    assert not capsys.readouterr().err
    path.write_text((json.dumps(GOOD) + "\n" + json.dumps(later) + "\n") * copies)
    assert attribute.load_rollouts(str(path), ENC) == once
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{2 * copies - 2} records repeat" in err[0]
    assert "first: line 3, iter 3, as line 1" in err[0]


@pytest.mark.parametrize("deep", ["[" * 100_000 + "]" * 100_000,
                                  '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                  '{"a": ' + '{"b": ' * 100_000 + "1" + "}" * 100_001],
                         ids=["list", "list in a dict", "dicts"])
def test_a_line_nested_too_deep_is_skipped_by_name(tmp_path, capsys, deep):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + deep + "\n" + json.dumps({**GOOD, "iter": 4}) + "\n")
    assert [r["iter"] for r in rundir.read_jsonl(str(path))] == [3, 4]
    assert f"{path} line 2 is not valid JSON; skipped (nested too deep)" in capsys.readouterr().err
    assert len(attribute.load_rollouts(str(path), ENC)) == 6


def test_attributions_of_different_rollouts_are_not_summed(tmp_path):
    a = result([entry(0, 1.0), entry(1, -1.0)])
    assert [e["tracin_score"] for e in plot.summed_scores([a, a])] == [2.0, -2.0]
    other = result([entry(0, 1.0), {**entry(1, -1.0), "completion": "another rollout"}])
    fewer = result([entry(0, 1.0)])
    for b in (other, fewer):
        with pytest.raises(UserError, match="score different rollouts"):
            plot.summed_scores([a, b])
        with pytest.raises(UserError, match="score different rollouts"):
            plot.summed_scores([b, a])


def write_log(run, lines):
    run.mkdir()
    (run / "log.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    return str(run)


def null_or_text_log(tmp_path):
    """A step whose sampling gave NaN/Inf logs reward null; a hand edit may leave text."""
    steps = [{"iter": i, "elapsed": float(i), "reward": r, "step_seconds": s, "selection_rate": 0.5}
             for i, (r, s) in enumerate([(0.2, 1.0), (None, 1.0), (0.4, "x"), (0.6, 3.0)], 1)]
    return write_log(tmp_path / "r", [{"iter": 0, "elapsed": 0.0, "test/accuracy": 0.1}, *steps])


def test_null_or_text_log_values_are_left_out_of_the_table(tmp_path, capsys):
    run = null_or_text_log(tmp_path)
    plot.load_log(run)
    assert "log.jsonl line 4: step_seconds is \"x\", not a number; left out" in capsys.readouterr().err
    summarize.main([run])
    row = [c.strip() for c in capsys.readouterr().out.strip().splitlines()[-1].split("|")[1:-1]]
    assert row[4] == "1.67"  # (1 + 1 + 3) / 3: the text value left out, not a crash


def test_null_or_text_log_values_are_left_out_of_the_figure(tmp_path):
    pytest.importorskip("matplotlib", reason=MATPLOTLIB)
    fig = plot.make_figure([("r", plot.load_log(null_or_text_log(tmp_path)))])
    per_step = [list(l.get_ydata()) for ax in fig.axes for l in ax.get_lines()
                if l.get_label() == "_per step"]
    assert [0.2, 0.4, 0.6] in per_step  # the reward, the null step left out


UNPLACEABLE = pytest.mark.parametrize(
    "step, elapsed", [(10 ** 400, 4.0), (2 ** 53 + 1, 4.0), (-4, 4.0), (4.0, 4.0), (4, float("inf")),
                      (4, "4"), (4, None)],
    ids=["10**400", "2**53+1", "negative", "float", "inf", "text", "null"])


def unplaceable_log(tmp_path, step, elapsed):
    """A run whose log's line 5 has an iter or elapsed that no axis can place."""
    lines = [{"iter": i, "elapsed": float(i), "reward": 0.1 * i, "step_seconds": 1.0} for i in range(4)]
    return write_log(tmp_path / "r", [*lines, {"iter": step, "elapsed": elapsed, "reward": 0.9}])


@UNPLACEABLE
def test_a_log_line_a_figure_cannot_place_is_skipped_by_name(tmp_path, capsys, step, elapsed):
    run = unplaceable_log(tmp_path, step, elapsed)
    assert [l["iter"] for l in plot.load_log(run)] == [0, 1, 2, 3]
    assert "log.jsonl line 5: a line without iter" in capsys.readouterr().err


@UNPLACEABLE
def test_a_log_with_a_line_a_figure_cannot_place_is_drawn(tmp_path, step, elapsed):
    """An iter of 10**400 overflowed the figure (a float holds none that large)."""
    pytest.importorskip("matplotlib", reason=MATPLOTLIB)
    run = unplaceable_log(tmp_path, step, elapsed)
    plot.main([run, f"--out={tmp_path / 'fig.png'}"])
    assert (tmp_path / "fig.png").stat().st_size > 0


def test_two_runs_of_one_name_keep_their_paths_and_one_run_twice_is_refused(tmp_path):
    a, b = tmp_path / "x" / "nll", tmp_path / "y" / "nll"
    assert plot.run_labels([str(tmp_path / "x" / "a"), str(b)]) == ["a", "nll"]
    assert plot.run_labels([str(a), str(b)]) == [str(a), str(b)]
    a.mkdir(parents=True)
    with pytest.raises(UserError, match="given twice"):
        plot.run_labels([str(a), str(tmp_path / "x" / ".." / "x" / "nll")])


def test_a_full_disk_keeps_the_earlier_json_whole_and_names_it(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    rundir.write_json(str(path), {"scores": [1.0, 2.0]}, "it")
    earlier = path.read_bytes()
    real_open = open

    class FullDisk:  # writes a few bytes, then the disk is full
        def __init__(self, name, mode="r", *a, **k):
            self.f = real_open(name, mode, *a, **k)

        def write(self, text):
            self.f.write(text[:5])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
    monkeypatch.setattr(fileio, "open", FullDisk, raising=False)  # where write_json's atomic write opens
    with pytest.raises(OSError, match="No space left on device") as e:
        rundir.write_json(str(path), {"scores": [3.0] * 1000}, "it")
    assert e.value.filename == str(path)
    assert path.read_bytes() == earlier and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


@pytest.mark.parametrize("module, command", [(audit, "--audit=N"), (report, "--html=PATH")])
def test_parts_of_the_attribution_run_alone_say_which_command_runs_them(module, command):
    with pytest.raises(UserError, match=f"python -m analysis.attribute .*{command}"):
        module.main([])


@pytest.mark.parametrize("arg, key", [("--seed=100000000000000000000000", "seed"),
                                      ("--temperature=inf", "temperature")])
def test_sample_refuses_a_number_torch_cannot_take_before_loading(tmp_path, arg, key):
    """Before: an OverflowError from torch.manual_seed; an infinite temperature sampled noise."""
    import sample
    with pytest.raises(UserError, match=f"'{key}' = .* is not allowed"):
        sample.main([f"--ckpt={tmp_path}/none.pt", arg])  # refused before the missing file is read


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
@pytest.mark.parametrize("fails_at", ["write", "close"])
def test_a_full_disk_during_the_html_report_names_it_and_leaves_nothing(tmp_path, monkeypatch,
                                                                        code, fails_at):
    """Before: the error named the temporary file beside the report."""
    path = tmp_path / "report.html"
    scores = [entry(0, 1.0), entry(1, -1.0)]
    res = {**result(scores), "num_train_samples": 2, "max_influence_score": 1.0,
           "mean_influence_score": 0.0, "most_influential_positive": scores[:1],
           "most_influential_negative": scores[1:]}
    sections = [{"question": "q", "completion": "c", "correct": None, "result": res}]
    meta = {"run": "r", "mode": "simple", "n_probe": 4, "layer_filter": "", "top_k": 2,
            "checkpoints": ["ckpt_000001.pt"]}
    report.write_report(str(path), sections, meta)
    earlier = path.read_bytes()
    real_open = open

    class FullDisk:  # the page is too big for what is left (raised by write, or by close's flush)
        def __init__(self, name, *a, **k):
            self.f = real_open(name, *a, **k)

        def write(self, text):
            self.f.write(text[:5])
            if fails_at == "write":
                raise OSError(code, os.strerror(code))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
            if fails_at == "close" and exc[0] is None:
                raise OSError(code, os.strerror(code))
    monkeypatch.setattr(report, "open", FullDisk, raising=False)
    with pytest.raises(OSError) as e:
        report.write_report(str(path), sections, {**meta, "top_k": 1})
    assert e.value.filename == str(path) and e.value.errno == code
    assert "(writing the HTML report)" in e.value.strerror
    assert path.read_bytes() == earlier and [p.name for p in tmp_path.iterdir()] == ["report.html"]


@pytest.mark.parametrize("where", [0, 1, 2])
@pytest.mark.parametrize("extra, fits", [(0, True), (1, False), (20, False)])
def test_a_rollout_beyond_the_models_context_is_refused_naming_its_line(tmp_path, where, extra,
                                                                        fits):
    """Before: 'N tokens exceed block_size=B' from the model, no file or record named. A rollout
    of block_size + 1 tokens fits: its last token is only predicted, as when it was sampled."""
    from data.prompts import encode_prompt
    long = "P" + "x" * 40
    block = len(encode_prompt(ENC, long)) + 3 - 1 - extra  # its completion: 3 tokens
    records = [{**GOOD, "iter": i} for i in range(3)]
    records[where] = {**records[where], "prompts": [long, "P1"]}
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if fits:
        assert len(attribute.load_rollouts(str(path), ENC, block_size=block)) == 9
        return
    with pytest.raises(UserError, match=f"{path} line {where + 1}: a rollout of iter {where} is "
                                        f".* beyond the model's context of {block}: "):
        attribute.load_rollouts(str(path), ENC, block_size=block)
