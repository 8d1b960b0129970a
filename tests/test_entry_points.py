# Every `python -m ...` entry point and top-level script: Ctrl-C while it is still importing is one
# line and exit
# status 130, not a traceback; tracin.py's command line runs analysis.attribute without importing it
# back.
# A sitecustomize shim makes one import sleep and says so; SIGINT is sent then (no model is built,
# nothing
# is timed). Run: python -m pytest -q tests/test_entry_points.py
import ast
import os
import signal
import subprocess
import sys
import time

import pytest

from ctrl_c import default_ctrl_c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIM = '''import os, sys, time
class _Slow:  # sleeps in the import of $SLOW_IMPORT, after saying so on stderr
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("SLOW_IMPORT"):
            sys.stderr.write("SLOW IMPORT " + name + "\\n")
            sys.stderr.flush()
            time.sleep(30)
        return None
sys.meta_path.insert(0, _Slow())
'''


def interrupt_during_import(tmp_path, argv, slow):
    (tmp_path / "sitecustomize.py").write_text(SHIM)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SLOW_IMPORT": slow, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_ctrl_c)
    try:
        first = p.stderr.readline()
        assert first.startswith("SLOW IMPORT"), first + p.stderr.read()
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    return p.returncode, err


@pytest.mark.parametrize("argv, slow", [
    (["export.py", "--out_dir=x"], "torch"),
    (["-m", "analysis.countdown_demo", "x"], "torch"),
    (["-m", "bench.predict", "config/gsm8k_qwen15b.py"], "torch"),
    (["-m", "bench"], "torch"),
    (["-m", "analysis.plot", "x"], "runs.rundir"),
    (["-m", "analysis.summarize", "x"], "runs.rundir"),
    (["-m", "analysis.attribute", "--out_dir=x"], "torch"),
    (["train_grpo.py"], "torch"),
])
def test_ctrl_c_while_importing_is_one_line(tmp_path, argv, slow):
    rc, err = interrupt_during_import(tmp_path, argv, slow)
    assert rc == 130 and err.splitlines() == ["interrupted (Ctrl-C) while starting up: nothing was "
                                              "done"], err


def test_quiet_start_acts_only_for_the_script_run():
    """A script asks for its start-up Ctrl-C in one line, quiet_start(__name__): imported (a test, a
    tool, another script) nothing changes; run as a script, the one-line handler until cli_main."""
    import configurator
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (not nohup's)
    try:
        for name in ("train_grpo", "analysis.plot", "my_demo"):
            configurator.quiet_start(name)
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, name
        configurator.quiet_start("__main__")
        assert signal.getsignal(signal.SIGINT) is configurator._interrupted_while_starting
    finally:
        signal.signal(signal.SIGINT, before)


IMPORTS = "import {}; import signal; print(signal.getsignal(signal.SIGINT))"


@pytest.mark.parametrize("modules", ["grpo, tracin, model, lora, ghost, rewards",
                                     "configurator, train_grpo, sample, analysis.plot"])
def test_importing_the_lecture_or_a_script_changes_no_signal_handler(modules):
    """Before: importing any file that imported configurator replaced SIGINT in a student's own
    script (a later Ctrl-C was os._exit(130): no traceback, no clean-up)."""
    default = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731 (not ignored: nohup)
    r = subprocess.run([sys.executable, "-c", IMPORTS.format(modules)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=default)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(signal.default_int_handler), r.stdout


def test_tracin_imports_nothing_from_the_tools_that_import_it():
    """tracin.py is imported by analysis.attribute and analysis.audit: it must not import them back
    (a cycle)."""
    tree = ast.parse(open(os.path.join(ROOT, "tracin.py")).read())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [n for n in names if n == "analysis" or n.startswith("analysis.")], names


def test_tracin_py_names_the_attribution_command_line(tmp_path):
    """The lecture file reaches no tool: run as a script, it names the command that attributes."""
    argv = [sys.executable, "tracin.py", f"--out_dir={tmp_path / 'none'}", "--question=x"]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1 and "python -m analysis.attribute --out_dir=RUN" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
