# Tests for `python tracin.py` (attribute.main) on a real train_grpo.py run directory: 3 GRPO steps at
# sampling temperature 0.7, checkpoints at iters 0, 2 and 3. Run: python -m pytest tests/test_tracin_cli.py -q
#
# Independent references: the run's own config (temperature) and the trapezoid weights worked out by
# hand for iters 0, 2, 3: (2-0)/2, (3-0)/2, (3-2)/2; a spy on find_critical_samples records what the
# CLI passes; the run lock checked through the lock file; rollouts.jsonl parsed without the cut line.
import glob
import hashlib
import json
import os
import shutil

import pytest

from analysis import attribute
import tracin
from configurator import UserError, cli_main
from runs.checkpoint import load_checkpoint, save_checkpoint
from test_train_grpo import run as grpo_run

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


def tiny_run(tiny_setup, tmp_path_factory, *args):
    """3 GRPO steps on the tiny base, checkpoints at 0, 2, 3, with a reward that varies even for an
    untrained model (so rollouts have advantages to attribute)."""
    import rewards
    out = tmp_path_factory.mktemp("grpo") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
        grpo_run(tiny_setup, out, "--max_iters=3", "--ckpt_interval=2", *args)
    return out


@pytest.fixture(scope="module")
def grpo_dir(tiny_setup, tmp_path_factory):
    return tiny_run(tiny_setup, tmp_path_factory, "--temperature=0.7")


@pytest.fixture
def run(grpo_dir, tmp_path):
    """A fresh copy of the run directory for each test."""
    return shutil.copytree(grpo_dir, tmp_path / "run")


@pytest.fixture
def spy(monkeypatch):
    """Records each find_critical_samples call's arguments and whether the run lock was held, then scores."""
    calls, real = [], attribute.find_critical_samples

    def record(model, checkpoints, train, test, enc, **kw):
        lock = os.path.join(os.path.dirname(checkpoints[0]), "run.lock")
        calls.append(dict(checkpoints=checkpoints, test=test, enc=enc, locked=os.path.exists(lock), **kw))
        return real(model, checkpoints, train, test, enc, **kw)
    monkeypatch.setattr(attribute, "find_critical_samples", record)
    return calls


def written(run):
    """The one attribution file tracin.py wrote into the run directory."""
    (path,) = glob.glob(str(run / "tracin_*.json"))
    return path


def main(run, *args):
    attribute.main([f"--out_dir={run}", "--question=Mia has 2 pears. How many?", "--n_probe=4", *args])


def test_cli_uses_the_runs_temperature_trapezoid_weights_and_the_lock(run, spy):
    main(run)
    (call,) = spy
    assert [os.path.basename(c) for c in call["checkpoints"]] == [f"ckpt_00000{i}.pt" for i in (0, 2, 3)]
    assert call["temperature"] == 0.7                       # the run sampled at 0.7
    assert "checkpoint_steps" not in call                   # the API's default weighs the checkpoints:
    assert call["locked"] and not os.path.exists(run / "run.lock")  # held while scoring, released after
    res = json.load(open(written(run)))
    assert res["num_checkpoints"] == 3 and len(res["scores"]) == 4
    lrs = [load_checkpoint(c)["lr"] for c in call["checkpoints"]]  # eta_t, times k_t: the trapezoid
    steps = [1.0, 1.5, 0.5]                                  # (2-0)/2, (3-0)/2, (3-2)/2: 3 steps in all
    assert res["checkpoint_weights"] == pytest.approx([lr * k for lr, k in zip(lrs, steps)])
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
    assert not spy and not glob.glob(str(run / "tracin_*.json"))


def test_cli_skips_a_cut_off_rollouts_line(run, spy, capsys):
    path = run / "rollouts.jsonl"
    lines = path.read_text().splitlines()
    enc = _enc(run)
    whole = attribute.load_rollouts(str(path), enc)
    with open(path, "a") as f:
        f.write(lines[-1][:40])  # a crash cut the last line off mid-write
    main(run)
    assert f"line {len(lines) + 1} is not valid JSON (cut off" in capsys.readouterr().err
    assert attribute.load_rollouts(str(path), enc) == whole


def test_rollouts_record_without_its_keys_is_skipped(run, capsys):
    path = run / "rollouts.jsonl"
    enc = _enc(run)
    whole = attribute.load_rollouts(str(path), enc)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + '{"iter": 7, "prompts": ["q"]}\n' + "".join(lines[1:]))
    assert attribute.load_rollouts(str(path), enc) == whole
    assert "line 2: the record lacks" in capsys.readouterr().err


def _enc(run):
    from runs.loading import load_policy
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


@pytest.mark.parametrize("content,message", [(b"Mia has 2 pears.\n\xff\xfe\n", "is not UTF-8 text"),
                                             (b"\x00" * 64, "holds NUL bytes"), (b"\n \n", "holds no question")],
                         ids=["latin-1", "nul", "blank"])
def test_a_questions_file_that_is_not_text_is_one_line(run, tmp_path, monkeypatch, capsys, content, message):
    import sample
    monkeypatch.setattr(sample, "load_policy", lambda *a, **k: pytest.fail("work started"))
    (tmp_path / "q.txt").write_bytes(content)
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(SystemExit) as e:
        cli_main(attribute.main, [f"--out_dir={run}", f"--questions_file={tmp_path}/q.txt"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: questions_file {tmp_path}/q.txt {message}")
    assert err.count("\n") == 1 and sorted(p.name for p in run.iterdir()) == before


def test_cli_errors_are_one_line(run, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(attribute.main, [f"--out_dir={run}", "--question=hi", f"--out_json={run}/no/such/dir/x.json"])
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
    assert json.load(open(written(run)))["completion"] == "<|endoftext|> 5"


def test_a_base_models_directory_is_named_and_the_printed_commands_work(tiny_setup, tmp_path, monkeypatch):
    """--out_dir of train_base.py's directory: the error says so and prints a train_grpo.py command; followed
    (with the tiny run's sizes added before it), it makes a run that the printed --out_dir then attributes."""
    import shlex
    import rewards
    base = tmp_path / "out" / "base"
    base.mkdir(parents=True)
    shutil.copy(tiny_setup, base / "ckpt.pt")
    with pytest.raises(UserError) as e:
        main(base)
    msg = str(e.value)
    assert "holds a base model (train_base.py), not a GRPO run" in msg and "\n" not in msg
    train = shlex.split(msg.split("with: ")[1].split(", then")[0])
    assert train[:2] == ["python", "train_grpo.py"] and f"--base_ckpt={base}/ckpt.pt" in train
    printed = msg.split("then attribute with ")[1]
    assert printed == f"--out_dir={tmp_path}/out/grpo"
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
    grpo_run(tiny_setup, "unused", *train[2:], "--max_iters=1")   # the printed --base_ckpt, --out_dir win
    attribute.main([printed, "--question=Mia has 2 pears. How many?", "--n_probe=4"])
    assert len(glob.glob(f"{tmp_path}/out/grpo/tracin_*.json")) == 1


def test_a_directory_without_a_run_names_a_command_that_works(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=f"it is not a train_grpo.py run; make one with: python train_grpo.py "
                                        f"--out_dir={empty}, then"):
        main(empty)
    (empty / "log.jsonl").write_text("{}\n")  # another run's file: that directory would be refused
    with pytest.raises(UserError, match=f"make one with: python train_grpo.py --out_dir={tmp_path}/grpo, then"):
        main(empty)


def test_each_question_and_answer_gets_its_own_file(run, spy, capsys):
    """Attributing a second question never overwrites the first one's results; the same question and
    answer again write the same file (tracin_<12 hex of sha256(question + completion)>.json)."""
    q1, q2 = "Mia has 2 pears. How many?", "Sam has 3 cards. How many?"
    for q in (q1, q2, q1):
        main(run, f"--question={q}", "--completion=#### 5")
    p1, p2 = (f"{run}/tracin_{hashlib.sha256((q + '#### 5').encode()).hexdigest()[:12]}.json" for q in (q1, q2))
    assert sorted(glob.glob(str(run / "tracin_*.json"))) == sorted([p1, p2])
    assert json.load(open(p1))["question"] == q1 and json.load(open(p2))["question"] == q2
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert printed[:2] == [f"wrote {p1}", f"wrote {p2}"]
    assert printed[2] == f"wrote {p1} (replacing an earlier attribution of the same question and answer)"
    main(run, f"--question={q2}", f"--out_json={run}/mine.json")  # --out_json still names the file
    assert json.load(open(run / "mine.json"))["question"] == q2
