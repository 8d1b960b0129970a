# `python export.py` when something else happens at the same time: a second export into
# the same
# directory (refused: the directory is taken), a merged model a run may be trained on (never
# replaced, refused
# before any work), SIGTERM or Ctrl-C while the model is written and an export killed outright
# (nothing
# partial left, or removed by the next export), a full disk (one line naming the path), a user's
# file in an
# earlier export's directory (named, not hidden behind "...").
# References: the file tree before and after, the exit status and stderr of a real process.
# Run: python -m pytest tests/test_export_safety.py -q
import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers writes the tiny test model directories")
pytest.importorskip("tokenizers", reason="tokenizers trains the test tokenizers")
from configurator import UserError  # noqa: E402
import export  # noqa: E402
from pretrained import hf  # noqa: E402
from test_output_safety import hf_run, no_load, tree  # noqa: E402,F401 (fixtures)
from ctrl_c import default_ctrl_c  # noqa: E402
from test_after_the_end import EXPORT, after_the_end  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_second_export_into_the_same_directory_meanwhile_is_refused(hf_run, tmp_path, monkeypatch,
                                                                       capsys):
    """Two exports at the same moment into one new directory: the second is told it is taken, and
    the first one's adapter is what the directory holds (before, both said 'wrote' and one was
    lost)."""
    _, run = hf_run
    out = str(tmp_path / "adapter")
    real, seen = hf.save_peft_adapter, []

    def while_writing(model, path, *a, **k):  # the second export starts while the first writes
        with pytest.raises(UserError) as e:
            export.main([f"--ckpt={run}/ckpt_000002.pt", f"--adapter_dir={out}"])
        seen.append(str(e.value))
        return real(model, path, *a, **k)
    monkeypatch.setattr(export, "save_peft_adapter", while_writing)
    export.main([f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={out}"])
    assert seen and seen[0].startswith(f"adapter_dir {out} is taken: another export (PID "
                                       f"{os.getpid()})")
    assert "\n" not in seen[0] and capsys.readouterr().out.count("wrote ") == 1
    assert json.load(open(f"{out}/{hf.EXPORT_MARK}"))["iter"] == 1
    assert sorted(os.listdir(tmp_path)) == ["adapter"]  # the lock beside it is gone


def test_an_export_in_another_process_holds_the_directory_until_it_ends(hf_run, tmp_path, no_load):
    _, run = hf_run
    out = str(tmp_path / "merged")
    code = (f"import time\nfrom export import claimed\n"
            f"with claimed({out!r}, 'merged_dir'):\n print('held', flush=True)\n time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"merged_dir {out} is taken: another export \\(PID "
                                            f"{holder.pid}\\)"):
            export.main([f"--out_dir={run}", f"--adapter_dir={tmp_path}/a", "--merged=True",
                         f"--merged_dir={out}"])
        assert not os.path.exists(out) and not os.path.exists(tmp_path / "a")
    finally:
        holder.kill()
        holder.wait()
    # the kernel let go of the killed holder's lock: never stale
    with export.claimed(out, "merged_dir"):
        pass
    assert os.listdir(tmp_path) == []


def test_a_merged_model_is_never_replaced_and_refused_before_any_work(hf_run, tmp_path,
                                                                      monkeypatch):
    _, run = hf_run
    merged = str(tmp_path / "merged")
    export.main([f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={tmp_path}/a", "--merged=True",
                 f"--merged_dir={merged}"])
    before = tree(str(tmp_path))
    def loaded(*a, **k):
        raise AssertionError("loaded before the refusal")
    monkeypatch.setattr(export, "load_checkpoint", loaded)
    monkeypatch.setattr(export, "load_policy", loaded)
    with pytest.raises(UserError, match=f"merged_dir {merged} holds an earlier merged model "
                                        "\\(iter 1 of .*"
                                        "ckpt_000001.pt\\); a run trained on it .* is never "
                                        "replaced"):
        export.main([f"--ckpt={run}/ckpt_000002.pt", f"--adapter_dir={tmp_path}/a", "--merged=True",
                     f"--merged_dir={merged}"])
    assert tree(str(tmp_path)) == before


SLOW_WRITE = """import os, sys, time
import safetensors.torch
real = safetensors.torch.save_file
def slow(tensors, path, metadata=None):  # half a file written, then the process waits to be stopped
    if os.path.basename(path) != os.environ.get("SLOW_FILE", os.path.basename(path)):
        return real(tensors, path, metadata=metadata)
    open(path, "wb").write(b"x" * 4096)
    print("writing", flush=True)
    time.sleep(60)
safetensors.torch.save_file = slow
from configurator import cli_main
import export  # noqa: E402
cli_main(export.main, sys.argv[1:])
"""


@pytest.mark.parametrize("sig, rc, said", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                            (signal.SIGINT, 130, "interrupted (Ctrl-C)")])
@pytest.mark.parametrize("merged", [False, True])
def test_a_stopped_export_leaves_nothing_partial(hf_run, tmp_path, sig, rc, said, merged):
    _, run = hf_run
    out = tmp_path / "out"
    out.mkdir()
    argv = [f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={out}/a"]
    if merged:  # an earlier adapter, written again whole; the merged model is stopped half-way
        argv += ["--merged=True", f"--merged_dir={out}/m"]
        export.main(argv[:2])
    slow = {"SLOW_FILE": "model.safetensors"} if merged else {}
    before = tree(str(out))
    p = subprocess.Popen([sys.executable, "-c", SLOW_WRITE, *argv], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **slow}, preexec_fn=default_ctrl_c)
    try:
        while "writing" not in (line := p.stdout.readline()):
            assert line, p.stderr.read()
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == rc and err.strip().splitlines()[-1].startswith(said), err
    assert set(tree(str(out))) == set(before), sorted(tree(str(out)))  # no partial, no lock left


def test_what_an_export_killed_outright_left_is_removed_by_the_next(hf_run, tmp_path, capsys):
    _, run = hf_run
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its PID names no running process now
    partial = tmp_path / f".adapter.{dead.pid}.k9x2abcd.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"x" * 1000)
    # a live process's: it may still write
    live = tmp_path / f".adapter.{os.getppid()}.abcdefgh.partial"
    live.mkdir()
    export.main([f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={tmp_path}/adapter"])
    said = capsys.readouterr().out
    assert f"removed {partial}: a partial export left by process {dead.pid}" in said
    assert sorted(os.listdir(tmp_path)) == sorted(["adapter", live.name])


def test_an_earlier_export_moved_aside_by_a_killed_export_is_put_back(hf_run, tmp_path):
    _, run = hf_run
    out = tmp_path / "adapter"
    export.main([f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={out}"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    aside = tmp_path / f".adapter.{dead.pid}.k9x2abcd.partial.old"
    # killed between moving the earlier export aside and putting the new one in place
    os.rename(out, aside)
    first = tree(str(aside))
    hf.remove_stale_partials(str(out))
    assert tree(str(out)) == {k.replace(str(aside), str(out)): v for k, v in first.items()}
    assert os.listdir(tmp_path) == ["adapter"]


@pytest.mark.parametrize("error", [
    OSError(28, "No space left on device"),
    "SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)"])
@pytest.mark.parametrize("key", ["adapter_dir", "merged_dir"])
def test_a_full_disk_is_one_line_naming_the_path(hf_run, tmp_path, monkeypatch, error, key):
    from safetensors import SafetensorError
    import safetensors.torch
    _, run = hf_run
    exc = error if isinstance(error, OSError) else SafetensorError(error.split(": ", 1)[1])
    out = str(tmp_path / key)
    real = safetensors.torch.save_file

    def full(tensors, path, metadata=None):
        if key == "adapter_dir" or "adapter" not in os.path.basename(path):
            open(path, "wb").write(b"x" * 100)  # a part written, then the disk is full
            raise exc
        return real(tensors, path, metadata=metadata)
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(UserError) as e:
        export.main([f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={tmp_path}/adapter_dir",
                     "--merged=True", f"--merged_dir={tmp_path}/merged_dir"])
    msg = str(e.value)
    assert msg.startswith(f"cannot write {key} {out}: ") and "No space left on device" in msg
    assert "\n" not in msg
    left = sorted(os.listdir(tmp_path))
    assert left == (["adapter_dir"] if key == "merged_dir" else []), left  # no partial, no lock


@pytest.mark.parametrize("users", [["notes.txt"], ["a_first.txt"], ["zz.txt", "adapter.md"],
                                   [f"mine_{i}.txt" for i in range(12)], [".hidden"]])
def test_the_refusal_names_a_users_files_in_an_earlier_export(hf_run, tmp_path, no_load, users):
    _, run = hf_run
    out = tmp_path / "adapter"
    out.mkdir()
    own = set(sorted(hf.EXPORT_FILES)[:6]) | {hf.EXPORT_MARK}
    for name in own:
        (out / name).write_text("{}")
    for name in users:
        (out / name).write_text("mine")
    with pytest.raises(UserError, match="holds files this command did not write") as e:
        export.main([f"--out_dir={run}", f"--adapter_dir={out}"])
    shown = str(e.value)
    assert all(name in shown for name in sorted(users)[:8]), shown
    if len(users) + len(own) > 8:
        assert f"and {len(users) + len(own) - 8} more" in shown


def test_a_refused_export_leaves_no_folder_behind(hf_run, tmp_path):
    """A mistyped run is refused before any folder is made; a checkpoint refused after the outputs
    were claimed (NaN weights) leaves none of the folders made for them (before: an empty typo_run/,
    and h/a/b/ of --adapter_dir=h/a/b/c)."""
    import shutil
    from runs.checkpoint import load_checkpoint, save_checkpoint
    _, run = hf_run
    with pytest.raises(UserError, match="checkpoint not found"):
        export.main([f"--out_dir={tmp_path}/typo_run"])
    assert os.listdir(tmp_path) == []
    copy = str(tmp_path / "run")
    shutil.copytree(run, copy)
    ckpt = load_checkpoint(f"{copy}/ckpt_000001.pt")
    next(iter(ckpt["lora"].values())).fill_(float("nan"))  # a diverged run
    save_checkpoint(ckpt, f"{copy}/ckpt_000001.pt")
    before = tree(str(tmp_path))
    with pytest.raises(UserError, match=r"ckpt_000001.pt: LoRA weight .* holds NaN/Inf") as e:
        export.main([f"--ckpt={copy}/ckpt_000001.pt", f"--adapter_dir={tmp_path}/a/b/c",
                     "--merged=True", f"--merged_dir={tmp_path}/m"])
    assert "\n" not in str(e.value)
    assert tree(str(tmp_path)) == before  # no adapter, no merged model, no a/ nor a/b/, no lock


def test_a_sigterm_after_an_export_has_finished_is_ignored(hf_run, tmp_path):
    """Before: exit 143 and no word, the export written whole."""
    _, run = hf_run
    argv = [f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={tmp_path}/a"]
    p = after_the_end(tmp_path, "SIGTERM", EXPORT, *argv)
    assert p.returncode == 0 and p.stdout.endswith("still here\n") and p.stderr == "", p
    assert (tmp_path / "a" / "adapter_config.json").is_file()
