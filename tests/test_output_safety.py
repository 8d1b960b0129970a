# Nothing a user made is removed or overwritten by `python export.py`: every clash of an output
# path (a file, a filled directory, a symbolic link, a place that takes no file, two outputs on one path, a
# checkpoint of another run) is refused before the model is loaded and before anything is written; a
# user's <target>.tmp survives; an export while the run is locked is refused; the iteration is named.
# Run: python -m pytest tests/test_output_safety.py -q
# References: the file tree before and after (every path and its bytes), and peft-free checks of
# what export writes (adapter_config.json, the mark naming the checkpoint and iteration).
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers writes the tiny test model directories")
pytest.importorskip("tokenizers", reason="tokenizers trains the test tokenizers")
from configurator import UserError  # noqa: E402
from hf_dirs import make_dir  # noqa: E402
import export  # noqa: E402
from pretrained import hf  # noqa: E402
from runs import rundir  # noqa: E402


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """A 2-step GRPO run on a tiny random qwen2 directory, a checkpoint per step: (base, run)."""
    import train_grpo
    from data.gsm_synth.prepare import prepare
    base = str(tmp_path_factory.mktemp("qwen"))
    make_dir(base, "qwen2")
    data = prepare(steps=1, max_operand=5, ops="+", n_train=60, n_val=10, n_test=10, num_merges=20,
                   verbose=False, root=str(tmp_path_factory.mktemp("data")))
    run = str(tmp_path_factory.mktemp("runs") / "run")
    train_grpo.main([f"--base_ckpt={base}", f"--data_dir={data}", f"--out_dir={run}", "--max_iters=2",
                     "--batch_size=2", "--group_size=2", "--max_new_tokens=6", "--eval_n=2", "--ckpt_interval=1",
                     "--learning_rate=0.05", "--lora_targets=('q_proj','v_proj')"])
    return base, run


def tree(*roots):
    """Every path under roots with its bytes (None for a directory, the target for a link)."""
    out = {}
    for root in roots:
        for d, dirs, files in os.walk(root):
            for n in dirs + files:
                p = os.path.join(d, n)
                out[p] = os.readlink(p) if os.path.islink(p) else None if os.path.isdir(p) else open(p, "rb").read()
    return out


@pytest.fixture
def no_load(monkeypatch):
    """A refusal must come before the checkpoint or the model is read: reading either fails the test."""
    def loaded(*a, **k):
        raise AssertionError("the checkpoint or the model was loaded before the refusal")
    monkeypatch.setattr(export, "load_checkpoint", loaded)
    monkeypatch.setattr(export, "load_policy", loaded)


def clash(kind, target, tmp):
    """Make `kind` of clash at target (tmp: a scratch directory); returns what the message must say."""
    if kind == "file":
        open(target, "w").write("mine")
        return "is a file"
    if kind == "filled dir":
        os.makedirs(target)
        open(os.path.join(target, "notes.txt"), "w").write("mine")
        return "holds files this command did not write"
    if kind == "dir holding a hidden file":
        os.makedirs(target)
        open(os.path.join(target, ".keep"), "w").close()
        return "did not write"
    if kind == "symlink to a dir":
        os.makedirs(os.path.join(tmp, "elsewhere"), exist_ok=True)
        os.symlink(os.path.join(tmp, "elsewhere"), target)
        return "symbolic link"
    if kind == "dangling symlink":
        os.symlink(os.path.join(tmp, "nowhere"), target)
        return "symbolic link"
    if kind == "under a file":
        open(os.path.dirname(target), "w").write("mine")
        return "takes no new file"
    raise ValueError(kind)


KINDS = ["file", "filled dir", "dir holding a hidden file", "symlink to a dir", "dangling symlink", "under a file"]


@pytest.mark.parametrize("key", ["adapter_dir", "merged_dir"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_output_clash_is_refused_before_any_work(hf_run, tmp_path, no_load, key, kind):
    _, run = hf_run
    target = str(tmp_path / "parent" / "out") if kind == "under a file" else str(tmp_path / "out")
    said = clash(kind, target, str(tmp_path))
    other = str(tmp_path / "fine")  # the other output is fine: it must not be written either
    paths = {"adapter_dir": target, "merged_dir": other} if key == "adapter_dir" else \
        {"adapter_dir": other, "merged_dir": target}
    before = tree(str(tmp_path), run)
    with pytest.raises(UserError) as e:
        export.main([f"--out_dir={run}", "--merged=True"] + [f"--{k}={v}" for k, v in paths.items()])
    msg = str(e.value)
    assert said in msg and f"{key} {target}" in msg and "\n" not in msg and ".tmp" not in msg, msg
    assert tree(str(tmp_path), run) == before


@pytest.mark.parametrize("where", ["/proc/grpo_export_test", "/proc/self/out", "/dev/null/out"])
def test_a_place_that_takes_no_file_is_named(hf_run, no_load, where):
    _, run = hf_run
    with pytest.raises(UserError, match=f"cannot write adapter_dir {where}: .* takes no new file"):
        export.main([f"--out_dir={run}", f"--adapter_dir={where}"])


@pytest.mark.parametrize("adapter, merged", [
    ("same", "same"), ("same", "same/"), ("same", "./same"), ("same", "same/inner"), ("same/inner", "same"),
    ("link", "real"),  # two names of one directory
])
def test_two_outputs_on_one_path_refused_up_front(hf_run, tmp_path, no_load, monkeypatch, adapter, merged):
    _, run = hf_run
    monkeypatch.chdir(tmp_path)
    os.makedirs("real")
    os.symlink("real", "link") if adapter == "link" else None
    before = tree(str(tmp_path))
    with pytest.raises(UserError, match="same directory or one holds the other"):
        export.main([f"--out_dir={run}", "--merged=True", f"--adapter_dir={adapter}", f"--merged_dir={merged}"])
    assert tree(str(tmp_path)) == before


def test_checkpoint_of_another_run_is_refused(hf_run, tmp_path, no_load):
    """--out_dir=A --ckpt=B/ckpt.pt: the outputs' default place (A) and the checkpoint's run (B) disagree;
    writing B's adapter into A would label it as A's: refused, nothing written."""
    _, run = hf_run
    a = tmp_path / "A"
    a.mkdir()
    before = tree(str(tmp_path), run)
    with pytest.raises(UserError, match=f"belongs to the run in {run}, not to --out_dir={a}"):
        export.main([f"--out_dir={a}", f"--ckpt={run}/ckpt.pt"])
    assert tree(str(tmp_path), run) == before


def test_export_of_a_checkpoint_names_its_iteration_and_keeps_a_users_tmp(hf_run, tmp_path, capsys):
    """--ckpt alone writes into the checkpoint's run; a directory of the name the old writer used as
    its temporary (<target>.tmp) is the user's: untouched; nothing half-written is left beside."""
    _, run = hf_run
    out = str(tmp_path / "adapter")
    os.makedirs(out + ".tmp")
    open(f"{out}.tmp/mine.txt", "w").write("keep me")
    export.main([f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={out}"])
    assert open(f"{out}.tmp/mine.txt").read() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["adapter", "adapter.tmp"]
    mark = json.load(open(f"{out}/{hf.EXPORT_MARK}"))
    assert mark["iter"] == 1 and mark["ckpt"] == os.path.abspath(f"{run}/ckpt_000001.pt")
    assert "peft LoRA adapter of iter 1 of" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == sorted(["adapter_config.json", "adapter_model.safetensors", hf.EXPORT_MARK])


def test_an_earlier_export_is_replaced_and_survives_a_failed_one(hf_run, tmp_path, monkeypatch, capsys):
    _, run = hf_run
    out = str(tmp_path / "adapter")
    export.main([f"--ckpt={run}/ckpt_000001.pt", f"--adapter_dir={out}"])
    first = tree(out)
    import safetensors.torch
    monkeypatch.setattr(safetensors.torch, "save_file", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full")))
    with pytest.raises(UserError, match=f"cannot write adapter_dir {out}: full; nothing of it was "
                                        "left"):
        export.main([f"--ckpt={run}/ckpt_000002.pt", f"--adapter_dir={out}"])
    assert tree(out) == first and os.listdir(tmp_path) == ["adapter"]  # the old one kept, no partial dir
    monkeypatch.undo()
    capsys.readouterr()
    export.main([f"--ckpt={run}/ckpt_000002.pt", f"--adapter_dir={out}"])
    assert "replacing an earlier export" in capsys.readouterr().out
    assert json.load(open(f"{out}/{hf.EXPORT_MARK}"))["iter"] == 2 and os.listdir(tmp_path) == ["adapter"]


def test_an_empty_directory_is_written_into(hf_run, tmp_path):
    _, run = hf_run
    (tmp_path / "empty").mkdir()
    export.main([f"--out_dir={run}", f"--adapter_dir={tmp_path}/empty"])
    assert hf.is_export(str(tmp_path / "empty"))


def test_export_during_training_is_refused(hf_run, tmp_path, no_load):
    """The run's lock held by a live process (a training run): refused, naming it; nothing written."""
    _, run = hf_run
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(os.path.join(run, rundir.LOCK_NAME), "w") as f:
            f.write(f"{live.pid}\n")
        before = tree(run)
        with pytest.raises(UserError, match=f"in use by another run \\(PID {live.pid}\\); wait for the run"):
            export.main([f"--out_dir={run}", f"--adapter_dir={tmp_path}/a"])
        assert tree(run) == before and not os.path.exists(tmp_path / "a")
    finally:
        live.kill()
        live.wait()
        os.remove(os.path.join(run, rundir.LOCK_NAME))


@pytest.mark.parametrize("writer", ["save_peft_adapter", "save_pretrained"])
def test_the_writers_refuse_a_users_directory_themselves(hf_run, tmp_path, writer):
    """Called directly (not through export.main), a writer still never overwrites."""
    base, run = hf_run
    from runs.loading import load_policy
    model, _, _ = load_policy(f"{run}/ckpt.pt")
    os.makedirs(tmp_path / "users")
    open(tmp_path / "users" / "x", "w").close()
    args = (base, 8, 16) if writer == "save_peft_adapter" else (base, __import__("torch").float32)
    with pytest.raises(UserError, match="did not write"):
        getattr(hf, writer)(model, str(tmp_path / "users"), *args)
    assert os.listdir(tmp_path) == ["users"] and os.listdir(tmp_path / "users") == ["x"]
