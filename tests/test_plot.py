# Tests for analysis/plot.py. Run: python -m pytest tests/test_plot.py -q
# Reference: two hand-written log.jsonl files (a standard run and a TracIn run); the figure must show
# exactly the points written there. matplotlib is optional: the tests that draw skip without it.
import json
import sys

import pytest

from analysis import plot
from configurator import UserError

# (iter, elapsed, accuracy) of the evaluations written below: step 0 and every 5 steps
STD_EVALS = [(0, 0.0, 0.40), (5, 2.5, 0.55), (10, 5.0, 0.62)]  # 0.5 s per step
TR_EVALS = [(0, 0.0, 0.40), (5, 7.5, 0.50), (10, 15.0, 0.71)]  # 1.5 s per step


def fake_log(evals, step_seconds, tracin):
    acc = {it: a for it, _, a in evals}
    lines = [{"iter": 0, "elapsed": 0.0, "test/accuracy": acc[0]}]
    for it in range(1, 11):
        line = {"iter": it, "elapsed": it * step_seconds, "step_seconds": step_seconds, "reward": 0.1 * (it % 4)}
        if tracin:
            line.update(selection_rate=0.3 + 0.01 * it, n_selected=10)
        if it in acc:
            line["test/accuracy"] = acc[it]
        lines.append(line)
    return lines


def write(run, lines, tail="\n"):
    run.mkdir()
    (run / "log.jsonl").write_text("\n".join(json.dumps(l) for l in lines) + tail)
    return str(run)


@pytest.fixture
def runs(tmp_path):
    return (write(tmp_path / "std_s1", fake_log(STD_EVALS, 0.5, tracin=False)),
            write(tmp_path / "tr_s1", fake_log(TR_EVALS, 1.5, tracin=True)))


def lines_of(ax, label):
    return [ln for ln in ax.get_lines() if ln.get_label() == label]


def test_cli_writes_png(runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread
    out = tmp_path / "fig.png"
    plot.main([*runs, f"--out={out}", "--labels=a,b"])
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(str(out)).shape[:2] == (1200, 1200)  # 12 x 12 inches at 100 dpi


def test_figure_shows_the_logged_points(runs):
    pytest.importorskip("matplotlib")
    fig = plot.make_figure([(name, plot.load_log(d)) for name, d in zip(["std", "tr"], runs)])
    ax = fig.axes  # row-major: reward, accuracy, selection rate, step time; x = steps, wall time
    assert len(ax) == 8
    for label, evals in (("std", STD_EVALS), ("tr", TR_EVALS)):
        (by_step,), (by_time,) = lines_of(ax[2], label), lines_of(ax[3], label)
        assert list(by_step.get_xdata()) == [e[0] for e in evals]
        assert list(by_time.get_xdata()) == [e[1] for e in evals]
        assert list(by_step.get_ydata()) == pytest.approx([e[2] for e in evals])
        assert by_step.get_marker() == "o"
    # standard vs TracIn at a glance: solid blue vs dashed orange
    (std,), (tr,) = lines_of(ax[0], "std"), lines_of(ax[0], "tr")
    assert std.get_linestyle() == "-" and tr.get_linestyle() == "--"
    (r, _, b, _), (r2, _, b2, _) = std.get_color(), tr.get_color()
    assert b > r and r2 > b2
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["std (standard)", "tr (TracIn)"]
    # selection rate: only the TracIn run has one; the standard run gets a legend note instead
    assert not lines_of(ax[4], "std")
    (sel,) = lines_of(ax[4], "tr")
    assert list(sel.get_xdata()) == list(range(1, 11))
    assert sel.get_ydata()[0] == pytest.approx(0.31)  # trailing average: the first point is itself
    assert any("all rollouts" in t.get_text() for t in ax[4].get_legend().get_texts())
    # reward: a faint per-step line under the moving average, both at steps 1..10
    raw = [ln for ln in ax[0].get_lines() if ln.get_label() == "_per step" and ln.get_linestyle() == "-"]
    assert [0.1 * (it % 4) for it in range(1, 11)] in [pytest.approx(list(ln.get_ydata())) for ln in raw]


def test_moving_average():
    assert plot.moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert plot.moving_average([2.0, 4.0, 6.0], 10) == [2.0, 3.0, 4.0]


def test_bad_input(runs, tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(UserError, match="nope is not a directory"):
        plot.load_log(missing)
    (tmp_path / "nolog").mkdir()
    with pytest.raises(UserError, match="no log.jsonl in"):
        plot.load_log(str(tmp_path / "nolog"))
    with pytest.raises(UserError, match="empty/log.jsonl holds no log line"):
        plot.load_log(write(tmp_path / "empty", [], tail=""))
    with pytest.raises(UserError, match="2 names for 1 run"):
        plot.plot_runs([runs[0]], str(tmp_path / "x.png"), labels=["a", "b"])
    with pytest.raises(UserError, match="bad argument"):
        plot.main([runs[0], "--outt=x.png"])
    with pytest.raises(UserError, match="no run directory"):
        plot.main([])


def test_half_written_last_line_is_skipped(tmp_path):
    run = write(tmp_path / "live", fake_log(STD_EVALS, 0.5, tracin=False))
    with open(f"{run}/log.jsonl", "a") as f:
        f.write('{"iter": 11, "rew')  # a run still writing
    assert [l["iter"] for l in plot.load_log(run)] == list(range(11))


def test_without_matplotlib(runs, tmp_path, monkeypatch):
    # None in sys.modules makes `import matplotlib...` raise ImportError, as if it were not installed
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(UserError, match="pip install matplotlib"):
        plot.plot_runs(list(runs), str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


def test_malformed_lines_anywhere_are_skipped_with_a_warning(tmp_path, capsys):
    run = write(tmp_path / "run", fake_log(STD_EVALS, 0.5, tracin=False))
    text = (tmp_path / "run" / "log.jsonl").read_text().splitlines(keepends=True)
    text[3] = text[3][:20] + "\n"                     # line 4 (iter 3) cut short
    text.insert(6, "[1, 2]\n")                        # line 7: JSON, but not a log line
    text.insert(8, '{"note": "no iter"}\n')            # line 9: a dict without iter and elapsed
    (tmp_path / "run" / "log.jsonl").write_text("".join(text))
    assert [l["iter"] for l in plot.load_log(run)] == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]
    out = capsys.readouterr().err
    assert "log.jsonl line 4 is not valid JSON" in out and "log.jsonl line 7 is not valid JSON" in out
    assert "line 9: a line without iter (a whole number" in out


@pytest.mark.parametrize("second_start", [0, 4])
def test_two_runs_in_one_log_are_an_error(tmp_path, second_start):
    log = fake_log(STD_EVALS, 0.5, tracin=False)
    run = write(tmp_path / "mixed", log + log[second_start:])  # a second run appended, from its start or a step
    with pytest.raises(UserError, match=f"{run}/log.jsonl has two lines for iteration {second_start}:"):
        plot.load_log(run)


def test_all_lines_malformed_is_an_error(tmp_path):
    run = str(tmp_path / "bad")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "log.jsonl").write_text('{"iter": 0,\nnull\n')
    with pytest.raises(UserError, match="holds no log line"):
        plot.load_log(run)


def test_figure_of_logs_without_evaluations(tmp_path):
    pytest.importorskip("matplotlib")
    steps_only = [l for l in fake_log(STD_EVALS, 0.5, tracin=False) if "test/accuracy" not in l]  # iters 1-4, 6-9
    start_only = fake_log(TR_EVALS, 1.5, tracin=True)[:1]                                       # the iter-0 line
    runs = [("steps", plot.load_log(write(tmp_path / "steps", steps_only))),
            ("start", plot.load_log(write(tmp_path / "start", start_only)))]
    ax = plot.make_figure(runs).axes
    (acc,) = lines_of(ax[2], "steps")                 # an empty accuracy line: the legend still names the run
    assert list(acc.get_xdata()) == []
    (reward,) = lines_of(ax[0], "steps")
    assert list(reward.get_xdata()) == [1, 2, 3, 4, 6, 7, 8, 9]
    (acc,) = lines_of(ax[2], "start")                 # one evaluation, no step
    assert list(acc.get_xdata()) == [0] and list(acc.get_ydata()) == [0.40]
    assert not lines_of(ax[0], "start")


def test_curriculum_runs_show_their_level(tmp_path):
    """A curriculum run (it logs curriculum/level) is dash-dotted green, and with no TracIn run the
    third row shows the level it trained at, at exactly the logged steps."""
    pytest.importorskip("matplotlib")
    cur = fake_log(STD_EVALS, 0.5, tracin=False)
    for line in cur[1:]:
        line["curriculum/level"] = 1 + (line["iter"] > 4) + (line["iter"] > 8)
    logs = [("std", fake_log(STD_EVALS, 0.5, tracin=False)), ("cur", cur)]
    fig = plot.make_figure(logs)
    ax = fig.axes
    assert ax[4].get_ylabel() == "curriculum level"
    assert not lines_of(ax[4], "std") and ax[4].get_legend() is None
    (level,) = lines_of(ax[4], "cur")
    raw = [ln for ln in ax[4].get_lines() if ln.get_label() == "_per step"]
    assert list(raw[0].get_ydata()) == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    (c,) = lines_of(ax[0], "cur")
    r, g, b, _ = c.get_color()
    assert c.get_linestyle() == "-." and g > r and g > b
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["std (standard)", "cur (curriculum)"]
    assert "curriculum (dash-dotted)" in fig._suptitle.get_text()


def attribution_json(path, scores, audit=False):
    entries = [{"index": i, "iter": i, "tracin_score": s, "advantage": 1.0, "defective": i == 0, "completion": f"c{i}"}
               for i, s in enumerate(scores)]
    obj = {"wrong": [1, 2], "result": {"scores": entries}} if audit else {"scores": entries, "question": "Q?"}
    path.write_text(json.dumps(obj))
    return str(path)


def test_influence_figure_from_tracin_json(tmp_path, monkeypatch, capsys):
    """analysis/plot.py draws the slide figure again from analysis.attribute's JSON files (an attribution, an audit): the
    points are the scores summed per rollout over the files, the title the question."""
    pytest.importorskip("matplotlib")
    one = attribution_json(tmp_path / "a.json", [1.0, -2.0, 0.5])
    two = attribution_json(tmp_path / "b.json", [0.25, 3.0, -1.0], audit=True)
    plot.main([one, f"--out={tmp_path / 'one.png'}"])
    assert (tmp_path / "one.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    seen = {}
    real = plot.influence_figure
    monkeypatch.setattr(plot, "influence_figure", lambda e, t, k=3: seen.update(e=e, t=t) or real(e, t, k))
    plot.main([one, two, f"--out={tmp_path / 'two.png'}"])
    assert {e["index"]: e["tracin_score"] for e in seen["e"]} == {0: 1.25, 1: 1.0, 2: -0.5}
    assert "2 attributions" in seen["t"] and "two.png" in capsys.readouterr().out
    plot.main([one, f"--out={tmp_path / 'three.png'}"])
    assert seen["t"] == "Q?"


@pytest.mark.parametrize("content, message", [("[1]", "holds no TracIn scores"), ("{", "not a readable JSON file"),
                                              ('{"scores": []}', "holds no TracIn scores")])
def test_bad_tracin_json_is_one_line(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(UserError, match=message):
        plot.main([str(bad), f"--out={tmp_path / 'x.png'}"])
    with pytest.raises(UserError, match="either run directories or analysis.attribute's JSON files"):
        plot.main([str(bad), str(tmp_path), f"--out={tmp_path / 'x.png'}"])
    assert not (tmp_path / "x.png").exists()


class FakeFigure:
    """savefig as matplotlib's: the format and the metadata written into the file (no matplotlib
    needed)."""
    def savefig(self, path, format=None, metadata=None):
        with open(path, "w") as f:
            f.write(f"{format} {metadata}")


@pytest.mark.parametrize("name", ["plot.png", "plot.pdf", "plot.svg", "plot.jpg", "Plot.PNG"])
def test_a_file_plot_did_not_write_is_never_overwritten(runs, tmp_path, name):
    out = tmp_path / name
    out.write_bytes(b"a user's figure")
    with pytest.raises(UserError, match="exists and was not written by analysis.plot"):
        plot.main([*runs, f"--out={out}"])
    assert out.read_bytes() == b"a user's figure"


@pytest.mark.parametrize("name", ["plot.xyz", "plot", "plot.png.txt", "plot.pgf"])
def test_a_format_matplotlib_cannot_write_is_refused_before_any_log_is_read(tmp_path, name):
    with pytest.raises(UserError, match="matplotlib cannot write"):
        plot.main([str(tmp_path / "not_a_run"), f"--out={tmp_path / name}"])


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg"])
def test_plot_replaces_its_own_figure(runs, tmp_path, fmt, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"fig.{fmt}"
    plot.main([*runs, f"--out={out}"])
    first = out.stat().st_mtime_ns
    plot.main([*runs, f"--out={out}"])  # the same command again: its own figure is replaced
    assert out.stat().st_mtime_ns >= first and capsys.readouterr().out.count(f"wrote {out}") == 2


def test_save_figure_never_replaces_a_file_that_appears_meanwhile(tmp_path):
    from analysis.outputs import save_figure
    out = tmp_path / "fig.png"
    save_figure(FakeFigure(), str(out), plot.RUNS_MARK, plot.written_by_plot, "analysis.plot")
    assert plot.RUNS_MARK in out.read_text() and plot.written_by_plot(str(out))
    # its own: again
    save_figure(FakeFigure(), str(out), plot.RUNS_MARK, plot.written_by_plot, "analysis.plot")
    out.write_text("someone else's, written after the check")
    with pytest.raises(UserError, match="appeared while it was written"):
        save_figure(FakeFigure(), str(out), plot.RUNS_MARK, plot.written_by_plot, "analysis.plot")
    assert out.read_text() == "someone else's, written after the check"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]  # no temporary file left
