# A resumed train_base.py run goes on with ONE model on ONE data set: its saved config is restored
# (only what argv gives overrides it); a knob that shapes the weights or picks the data is refused
# in one line naming the key and the fix; the data directory and tokenizer are the checkpoint's own
# (a directory rebuilt from other files is refused, by the fingerprint checkpoints record; older
# checkpoints without one still resume); ckpt.pt is only replaced by a state that loads.
# Run: python -m pytest -q tests/test_base_resume.py
import json
import os
import shutil

import pytest
import torch

import train_base as tb
from configurator import UserError
from data.datadir import load_tokenizer
from data.gsm_synth.prepare import prepare
from runs.checkpoint import (CheckpointWriteError, load_checkpoint, model_from_checkpoint,
                             save_checkpoint)

ARGS = ["--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=96", "--batch_size=4",
        "--eval_n=2", "--eval_interval=2", "--log_interval=2", "--max_new_tokens=6",
        "--warmup_iters=1"]
FIELDS = {"tokenizer", "train", "val", "test"}


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return prepare(steps=1, max_operand=5, ops="+", n_train=200, n_val=10, n_test=10, num_merges=20,
                   verbose=False, root=str(tmp_path_factory.mktemp("d")))


@pytest.fixture
def data(task_dir, tmp_path, monkeypatch):
    """A copy of the tiny task's directory, which load_task returns (a test may change it)."""
    d = str(tmp_path / "data" / os.path.basename(task_dir))
    shutil.copytree(task_dir, d)
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: (d, load_tokenizer(d)))
    return d


@pytest.fixture
def trained(data, tmp_path):
    """A base trained for 2 iterations in tmp_path/b: (out_dir, ckpt.pt's bytes)."""
    out = tmp_path / "b"
    tb.main([f"--out_dir={out}", "--max_iters=2", *ARGS])
    return out, (out / "ckpt.pt").read_bytes()


def no_new_data(monkeypatch):
    monkeypatch.setattr(tb, "load_task",
                        lambda cfg, verbose=True: pytest.fail("new task data built"))


def one_line(e):
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("arg", ["--n_layer=2", "--block_size=128", "--block_size=64",
                                 "--n_embd=32", "--n_head=4", "--bias=True"])
def test_a_changed_shape_is_refused_and_ckpt_kept(trained, arg, monkeypatch):
    out, before = trained
    no_new_data(monkeypatch)
    key = arg[2:].split("=")[0]
    with pytest.raises(UserError) as e:
        tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=4", arg])
    assert f"config key '{key}'" in one_line(e) and "cannot change on resume" in str(e.value)
    assert "start a new out_dir" in str(e.value) and f"leave --{key} out" in str(e.value)
    assert (out / "ckpt.pt").read_bytes() == before
    model_from_checkpoint(load_checkpoint(str(out / "ckpt.pt")))  # still loads


@pytest.mark.parametrize("arg", ["--n_train=100", "--countdown_max_number=20", "--task=countdown",
                                 "--task_steps=3", "--task_max_operand=9", "--task_ops=+*",
                                 "--task_min_steps=1", "--countdown_variants=2",
                                 "--countdown_numbers=4"])
def test_a_changed_data_knob_is_refused_before_any_data_is_built(trained, arg, monkeypatch):
    out, before = trained
    no_new_data(monkeypatch)
    key = arg[2:].split("=")[0]
    with pytest.raises(UserError, match=f"config key '{key}' = .* cannot change on resume: .* "
                                        f"picks the task data and tokenizer; .*start a new out_dir"
                       ) as e:
        tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=4", arg])
    one_line(e)
    assert (out / "ckpt.pt").read_bytes() == before


def test_saved_config_restored_and_only_argv_overrides(trained, monkeypatch, capsys):
    """The same values given again are no change; run knobs (dropout, learning rate) may change and
    the new dropout is the one the model trains with."""
    out, _ = trained
    no_new_data(monkeypatch)  # the checkpoint's own data directory is read, not built again
    tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=4", "--n_layer=1",
             "--dropout=0.1", "--learning_rate=0.001"])
    c = load_checkpoint(str(out / "ckpt.pt"))
    assert c["iter_num"] == 4 and c["config"]["batch_size"] == 4 and c["config"]["n_embd"] == 16
    assert c["model_args"]["dropout"] == 0.1 and c["config"]["learning_rate"] == 0.001
    assert model_from_checkpoint(c).config.dropout == 0.1
    assert "resume: dropout = 0.1" in capsys.readouterr().out


def test_not_a_base_checkpoint(data, tmp_path):
    save_checkpoint({"lora": {}, "base_ckpt": "x.pt", "config": {}},
                    str(tmp_path / "g" / "ckpt.pt"))
    with pytest.raises(UserError, match="is not a train_base.py checkpoint"):
        tb.main([f"--out_dir={tmp_path / 'g'}", "--init_from=resume"])


def edit_rows(path, edit):
    rows = [json.loads(line) for line in open(path)]
    edit(rows)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def other_tokenizer(task_dir, tmp_path):
    other = prepare(steps=1, max_operand=5, ops="+", n_train=200, n_val=10, n_test=10, num_merges=5,
                    verbose=False, root=str(tmp_path / "other"))
    return os.path.join(other, "tokenizer.json")


@pytest.mark.parametrize("change, named", [("tokenizer", "tokenizer"), ("train", "train split"),
                                           ("test", "test split"), ("val", "val split")])
def test_data_rebuilt_from_other_files_is_refused(trained, data, task_dir, tmp_path, change, named):
    out, before = trained
    if change == "tokenizer":
        shutil.copy(other_tokenizer(task_dir, tmp_path), os.path.join(data, "tokenizer.json"))
    else:  # one answer changed: the same files, other content
        edit_rows(os.path.join(data, f"{change}.jsonl"),
                  lambda rows: rows[-1].update(answer=rows[-1]["answer"] + 1))
    with pytest.raises(UserError, match=f"is not the data .*ckpt.pt was trained on \\(changed: "
                                        f"{named}\\): it was rebuilt from other files") as e:
        tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=4"])
    assert "start a new out_dir" in one_line(e)
    assert (out / "ckpt.pt").read_bytes() == before


def test_a_deleted_data_directory_rebuilt_the_same_resumes(trained, data, tmp_path, monkeypatch):
    """The recorded directory is gone: load_task builds it again from the saved knobs; the same
    files resume, other ones are refused."""
    out, _ = trained
    copy = str(tmp_path / "again" / os.path.basename(data))
    shutil.move(data, copy)
    monkeypatch.setattr(tb, "load_task", lambda cfg, verbose=True: (copy, load_tokenizer(copy)))
    tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=4"])
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 4
    edit_rows(os.path.join(copy, "train.jsonl"), lambda rows: rows.pop())  # now the recorded one
    with pytest.raises(UserError, match=r"changed: train split"):
        tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=6"])


def test_an_old_checkpoint_without_a_fingerprint_resumes_and_gets_one(trained, data, task_dir,
                                                                       tmp_path):
    out, _ = trained
    c = load_checkpoint(str(out / "ckpt.pt"))
    assert set(c["data_fingerprint"]) == FIELDS
    del c["data_fingerprint"]
    save_checkpoint(c, str(out / "ckpt.pt"))
    tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=4"])
    c = load_checkpoint(str(out / "ckpt.pt"))
    assert set(c["data_fingerprint"]) == FIELDS
    # without one, a tokenizer of another size is still refused
    del c["data_fingerprint"]
    save_checkpoint(c, str(out / "ckpt.pt"))
    shutil.copy(other_tokenizer(task_dir, tmp_path), os.path.join(data, "tokenizer.json"))
    with pytest.raises(UserError, match=r"changed: tokenizer \(\d+ tokens, the model's \d+\)"):
        tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=6"])


def test_the_data_must_hold_the_task_rows(data, tmp_path, monkeypatch):
    """A fresh run, too: another task's data is refused before any training."""
    monkeypatch.setattr(tb, "train", lambda cfg, run: pytest.fail("training started"))
    with pytest.raises(UserError, match="holds arith data, not countdown's"):
        tb.main([f"--out_dir={tmp_path / 'c'}", "--task=countdown", *ARGS, "--n_train=100"])
    edit_rows(os.path.join(data, "train.jsonl"), lambda rows: rows[0].update(answer=[[1, 2, 3], 6]))
    with pytest.raises(UserError, match="holds files of different tasks"):
        tb.main([f"--out_dir={tmp_path / 'a'}", *ARGS])
    assert not (tmp_path / "c" / "ckpt.pt").exists() and not (tmp_path / "a" / "ckpt.pt").exists()


def good_state(**args):
    model_args = dict(block_size=32, vocab_size=40, n_layer=1, n_head=2, n_embd=16, dropout=0.0,
                      bias=False)
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(**model_args))
    config = {**tb.defaults, **{k: v for k, v in model_args.items() if k in tb.defaults}}
    model_args.update(args)
    return {"model": model.state_dict(), "model_args": model_args, "config": config}


@pytest.mark.parametrize("args", [dict(n_layer=2), dict(block_size=64), dict(vocab_size=41),
                                  dict(n_embd=32), dict(bias=True), dict(n_head=3)])
def test_a_state_that_would_not_load_is_never_written(args, tmp_path):
    from checks.base_knobs import check_loads
    path = str(tmp_path / "ckpt.pt")
    check_loads(good_state(), path)  # the state as built: loads
    with pytest.raises(CheckpointWriteError, match="not writing .*ckpt.pt.*would not load"):
        check_loads(good_state(**args), path)
    state = good_state()
    state["config"] = {**state["config"], "n_layer": 3}  # weights and model_args agree, config not
    with pytest.raises(CheckpointWriteError, match="would not load"):
        check_loads(state, path)


def test_a_checkpoint_that_would_not_load_keeps_the_last_good_one(trained, monkeypatch):
    """The old failure: model_args of another shape than the weights. Now the write is refused and
    the run stops in one line naming where it goes on from."""
    out, before = trained
    real = tb.check_loads
    monkeypatch.setattr(tb, "check_loads", lambda state, path: real(
        {**state, "model_args": {**state["model_args"], "n_layer": 2}}, path))
    with pytest.raises(UserError, match="not writing .*ckpt.pt.*would not load.*stopped at iter 4"):
        tb.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=4"])
    assert (out / "ckpt.pt").read_bytes() == before
    assert torch.is_tensor(load_checkpoint(str(out / "ckpt.pt"))["model"]["lm_head.weight"])
