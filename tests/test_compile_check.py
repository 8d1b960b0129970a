# scale/compiled.check_compile, the start-up check of compile=True on CPU, against what inductor
# will do: build C++ with the compiler CXX names (else g++). A compiler that exists but cannot
# build, or a CXX naming no program, is one line naming the compiler and the fix; the build is tried
# once per process per compiler. A misspelt device is blamed as a device, not on compile.
# References: fake compilers written here (a script that fails; one that logs its calls), and the
# real g++ where there is one.
# Run: python -m pytest -q tests/test_compile_check.py
import os
import shutil

import pytest

import train_grpo
from configurator import UserError
from scale import compiled


@pytest.fixture(autouse=True)
def untried(monkeypatch):
    """Every test starts with no compiler tried (the per-process memory set aside, restored)."""
    monkeypatch.setattr(compiled, "TRIED_COMPILERS", {})


def fake_compiler(tmp_path, name, exit_code):
    """An executable that logs each call to tmp_path/calls, exits with exit_code, writes nothing."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\n"
                    f"echo 'fatal error: no such file: stdio.h' >&2\nexit {exit_code}\n")
    path.chmod(0o755)
    return str(path)


def calls(tmp_path):
    log = tmp_path / "calls"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.skipif(os.name != "posix", reason="the fake compiler is a shell script")
@pytest.mark.parametrize("exit_code", [1, 0])  # 0: claims success but builds nothing
def test_a_compiler_that_does_not_work_is_one_line_naming_it(tmp_path, monkeypatch, exit_code):
    cxx = fake_compiler(tmp_path, "broken-c++", exit_code)
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(UserError) as e:
        compiled.check_compile("cpu")
    msg = str(e.value)
    assert "\n" not in msg and cxx in msg and "compile=False" in msg and "CXX" in msg
    assert len(calls(tmp_path)) == 1
    with pytest.raises(UserError):  # asked again: the answer is remembered, not built again
        compiled.check_compile("cpu")
    assert len(calls(tmp_path)) == 1


def test_cxx_naming_no_compiler_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(UserError, match="no-such-c\\+\\+-compiler") as e:
        compiled.check_compile("cpu")
    assert "\n" not in str(e.value) and "compile=False" in str(e.value)


@pytest.mark.skipif(not shutil.which("g++"), reason="no g++ here")
def test_a_working_compiler_passes_and_is_tried_once(monkeypatch):
    import subprocess
    monkeypatch.delenv("CXX", raising=False)
    runs, real_run = [], subprocess.run
    monkeypatch.setattr(subprocess, "run",
                        lambda *a, **k: runs.append(a[0][0]) or real_run(*a, **k))
    assert compiled.check_compile("cpu") is None and compiled.check_compile("cpu") is None
    assert runs == ["g++"]  # built once, remembered for the process


@pytest.mark.parametrize("device", ["cpu0", "gpu", "cuda0", "CPU"])
def test_a_misspelt_device_is_blamed_not_compile(device, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")  # compile would fail too: device first
    with pytest.raises(UserError, match=f"unknown device '{device}'"):
        compiled.check_compile(device)


def test_train_grpo_blames_the_device(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(UserError, match="unknown device 'cpu0'") as e:
        train_grpo.main([f"--out_dir={tmp_path / 'run'}", "--compile=True", "--device=cpu0"])
    assert "compile" not in str(e.value)
