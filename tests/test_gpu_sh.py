# bench/gpu.sh, the GPU measurements in one command, checked where no GPU is: it stops at once, in
# one line, without one; every command runs with the interpreter $PYTHON names; and every knob its
# commands pass is one the script takes, of the right type (a typo found here costs no device time).
# Reference: each script's own configure and validation.
# Run: python -m pytest -q tests/test_gpu_sh.py
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch

from configurator import configure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = open(os.path.join(ROOT, "bench", "gpu.sh")).read()


def commands(script):
    """Each `"$PYTHON" ...` command of the script, its continuation lines joined, as argv lists."""
    joined = re.sub(r"\\\n\s*", " ", script)
    found = []
    for line in joined.splitlines():
        at = line.find('"$PYTHON" ')
        if at < 0 or line.lstrip().startswith("#"):
            continue
        argv = shlex.split(line[at:].split("2>")[0].split("|")[0].replace('"$OUT', '"/tmp/out'))
        found.append(argv[1:])
    return found


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_stops_in_one_line(tmp_path):
    # this interpreter, not the `python` on PATH (one without torch would print a traceback)
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", os.path.join(ROOT, "bench", "gpu.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and done.stderr.strip() == "bench/gpu.sh needs a CUDA GPU"
    assert not (tmp_path / "out").exists()  # nothing made


def test_every_command_runs_with_the_interpreter_it_is_given():
    """A bare `python` runs the first one on PATH, not $PYTHON, and escapes the knob check below."""
    code = [line for line in SCRIPT.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"\bpython ", line)]
    assert "PYTHON=${PYTHON:-python}" in code


def test_every_knob_it_passes_is_known(monkeypatch):
    import train_grpo
    from bench import run as bench
    monkeypatch.chdir(ROOT)
    cmds = commands(SCRIPT)
    grpo = [c[1:] for c in cmds if c[0] == "train_grpo.py"]
    rows = [c[2:] for c in cmds if c[:2] == ["-m", "bench"]]
    assert len(grpo) == 1 and len(rows) == 2 and ["-m", "bench.step_limit", "/tmp/out/run", "--device=cuda"] in cmds
    cfg = configure(train_grpo.defaults, grpo[0])
    assert cfg["compile"] is True and cfg["max_iters"] == 3 and cfg["max_iters"] % cfg["ckpt_interval"] == 0
    for argv in rows:
        cfg = configure(bench.defaults, argv)
        bench.check_knobs(cfg)
        assert set(cfg["rows"].split(",")) <= set(bench.ROWS), cfg["rows"]
        assert cfg["compile"] in ("", "default", *torch._inductor.list_mode_options())
    assert "--compile=reduce-overhead" in rows[0]
