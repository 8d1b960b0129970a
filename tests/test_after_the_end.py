# A signal that arrives once a script's work is done (its last line printed, the interpreter cleaning
# up) changes nothing: SIGTERM is ignored (exit status 0, as the work finished) and Ctrl-C too, with
# no traceback; before, a SIGTERM then ended the finished run or export with 143 and no word.
# The script sends the signal to itself from an atexit callback, i.e. after main returned.
# Run: python -m pytest -q tests/test_after_the_end.py
import os
import subprocess
import sys

import pytest

from ctrl_c import default_ctrl_c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AFTER = """import atexit, os, signal, sys, time
sys.path.insert(0, {root!r})
def late():  # the signal, once main has returned
    os.kill(os.getpid(), signal.{sig})
    time.sleep(0.3)
    print("still here", flush=True)
atexit.register(late)
sys.argv = [{script!r}, *sys.argv[1:]]
{run}
"""
TOY = "from configurator import cli_main\ncli_main(lambda argv: print('done'))"
EXPORT = "from configurator import cli_main\nimport export\ncli_main(export.main)"


def after_the_end(tmp_path, sig, run, *argv):
    script = tmp_path / "late.py"
    script.write_text(AFTER.format(root=ROOT, sig=sig, script=os.path.join(ROOT, "x.py"), run=run))
    return subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, preexec_fn=default_ctrl_c,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_after_a_script_has_finished_is_ignored(tmp_path, sig):
    p = after_the_end(tmp_path, sig, TOY)
    assert (p.returncode, p.stdout, p.stderr) == (0, "done\nstill here\n", ""), p

