# Tests for configurator.py. Hermetic (temporary config files only, no torch).
# Run with: python -m pytest tests/test_configurator.py -q
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest

from ctrl_c import default_ctrl_c
from configurator import UserError, cli_main, configure

DEFAULTS = {
    "learning_rate": 1e-3,
    "batch_size": 8,
    "compile": False,
    "out_dir": "out",
    "init_from": None,
    "lora_targets": ("c_attn",),
}


def write(tmp_path, text, name="cfg.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_config_file_overrides_and_prints(tmp_path, capsys):
    path = write(tmp_path, "batch_size = 32\nout_dir = 'out/run1'\n")
    cfg = configure(DEFAULTS, [path])
    assert cfg["batch_size"] == 32 and cfg["out_dir"] == "out/run1"
    assert cfg["learning_rate"] == 1e-3                       # untouched keys keep their defaults
    out = capsys.readouterr().out
    assert "Overriding: batch_size = 32" in out
    assert "Overriding: out_dir = out/run1" in out


def test_cli_after_file_wins(tmp_path):
    path = write(tmp_path, "batch_size = 32\n")
    assert configure(DEFAULTS, [path, "--batch_size=4"])["batch_size"] == 4
    assert configure(DEFAULTS, ["--batch_size=4", path])["batch_size"] == 32   # strictly left to right


def test_int_accepted_for_float_becomes_float():
    cfg = configure(DEFAULTS, ["--learning_rate=1"])
    assert cfg["learning_rate"] == 1.0 and type(cfg["learning_rate"]) is float


def test_float_rejected_for_int():
    with pytest.raises(UserError, match=r"batch_size.*expects int.*2\.5.*float"):
        configure(DEFAULTS, ["--batch_size=2.5"])


def test_bool_strictness():
    assert configure(DEFAULTS, ["--compile=True"])["compile"] is True
    with pytest.raises(UserError, match="compile.*expects bool"):
        configure(DEFAULTS, ["--compile=1"])
    with pytest.raises(UserError, match="batch_size.*expects int"):
        configure(DEFAULTS, ["--batch_size=True"])             # bool is an int subclass, still rejected
    with pytest.raises(UserError, match="learning_rate.*expects float"):
        configure(DEFAULTS, ["--learning_rate=False"])


def test_str_without_quotes_and_none_default_accepts_anything():
    cfg = configure(DEFAULTS, ["--out_dir=out/run1", "--init_from=resume"])
    assert cfg["out_dir"] == "out/run1" and cfg["init_from"] == "resume"
    assert configure(DEFAULTS, ["--out_dir='7'"])["out_dir"] == "7"   # quoted literal stays a str
    assert configure(DEFAULTS, ["--out_dir=7"])["out_dir"] == "7"     # a text key takes the text as typed
    assert configure(DEFAULTS, ["--out_dir=True"])["out_dir"] == "True"


def test_list_accepted_for_tuple_default():
    cfg = configure(DEFAULTS, ["--lora_targets=['c_attn','c_proj']"])
    assert cfg["lora_targets"] == ("c_attn", "c_proj")         # converted to the default's type


def test_unknown_cli_key_suggests_closest():
    with pytest.raises(UserError) as e:
        configure(DEFAULTS, ["--learning_rat=0.1"])
    msg = str(e.value)
    assert "unknown config key 'learning_rat' (from command line)" in msg
    assert "did you mean: learning_rate?" in msg


def test_unknown_key_without_close_match():
    with pytest.raises(UserError) as e:
        configure(DEFAULTS, ["--zzzzzz=1"])
    assert "did you mean" not in str(e.value)
    assert "see the defaults at the top of the script" in str(e.value)


def test_missing_config_file(tmp_path):
    missing = str(tmp_path / "nope.py")
    with pytest.raises(UserError, match="config file not found: .*nope.py"):
        configure(DEFAULTS, [missing])


def test_config_file_with_typo_key_names_file(tmp_path):
    path = write(tmp_path, "batch_sise = 16\n")
    with pytest.raises(UserError) as e:
        configure(DEFAULTS, [path])
    assert f"unknown config key 'batch_sise' (from {path}); did you mean: batch_size?" in str(e.value)


def test_config_file_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "batch_size = 4\nout_dir = (\n")
    with pytest.raises(UserError, match=r"cfg\.py, line 2"):
        configure(DEFAULTS, [path])


def test_config_file_may_import_math(tmp_path):
    path = write(tmp_path, "import math\n_base = 2\nlearning_rate = math.pow(10, -_base)\n")
    cfg = configure(DEFAULTS, [path])                          # neither `math` nor `_base` is a key
    assert cfg["learning_rate"] == pytest.approx(0.01)


def test_key_without_value_is_a_flag_only_for_bool_keys():
    assert configure(DEFAULTS, ["--compile"])["compile"] is True  # a plain flag: --compile=True
    assert configure(DEFAULTS, ["--compile", "--compile=False"])["compile"] is False
    for arg in ("--batch_size", "--out_dir", "--init_from"):
        with pytest.raises(UserError, match="--key=value"):
            configure(DEFAULTS, [arg])
    with pytest.raises(UserError, match="unknown config key 'nope'"):
        configure(DEFAULTS, ["--nope=1"])


def test_defaults_not_mutated(tmp_path):
    before = dict(DEFAULTS)
    cfg = configure(DEFAULTS, [write(tmp_path, "batch_size = 64\n"), "--compile=True"])
    assert cfg is not DEFAULTS and cfg["batch_size"] == 64
    assert DEFAULTS == before


def test_cli_main_exits_2_with_one_line_error(capsys):
    def main(argv):
        configure(DEFAULTS, argv)
    with pytest.raises(SystemExit) as e:
        cli_main(main, ["--learning_rat=0.1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown config key 'learning_rat'")
    assert err.count("\n") == 1                                # exactly one line, no traceback


def test_cli_main_passes_argv_and_lets_success_through():
    seen = []
    cli_main(seen.append, ["--batch_size=3"])
    assert seen == [["--batch_size=3"]]


@pytest.mark.parametrize("text, line, kind", [("batch_size = 4\nout_dir = undefined_name\n", 2, "NameError"),
                                               ("x = 1\n\nbatch_size = 8 // 0\n", 3, "ZeroDivisionError"),
                                               ("import no_such_module\n", 1, "ModuleNotFoundError")])
def test_config_file_that_raises_is_one_line_with_file_and_line(tmp_path, text, line, kind):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        configure(DEFAULTS, [path])
    msg = str(e.value)
    assert msg.startswith(f"config file {path}, line {line}: {kind}") and "\n" not in msg


def test_comma_list_for_tuple_key():
    assert configure(DEFAULTS, ["--lora_targets=c_attn,c_fc"])["lora_targets"] == ("c_attn", "c_fc")
    assert configure(DEFAULTS, ["--lora_targets=c_proj"])["lora_targets"] == ("c_proj",)


def test_saved_config_replaced_by_argv_only(capsys):
    saved = {"learning_rate": 0.5, "batch_size": 99, "out_dir": "old", "gone_key": 1}  # gone_key: an older version's
    cfg = configure(DEFAULTS, ["--batch_size=3", "--out_dir=new", "--learning_rate=0.5"], saved=saved)
    assert cfg == {**DEFAULTS, "learning_rate": 0.5, "batch_size": 3, "out_dir": "new"}
    printed = capsys.readouterr().out
    assert printed == "resume: batch_size = 3 (the saved run had 99)\n"   # only the change that matters


def test_resume_reports_each_keys_final_value_once(tmp_path, capsys):
    """The original config file sets batch_size = 8, the command line undoes it (2, as the saved run had):
    nothing is reported for it. A key set three times is reported once, with its final value."""
    path = write(tmp_path, "batch_size = 8\nlearning_rate = 0.1\n")
    saved = {"batch_size": 2, "learning_rate": 0.5, "lora_targets": ["c_attn"]}  # (a list: typed before comparing)
    cfg = configure(DEFAULTS, [path, "--batch_size=2", "--learning_rate=0.2", "--learning_rate=0.3",
                               "--lora_targets=c_attn"], saved=saved)
    assert (cfg["batch_size"], cfg["learning_rate"]) == (2, 0.3)
    assert capsys.readouterr().out == "resume: learning_rate = 0.3 (the saved run had 0.5)\n"
    configure(DEFAULTS, ["--learning_rate=0.3", path], saved=saved)  # the file, given last, wins
    assert capsys.readouterr().out == ("resume: learning_rate = 0.1 (the saved run had 0.5)\n"
                                       "resume: batch_size = 8 (the saved run had 2)\n")


@pytest.mark.parametrize("rank, printed", [(None, True), ("0", True), ("1", False)])
def test_only_rank_zero_prints_the_overrides(monkeypatch, capsys, rank, printed):
    """Under torchrun every process parses the same command line: one copy of the lines is enough."""
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert configure(DEFAULTS, ["--batch_size=4"])["batch_size"] == 4
    assert ("Overriding: batch_size = 4" in capsys.readouterr().out) == printed


PATHS = {"out_dir": "out", "base_ckpt": "", "questions_file": "", "question": "", "html": ""}


@pytest.mark.parametrize("given, want", [("~/x", "HOME/x"), ("~", "HOME"), ("~/", "HOME/"),
                                         ("out/~x", "out/~x"), ("x~/y", "x~/y")])
@pytest.mark.parametrize("key", ["out_dir", "base_ckpt", "questions_file", "html"])
@pytest.mark.parametrize("how", ["command line", "config file"])
def test_a_path_knobs_tilde_is_the_home_directory(tmp_path, monkeypatch, given, want, key, how):
    """Quoted on the command line or written in a config file, no shell expands ~: the run
    wrote into a folder named '~' beside the project."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    arg = f"--{key}={given}" if how == "command line" else write(tmp_path, f"{key} = {given!r}\n")
    cfg = configure(PATHS, [arg])
    assert cfg[key] == want.replace("HOME", str(tmp_path / "home"))


def test_a_tilde_in_text_that_is_no_path_is_kept(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert configure(PATHS, ["--question=~/x"])["question"] == "~/x"


def test_a_tilde_naming_no_user_is_refused():
    with pytest.raises(UserError, match="out_dir '~no_such_user_zz/x' starts with a ~ that "
                                        "names no home directory here"):
        configure(PATHS, ["--out_dir=~no_such_user_zz/x"])


ENDING = """
import atexit, os, signal, sys, time, weakref
sys.path.insert(0, {root!r})
from configurator import UserError, cli_main

class Library:  # torch keeps its operator libraries alive until the interpreter's clean-up
    pass

def ctrl_c():  # Ctrl-C while the interpreter cleans up (torch's atexit finalizers)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)

def main(argv):
    if {how!r} == "atexit":
        atexit.register(ctrl_c)
    else:
        main.keep = Library()
        weakref.finalize(main.keep, ctrl_c)
    print("done")
    if {fails!r}:
        raise UserError("refused")

cli_main(main)
"""


@pytest.mark.parametrize("how", ["atexit", "finalizer"])
@pytest.mark.parametrize("fails, code", [(False, 0), (True, 2)])
def test_ctrl_c_once_a_script_has_ended_adds_no_traceback(tmp_path, how, fails, code):
    """Before: 'Exception ignored in atexit callback ... KeyboardInterrupt' after 'done'."""
    import subprocess
    script = tmp_path / "s.py"
    script.write_text(ENDING.format(root=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), how=how, fails=fails))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       preexec_fn=default_ctrl_c)
    assert p.stdout == "done\n" and p.returncode == code
    assert p.stderr == ("error: refused\n" if fails else "")
