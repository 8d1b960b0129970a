# Tests for `python tracin.py` (tracin.main) on a real train_grpo.py run directory: 3 GRPO steps at
# sampling temperature 0.7, checkpoints at iters 0, 2 and 3. Run: python -m pytest tests/test_tracin_cli.py -q
#
# Independent references: the run's own config (temperature) and the trapezoid weights worked out by
# hand for iters 0, 2, 3: (2-0)/2, (3-0)/2, (3-2)/2; a spy on find_critical_samples records what the
# CLI passes; the run lock checked through the lock file; rollouts.jsonl parsed without the cut line.
import json
import os
import shutil

import pytest

import attribution
import tracin
from configurator import UserError, cli_main
from model import load_checkpoint, save_checkpoint
from test_train_grpo import run as grpo_run

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


@pytest.fixture(scope="module")
def grpo_dir(tiny_setup, tmp_path_factory):
    import rewards
    out = tmp_path_factory.mktemp("grpo") / "run"
    with pytest.MonkeyPatch.context() as mp:  # a reward that varies even for an untrained model
        mp.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
        grpo_run(tiny_setup, out, "--max_iters=3", "--ckpt_interval=2", "--temperature=0.7")
    return out


@pytest.fixture
def run(grpo_dir, tmp_path):
    """A fresh copy of the run directory for each test."""
    return shutil.copytree(grpo_dir, tmp_path / "run")


@pytest.fixture
def spy(monkeypatch):
    """Records each find_critical_samples call's arguments and whether the run lock was held, then scores."""
    calls, real = [], attribution.find_critical_samples

    def record(model, checkpoints, train, test, enc, **kw):
        lock = os.path.join(os.path.dirname(checkpoints[0]), "run.lock")
        calls.append(dict(checkpoints=checkpoints, test=test, enc=enc, locked=os.path.exists(lock), **kw))
        return real(model, checkpoints, train, test, enc, **kw)
    monkeypatch.setattr(tracin, "find_critical_samples", record)
    return calls


def main(run, *args):
    tracin.main([f"--out_dir={run}", "--question=Mia has 2 pears. How many?", "--n_probe=4", *args])


def test_cli_uses_the_runs_temperature_trapezoid_weights_and_the_lock(run, spy):
    main(run)
    (call,) = spy
    assert [os.path.basename(c) for c in call["checkpoints"]] == [f"ckpt_00000{i}.pt" for i in (0, 2, 3)]
    assert call["temperature"] == 0.7                       # the run sampled at 0.7
    assert call["checkpoint_steps"] == [1.0, 1.5, 0.5]       # (2-0)/2, (3-0)/2, (3-2)/2: 3 steps in all
    assert call["locked"] and not os.path.exists(run / "run.lock")  # held while scoring, released after
    res = json.load(open(run / "tracin_attribution.json"))
    assert res["num_checkpoints"] == 3 and len(res["scores"]) == 4
    # greedy sampling (temperature 0) means plain log-probs: temperature 1
    last = run / "ckpt_000003.pt"
    ck = load_checkpoint(str(last))
    save_checkpoint({**ck, "config": {**ck["config"], "temperature": 0.0}}, str(last))
    main(run)
    assert spy[1]["temperature"] == 1.0


def test_cli_refuses_a_run_dir_in_use(run, spy):
    (run / "run.lock").write_text(f"{os.getppid()}\n")  # a live process that is not this one
    with pytest.raises(UserError, match="in use by another run"):
        main(run)
    assert not spy and not os.path.exists(run / "tracin_attribution.json")


def test_cli_skips_a_cut_off_rollouts_line(run, spy, capsys):
    path = run / "rollouts.jsonl"
    lines = path.read_text().splitlines()
    enc = _enc(run)
    whole = tracin.load_rollouts(str(path), enc)
    with open(path, "a") as f:
        f.write(lines[-1][:40])  # a crash cut the last line off mid-write
    main(run)
    assert f"line {len(lines) + 1} is not valid JSON (cut off" in capsys.readouterr().out
    assert tracin.load_rollouts(str(path), enc) == whole


def test_rollouts_record_without_its_keys_is_skipped(run, capsys):
    path = run / "rollouts.jsonl"
    enc = _enc(run)
    whole = tracin.load_rollouts(str(path), enc)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + '{"iter": 7, "prompts": ["q"]}\n' + "".join(lines[1:]))
    assert tracin.load_rollouts(str(path), enc) == whole
    assert "record 2 lacks" in capsys.readouterr().out


def _enc(run):
    from sample import load_policy
    return load_policy(str(run / "ckpt_000000.pt"))[1]


@pytest.mark.parametrize("arg,message", [("--n_probe=-1", "'n_probe' = -1"), ("--top_k=0", "'top_k' = 0"),
                                         ("--mode=fast", "'mode' = 'fast'"), ("--out_dir=", "'out_dir' = ''"),
                                         ("--out_json={run}/no/such/dir/x.json", "cannot write out_json"),
                                         ("--out_json={run}", "'out_json' = .* must end in .json"),
                                         ("--out_json={run}/ckpt.pt", "'out_json' = .* must end in .json"),
                                         ("--out_json={run}/d.json", "cannot write out_json"),
                                         ("--out_dir={run}/nope", "is not a directory")])
def test_cli_knobs_checked_before_any_work(run, spy, monkeypatch, arg, message):
    import sample
    monkeypatch.setattr(sample, "load_policy", lambda *a, **k: pytest.fail("work started"))
    if arg.endswith("d.json"):
        (run / "d.json").mkdir()
    before = (run / "ckpt.pt").read_bytes()
    with pytest.raises(UserError, match=message):
        main(run, arg.format(run=run))
    assert (run / "ckpt.pt").read_bytes() == before  # an out_json naming a run file never overwrites it


def test_cli_errors_are_one_line(run, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(tracin.main, [f"--out_dir={run}", "--question=hi", f"--out_json={run}/no/such/dir/x.json"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_cli_question_and_completion_are_plain_text(run, spy):
    """'<|endoftext|>' typed in a question or completion is text, never the end-of-text token;
    --question=1234 is text too."""
    main(run, "--question=1234<|endoftext|>", "--completion=<|endoftext|> 5")
    (call,) = spy
    assert call["test"][0]["prompt"] == "1234<|endoftext|>"
    idx = tracin.rollout_batch(call["enc"], call["test"], "cpu")[0]
    assert (idx == call["enc"].eot_token).sum() == 1 and idx[0, -1] == call["enc"].eot_token  # only the final one
    assert json.load(open(run / "tracin_attribution.json"))["completion"] == "<|endoftext|> 5"
