# A base path that is a symbolic link to nothing (a disk not mounted) is not a missing base: every
# script refuses it by name (runs/base.base_exists, the one test of a base's path) and leaves the
# link as it is; train_grpo.py never trains a new base over it, train_base.py never writes over it.
# A base that is really missing is still trained where base_config puts it.
# Run: python -m pytest -q tests/test_base_path.py
import os

import pytest

import train_base as tb
import train_grpo as tg
from configurator import UserError
from runs.base import base_exists, dangling_link, resolve_base
from runs.loading import base_to_train

GONE = "/nonexistent-disk-for-a-test/base"


def train_if_missing(base_ckpt, base_config, device, trainer):
    """train_grpo.train_missing_base with `trainer` for train_base: base_to_train's arguments, if any,
    handed to trainer.main."""
    argv = base_to_train(base_ckpt, base_config, trainer.defaults["out_dir"])
    if argv is not None:
        trainer.main([*argv, f"--device={device}"])


class NoTraining:
    """train_base as train_if_missing calls it: its defaults, and a main that records each call."""
    defaults = tb.defaults

    def __init__(self):
        self.calls = []

    def main(self, argv):
        self.calls.append(argv)


def linked(tmp_path, how):
    """(base_ckpt path, the link in it) for a link to nothing as the file itself or as a folder."""
    if how == "file":
        os.symlink(f"{GONE}/ckpt.pt", tmp_path / "ckpt.pt")
        return str(tmp_path / "ckpt.pt"), str(tmp_path / "ckpt.pt")
    os.symlink(GONE, tmp_path / "disk")
    return str(tmp_path / "disk" / "base" / "ckpt.pt"), str(tmp_path / "disk")


@pytest.mark.parametrize("how", ["file", "folder"])
def test_dangling_link_is_refused_and_kept(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    path, link = linked(tmp_path, how)
    target = os.readlink(link)
    config = tmp_path / "base_config.py"  # puts the base exactly there: a missing one is trained
    config.write_text(f"out_dir = {os.path.dirname(path)!r}\n")
    trainer = NoTraining()
    with pytest.raises(UserError, match=f"{link} is a symbolic link to {target}, which does not "
                                        r"exist \(a disk not mounted\?\)") as e:
        train_if_missing(path, str(config), "cpu", trainer)
    assert "\n" not in str(e.value) and trainer.calls == []
    assert os.path.islink(link) and os.readlink(link) == target
    assert dangling_link(path) == link


def test_missing_and_linked_bases_are_not_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "ckpt.pt").write_bytes(b"x")
    os.symlink(tmp_path / "real", tmp_path / "via")  # a link to something: as good as the file
    assert base_exists(str(tmp_path / "via" / "ckpt.pt"))
    assert dangling_link(str(tmp_path / "via" / "ckpt.pt")) is None
    assert not base_exists(str(tmp_path / "out" / "base" / "ckpt.pt"))  # missing: no error
    (tmp_path / "c.py").write_text("out_dir = 'out/base'\n")
    trainer = NoTraining()
    train_if_missing("out/base/ckpt.pt", "c.py", "cpu", trainer)  # a fresh clone: trained
    assert len(trainer.calls) == 1


@pytest.mark.parametrize("how", ["file", "folder"])
def test_grpo_refuses_a_dangling_base_before_any_work(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    path, link = linked(tmp_path, how)
    target = os.readlink(link)
    monkeypatch.setattr(tb, "main", lambda argv: pytest.fail("a base was trained"))
    with pytest.raises(UserError, match=f"base_ckpt {path}: {link} is a symbolic link"):
        tg.main([f"--base_ckpt={path}", f"--out_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists() and os.readlink(link) == target


def test_resolve_base_names_a_dangling_link(tmp_path):
    path, link = linked(tmp_path, "file")
    ckpt = {"base_ckpt": path, "base_abspath": path}
    with pytest.raises(UserError, match=f"trained on, {path}: {link} is a symbolic link"):
        resolve_base(ckpt, "run/ckpt.pt")
    with pytest.raises(UserError, match=f"--base_ckpt {path}: {link} is a symbolic link"):
        resolve_base({"base_ckpt": "elsewhere/ckpt.pt"}, "run/ckpt.pt", given=path)
    real = tmp_path / "moved.pt"
    real.write_bytes(b"x")
    assert resolve_base(ckpt, "run/ckpt.pt", given=str(real)) == str(real)  # named where it is now


def test_train_base_never_writes_over_a_dangling_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "b"
    out.mkdir()
    os.symlink(f"{GONE}/ckpt.pt", out / "ckpt.pt")
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: pytest.fail("work started"))
    with pytest.raises(UserError, match=r"checkpoint .*ckpt.pt is a symbolic link to "):
        tb.main([f"--out_dir={out}", "--n_layer=1", "--n_embd=16", "--n_head=1", "--n_train=50",
                 "--max_iters=1", "--eval_n=2"])
    assert os.readlink(out / "ckpt.pt") == f"{GONE}/ckpt.pt"
