# Whatever stops a train_grpo.py run (Ctrl-C in any step, evaluation or checkpoint; a full disk while a
# checkpoint or the log is written), the command its message prints goes on from there, and the finished
# run logs every iteration exactly once: analysis/summarize.py's and analysis/plot.py's readers accept it.
# Run: python -m pytest tests/test_resume_logs.py -q
#
# Independent references: an uninterrupted run with the same config (its log's rewards and its final LoRA
# weights must be those of the stopped-and-resumed run), the printed command parsed with shlex, and a
# full disk made real by /dev/full (every write into it fails with ENOSPC).
import builtins
import contextlib
import glob
import importlib.util
import json
import os
import shlex

import pytest
import torch

from analysis import plot
from analysis import summarize
import runs.state
import train_grpo as tg
from configurator import Interrupted, UserError
from runs.checkpoint import load_checkpoint
from test_train_grpo import run

pytestmark = pytest.mark.usefixtures("chars_reward")
MAX = 7
# checkpoints at 0, 2, 4, 6, 7; float32 also for the module-scoped reference run (conftest's pin is per test)
ARGS = (f"--max_iters={MAX}", "--ckpt_interval=2", "--eval_interval=3", "--dtype=float32")


@pytest.fixture(scope="module")
def reference(tiny_setup, tmp_path_factory):
    """An uninterrupted run: its log and its final checkpoint."""
    import rewards
    out = tmp_path_factory.mktemp("ref") / "r"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
        run(tiny_setup, out, *ARGS)
    return [json.loads(line) for line in open(out / "log.jsonl")], load_checkpoint(str(out / "ckpt.pt"))


@contextlib.contextmanager
def full_disk():
    """Every temp file opened meanwhile (a checkpoint's) lands on /dev/full: its write fails with ENOSPC."""
    real_open = builtins.open

    def open_full(path, mode="r", *a, **k):
        return real_open("/dev/full", mode, *a, **k) if str(path).endswith(".tmp") else real_open(path, mode, *a, **k)
    builtins.open = open_full
    try:
        yield
    finally:
        builtins.open = real_open


def stop(monkeypatch, where, k, how):
    """Make the run stop at iteration k: in the step taken from it, its evaluation, the write of its
    history checkpoint ckpt_NNNNNN.pt or of ckpt.pt (the first such write at an iteration >= k), or the
    first write of the log; by Ctrl-C ('ctrl-c') or a full disk ('enospc')."""
    fired = []

    def fault():
        fired.append(1)
        if how == "ctrl-c":
            raise KeyboardInterrupt
        return full_disk()
    if where == "step":  # as the step at iteration k draws its prompts
        real = tg.get_batch

        def patched(run, cfg):
            if run.iter_num == k and not fired:
                fault()
            return real(run, cfg)
        monkeypatch.setattr(tg, "get_batch", patched)
    elif where == "evaluate":
        real = tg.eval_line

        def patched(*a):
            if a[-1] == k and not fired:  # its last argument: the iteration
                fault()
            return real(*a)
        monkeypatch.setattr(tg, "eval_line", patched)
    elif where in ("history", "latest"):
        real_save = runs.state.save_checkpoint

        def save(state, path):
            is_history = os.path.basename(path) != "ckpt.pt"
            if state["iter_num"] >= k and is_history == (where == "history") and not fired:
                with fault():
                    return real_save(state, path)
            return real_save(state, path)
        monkeypatch.setattr(runs.state, "save_checkpoint", save)
    else:  # the log opened on a full disk: its first line (iteration 0's evaluation) cannot be written
        real_open = builtins.open

        def open_log(path, mode="r", *a, **k):
            if str(path).endswith("log.jsonl") and mode == "a" and not fired:
                fired.append(1)
                return real_open("/dev/full", mode, *a, **k)
            return real_open(path, mode, *a, **k)
        monkeypatch.setattr(builtins, "open", open_log)


def check_finished(out, reference):
    log = plot.load_log(str(out))  # analysis/plot.py's reader (analysis/summarize.py's too): two lines of an iteration are refused
    assert [line["iter"] for line in log] == list(range(MAX + 1))
    assert [json.loads(line)["iter"] for line in open(out / "rollouts.jsonl")] == list(range(1, MAX + 1))
    assert sorted(os.path.basename(p) for p in glob.glob(str(out / "ckpt*.pt"))) == \
        ["ckpt.pt"] + [f"ckpt_{i:06d}.pt" for i in (0, 2, 4, 6, 7)]
    assert not glob.glob(str(out / "*.tmp")) and not (out / "run.lock").exists()
    ref_log, ref_ckpt = reference  # the resumed run is the uninterrupted one
    assert [line.get("reward") for line in log] == [line.get("reward") for line in ref_log]
    assert [line.get("test/accuracy") for line in log] == [line.get("test/accuracy") for line in ref_log]
    final = load_checkpoint(str(out / "ckpt.pt"))
    assert final["iter_num"] == MAX and all(torch.equal(final["lora"][n], t) for n, t in ref_ckpt["lora"].items())
    summarize.main([str(out)])
    if importlib.util.find_spec("matplotlib"):  # analysis/plot.py draws only with it (requirements.txt leaves it optional)
        assert os.path.isfile(plot.plot_runs([str(out)], str(out / "plot.png")))


CASES = ([("step", k, "ctrl-c") for k in range(MAX)] + [("evaluate", k, "ctrl-c") for k in (0, 3, 6, 7)]
         + [(w, k, how) for w in ("history", "latest") for k in range(MAX + 1) for how in ("ctrl-c", "enospc")]
         + [("log", 0, "enospc")])


@pytest.mark.parametrize("where, k, how", CASES)
def test_the_printed_command_finishes_the_run_with_each_iteration_logged_once(tiny_setup, tmp_path, monkeypatch,
                                                                              capsys, reference, where, k, how):
    out = tmp_path / "r"
    with monkeypatch.context() as m:
        stop(m, where, k, how)
        with pytest.raises(Interrupted if how == "ctrl-c" else UserError) as e:
            run(tiny_setup, out, *ARGS)
    msg = str(e.value)
    assert "\n" not in msg and "train_grpo.py stopped at iter" in msg
    if how == "enospc":
        assert "No space left on device" in msg
    capsys.readouterr()
    if "resume with: " in msg:
        cmd = shlex.split(msg.split("resume with: ")[1])
        assert cmd[:2] == ["python", "train_grpo.py"] and "--init_from=resume" in cmd
        tg.main(cmd[2:])
        assert "resume:" not in capsys.readouterr().out  # nothing changed against the saved run
    else:  # stopped before its first checkpoint: its files are gone, the same command starts it again
        assert msg.endswith("no checkpoint written yet: run the same command again to start over")
        assert not out.exists() or os.listdir(out) == []
        run(tiny_setup, out, *ARGS)
    check_finished(out, reference)


def test_stopped_twice_before_the_first_periodic_checkpoint(tiny_setup, tmp_path, monkeypatch, reference):
    """Ctrl-C at iteration 1, resume from ckpt_000000, Ctrl-C again at 1, resume again: iteration 0's
    evaluation is still logged once."""
    out = tmp_path / "r"
    for attempt in range(2):
        with monkeypatch.context() as m:
            stop(m, "step", 1, "ctrl-c")
            with pytest.raises(Interrupted, match="iter 0\\); resume with"):
                tg.main([f"--out_dir={out}", "--init_from=resume"]) if attempt else run(tiny_setup, out, *ARGS)
    tg.main([f"--out_dir={out}", "--init_from=resume"])
    check_finished(out, reference)


def test_a_crash_before_the_first_checkpoint_names_what_to_delete(tiny_setup, tmp_path, monkeypatch, reference):
    """Not Ctrl-C nor a full disk but a bug: the files it left are named, not a resume that cannot work."""
    out = tmp_path / "r"
    with monkeypatch.context() as m, pytest.raises(ZeroDivisionError):
        m.setattr(runs.state, "save_checkpoint", lambda state, path: 1 / 0)
        run(tiny_setup, out, *ARGS)
    with pytest.raises(UserError, match="before its first checkpoint \\(log.jsonl, rollouts.jsonl\\): delete them"):
        run(tiny_setup, out, *ARGS)
    for name in ("log.jsonl", "rollouts.jsonl"):  # the advice, followed
        os.remove(out / name)
    run(tiny_setup, out, *ARGS)
    check_finished(out, reference)
