# Questions the attribution cannot take are refused in one line before any work and before any file is
# written: lone surrogates in --question / --completion (what Python makes of bytes that are not UTF-8 on a
# command line), and a --questions_file line longer than the model's context, named by its line number.
# Run: python -m pytest -q tests/test_attribute_inputs.py
import pytest

from analysis import attribute
from configurator import UserError, cli_main
from data.prompts import encode_prompt
from runs.loading import load_policy
from test_tracin_cli import grpo_dir, run  # noqa: F401 (fixtures: a tiny finished GRPO run, copied per test)

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")
MATPLOTLIB = "matplotlib draws the figure: not in requirements.txt (.ci/run installs it)"


@pytest.fixture
def no_work(monkeypatch):
    """Any attribution or audit started fails the test: the refusal must come first."""
    for name in ("find_critical_samples", "audit"):
        monkeypatch.setattr(attribute, name, lambda *a, **k: pytest.fail("work started"))


def refused(run, capsys, *args):
    """cli_main's exit 2 and its one-line message; the run directory as it was."""
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(SystemExit) as e:
        cli_main(attribute.main, [f"--out_dir={run}", "--n_probe=4", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in run.iterdir()) == before  # no JSON, report or figure
    return err


SURROGATES = ["\udcff", "\ud800", "\udfff", "\udc80\udc81"]


@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("s", SURROGATES)
def test_lone_surrogates_in_a_question_are_one_line(run, capsys, no_work, s, where):
    q = {"start": s + "Mia has 2 pears.", "middle": "Mia has" + s + " 2 pears.", "end": "Mia has 2 pears." + s}[where]
    err = refused(run, capsys, f"--question={q}")
    assert f"question holds U+{ord(s[0]):04X}, a lone surrogate" in err
    err = refused(run, capsys, "--question=Mia has 2 pears.", f"--completion=4{s}")
    assert "completion holds U+" in err and "lone surrogate" in err


@pytest.mark.parametrize("line", [1, 3, 6])
@pytest.mark.parametrize("audit", [False, True])
def test_an_over_long_questions_file_line_is_named_before_any_file_is_written(run, tmp_path, capsys, no_work,
                                                                               line, audit):
    lines = ["Mia has 2 pears. How many?", "", "Sam has 3 cards.", "Ava has 1 coin.", "  ", "Leo has 4 books."]
    lines[line - 1] = "Mia has 2 pears and " + "1 more pear and " * 200 + "how many?"
    (tmp_path / "qs.txt").write_text("\n".join(lines) + "\n")
    err = refused(run, capsys, f"--questions_file={tmp_path}/qs.txt", *(["--audit=2"] if audit else []))
    assert f"questions_file {tmp_path}/qs.txt line {line}:" in err and "shorten it" in err


def test_the_context_boundary_is_exact(run):
    """check_fits against the limit written out: prompt + one answer token (or --completion's) + end-of-text
    must fit the context; one token more is refused."""
    model, enc, _ = load_policy(str(sorted(run.glob("ckpt_*.pt"))[-1]))
    block = model.config.block_size
    for completion in ("", "4", "1+2=3\n#### 3"):
        extra = len(enc.encode(completion)) if completion else 1
        cfg = {"completion": completion}
        q = ""
        while len(encode_prompt(enc, q)) < block - 1 - extra:
            q += "7"  # one digit, one token
        assert len(encode_prompt(enc, q)) == block - 1 - extra
        attribute.check_fits(cfg, model, enc, [("--question", q)])  # fits exactly
        with pytest.raises(UserError, match=f"--question: the question is {block - extra} tokens"):
            attribute.check_fits(cfg, model, enc, [("--question", "ok"), ("--question", q + "7")])


def test_a_byte_that_is_not_utf8_on_a_real_command_line_is_one_line(run):
    """The shell passes bytes: Python turns \\xff into U+DCFF, which printing, tokenizing or JSON would choke on."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-m", "analysis.attribute", f"--out_dir={run}".encode(),
                          b"--question=Mia has \xff pears."], cwd=root, capture_output=True,
                         env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert res.returncode == 2, res.stderr
    assert res.stderr.decode() == ("error: question holds U+DCFF, a lone surrogate (a byte that is not UTF-8, from a "
                                   "terminal or file in another encoding?): give it as UTF-8 text\n")


@pytest.fixture
def read_only(monkeypatch):
    """Every file the run module would create inside `root` fails as on a read-only disk (the
    lock, its write probe): a root user's chmod would not stop a write."""
    import builtins
    import errno
    import os
    import fileio
    from runs import rundir
    roots = []

    def guarded(name, mode="r", *a, **k):
        inside = any(os.path.abspath(name).startswith(f"{r}{os.sep}") for r in roots)
        if inside and any(c in mode for c in "wax+"):
            raise OSError(errno.EROFS, "Read-only file system", name)
        return builtins.open(name, mode, *a, **k)
    monkeypatch.setattr(rundir, "open", guarded, raising=False)
    monkeypatch.setattr(fileio, "open", guarded, raising=False)  # the atomic writes (write_json)
    return roots


def test_a_read_only_run_with_every_output_elsewhere_is_attributed(run, tmp_path, read_only,
                                                                   capsys):
    """Before: refused, 'cannot write to out_dir ...: Read-only file system'."""
    read_only.append(str(run))
    before = sorted(p.name for p in run.iterdir())
    out = tmp_path / "elsewhere"
    out.mkdir()
    cli_main(attribute.main, [f"--out_dir={run}", "--n_probe=4", "--question=Mia has 2 pears.",
                              f"--out_json={out}/a.json", f"--html={out}/r.html", "--figure="])
    err = capsys.readouterr().err
    assert f"note: {run} cannot be written: read without its lock" in err
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "r.html"]
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.parametrize("args", [["--out_json=OUT/a.json", "--figure="],    # the report: the run's
                                  ["--html=OUT/r.html", "--figure="],        # the JSON: the run's
                                  ["--out_json=OUT/a.json", "--html=", "--figure=RUN/f.png"]])
def test_a_read_only_run_that_an_output_goes_into_is_refused(run, tmp_path, read_only, capsys,
                                                             no_work, args):
    if "--figure=RUN/f.png" in args:  # without matplotlib the figure is refused for that first
        pytest.importorskip("matplotlib", reason=MATPLOTLIB)
    read_only.append(str(run))
    args = [a.replace("OUT", str(tmp_path)).replace("RUN", str(run)) for a in args]
    err = refused(run, capsys, "--question=Mia has 2 pears.", *args)
    assert f"cannot write to out_dir {run}: Read-only file system" in err


@pytest.mark.parametrize("line", [1, 2])
def test_a_recorded_prompt_beyond_the_context_is_refused_before_any_work(run, capsys, no_work,
                                                                         line):
    import json
    path = run / "rollouts.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    records[line - 1]["prompts"][0] = "1+1=" * 60  # far beyond the tiny model's 128 positions
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    err = refused(run, capsys, "--question=Mia has 2 pears.")
    assert f"{path} line {line}: a rollout of iter {records[line - 1]['iter']} is " in err
    assert "beyond the model's context of 128" in err
