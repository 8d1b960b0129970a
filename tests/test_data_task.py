# A run's data must be its task's, and data preparation never writes over what a user made.
# Run: python -m pytest tests/test_data_task.py -q
# References: which prepare.py built each directory (the table the checks must reproduce); the file tree
# before and after a refused command; rewards.extract_answer (how the GSM8K reward reads '#### N') for
# every answer text prepare.py accepts; tokens counted by the tokenizer for the over-long question.
import itertools
import re
import json
import os
import shutil

import pytest

import rewards
import train_grpo
from configurator import UserError
from data import datadir
from data.countdown import prepare as countdown
from data.gsm8k import prepare as gsm8k
from data.gsm_synth import prepare as synth
from test_output_safety import tree  # every path under some roots, with its bytes
from test_task_data import TEST, TRAIN, write_gsm8k

SMALL_SYNTH = dict(steps=1, max_operand=5, ops="+", n_train=60, n_val=10, n_test=10, num_merges=20, verbose=False)
SMALL_COUNTDOWN = dict(n_train=30, n_val=5, n_test=5, verbose=False)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """task -> a directory its prepare.py built; the GSM8K sources beside them."""
    root = tmp_path_factory.mktemp("made")
    src = (write_gsm8k(root / "train.jsonl", TRAIN), write_gsm8k(root / "test.jsonl", TEST))
    return {"arith": synth.prepare(**SMALL_SYNTH, root=str(root)),
            "gsm8k": gsm8k.prepare(*src, n_val=5, out=str(root / "gsm8k"), verbose=False),
            "countdown": countdown.prepare(**SMALL_COUNTDOWN, out=str(root / "countdown")), "sources": src}


def variant(made, task, how, tmp_path):
    """A copy of task's directory as `how` leaves it: as built, prepared before .task existed, or made by
    hand (the splits alone). Returns (path, the tasks a run may use it for)."""
    d = str(tmp_path / f"{task}_{how.replace(' ', '_')}")
    shutil.copytree(made[task], d)
    if how != "as built":
        os.remove(os.path.join(d, datadir.TASK_FILE))
    if how == "by hand":
        for name in ("meta.json", "tokenizer.json"):
            if os.path.exists(os.path.join(d, name)):
                os.remove(os.path.join(d, name))
        return d, {"arith": {"arith", "gsm8k"}, "gsm8k": {"arith", "gsm8k"}, "countdown": {"countdown"}}[task]
    return d, {task}


@pytest.mark.parametrize("how", ["as built", "prepared before .task", "by hand"])
@pytest.mark.parametrize("made_by", ["arith", "gsm8k", "countdown"])
@pytest.mark.parametrize("task", ["arith", "gsm8k", "countdown"])
def test_a_run_accepts_only_its_tasks_data(made, tmp_path, task, made_by, how):
    d, allowed = variant(made, made_by, how, tmp_path)
    if task in allowed:
        datadir.check_task_data(d, task)
        return
    with pytest.raises(UserError) as e:
        datadir.check_task_data(d, task)
    msg = str(e.value)
    assert "\n" not in msg and f"data_dir {d} holds" in msg and f"not {task}'s" in msg, msg


@pytest.mark.parametrize("task, made_by", [("gsm8k", "countdown"), ("countdown", "gsm8k"), ("countdown", "arith"),
                                           ("arith", "countdown"), ("gsm8k", "arith")])
def test_train_grpo_refuses_another_tasks_data_before_any_work(made, tmp_path, task, made_by):
    out = tmp_path / "run"
    with pytest.raises(UserError, match=f"holds {made_by} data, not {task}'s: give --task={made_by}"):
        train_grpo.main([f"--base_ckpt={tmp_path}/no_model_needed", f"--task={task}", f"--data_dir={made[made_by]}",
                         f"--out_dir={out}"])
    assert not out.exists()


@pytest.mark.parametrize("copied", ["train.jsonl", "meta.json", "every split"])
def test_a_directory_with_another_tasks_files_copied_in_is_refused(made, tmp_path, copied):
    """Countdown files copied over arith data (the .task and tokenizer of arith left): mixed, refused."""
    d = str(tmp_path / "mixed")
    shutil.copytree(made["arith"], d)
    for name in ["train.jsonl", "val.jsonl", "test.jsonl", "meta.json"] if copied == "every split" else [copied]:
        shutil.copyfile(os.path.join(made["countdown"], name), os.path.join(d, name))
    with pytest.raises(UserError, match="holds files of different tasks .*build it again"):
        datadir.check_task_data(d, "arith")
    with pytest.raises(UserError, match="not countdown's|different tasks"):
        datadir.check_task_data(d, "countdown")


def test_resume_refuses_data_replaced_by_another_tasks(made, tmp_path, chars_reward):
    """A tiny arith run; then Countdown's splits and meta.json are copied into its data directory (what
    a countdown prepare into it used to do): the resume is refused before it trains."""
    import torch
    from model import GPT, GPTConfig
    from runs.checkpoint import save_checkpoint
    data = str(tmp_path / "data")
    shutil.copytree(made["arith"], data)
    enc = datadir.load_tokenizer(data)
    torch.manual_seed(0)
    args = dict(block_size=128, vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=16, dropout=0.0, bias=False)
    base = str(tmp_path / "base.pt")
    save_checkpoint({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args, "data_dir": data,
                     "iter_num": 0, "config": {}, "train_seconds": 0.0, "metrics": {}}, base)
    run = str(tmp_path / "run")
    train_grpo.main([f"--base_ckpt={base}", f"--out_dir={run}", "--max_iters=1", "--batch_size=2", "--group_size=2",
                     "--eval_n=2", "--max_new_tokens=8", "--reward_funcs=('chars',)", "--reward_weights=(1.0,)"])
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "meta.json"):
        shutil.copyfile(os.path.join(made["countdown"], name), os.path.join(data, name))
    before = tree(run)
    with pytest.raises(UserError, match=f"data_dir {data} holds files of different tasks"):
        train_grpo.main([f"--out_dir={run}", "--init_from=resume", "--max_iters=2"])
    assert tree(run) == before


# ------------------------------------------------------------------------------------ preparation


def prepare_into(task, out, made):
    if task == "gsm8k":
        return gsm8k.prepare(*made["sources"], n_val=5, out=out, verbose=False)
    if task == "countdown":
        return countdown.prepare(**SMALL_COUNTDOWN, out=out)
    return synth.prepare(**SMALL_SYNTH, root=os.path.dirname(out))  # out named as data_dir_for names it


def synth_name():
    return os.path.basename(synth.data_dir_for(1, 5, "+", n_train=60, n_val=10, n_test=10, num_merges=20))


CLASHES = ["file", "users files", "official GSM8K files", "symlink", "dangling symlink", "under a file",
           "another task's data"]


@pytest.mark.parametrize("kind", CLASHES)
@pytest.mark.parametrize("task", ["arith", "gsm8k", "countdown"])
def test_prepare_never_writes_over_what_it_did_not_make(made, tmp_path, task, kind):
    box = tmp_path / "box"
    box.mkdir()
    out = str(box / (synth_name() if task == "arith" else "out"))
    if kind == "under a file":
        open(box / "f", "w").write("mine")
        out = str(box / "f" / (synth_name() if task == "arith" else "out"))
    elif kind == "file":
        open(out, "w").write("mine")
    elif kind in ("users files", "official GSM8K files"):
        os.makedirs(out)
        for name in (["notes.txt"] if kind == "users files" else ["train.jsonl", "test.jsonl"]):
            shutil.copyfile(made["sources"][0], os.path.join(out, name))
    elif kind == "symlink":
        os.symlink(str(tmp_path), out)
    elif kind == "dangling symlink":
        os.symlink(str(tmp_path / "nowhere"), out)
    else:
        other = "countdown" if task != "countdown" else "gsm8k"
        shutil.copytree(made[other], out)
    sources = os.path.dirname(made["sources"][0])
    before = tree(str(tmp_path), sources)
    with pytest.raises(UserError) as e:
        prepare_into(task, out, made)
    msg = str(e.value)
    assert out in msg and "\n" not in msg, msg
    assert tree(str(tmp_path), sources) == before


@pytest.mark.parametrize("task", ["gsm8k", "countdown"])
def test_prepare_into_the_folder_of_its_sources_is_refused(made, tmp_path, task):
    """--out=the folder holding the official files (data/gsm8k itself): they would be overwritten."""
    folder = os.path.dirname(made["sources"][0])
    before = tree(folder)
    with pytest.raises(UserError, match="holds"):
        prepare_into(task, folder, made)
    assert tree(folder) == before


@pytest.mark.parametrize("task", ["arith", "gsm8k", "countdown"])
@pytest.mark.parametrize("state", ["new", "empty", "its own, complete", "its own, cut off", "prepared before .task"])
def test_prepare_writes_new_empty_and_its_own_directories(made, tmp_path, task, state):
    out = str(tmp_path / (synth_name() if task == "arith" else "out"))
    if state == "empty":
        os.makedirs(out)
    elif state != "new":
        shutil.copytree(made[task], out)
        if state == "its own, cut off":
            os.remove(os.path.join(out, "meta.json"))
            os.remove(os.path.join(out, "val.jsonl"))
        if state == "prepared before .task":
            os.remove(os.path.join(out, datadir.TASK_FILE))
    assert prepare_into(task, out, made) == out
    datadir.check_task_data(out, task)
    assert open(os.path.join(out, "train.jsonl")).read() == open(os.path.join(made[task], "train.jsonl")).read()
    assert os.path.exists(os.path.join(out, datadir.TASK_FILE)) == (state != "prepared before .task")


# ----------------------------------------------------------------------------------- GSM8K answers


def answer_texts():
    """Answer texts after '####': signs, digit runs, commas well and badly placed, decimals, other digits."""
    bodies = ["7", "72", "1234", "1,234", "12,345,678", "1,2,3", "12,34", "1,2345", ",123", "123,", "1,,234",
              "0", "007", "७२", "７２", "", "four", "1 2", "9" * 100, "9" * 101, "9" * 5000]
    for sign, body, frac in itertools.product(["", "-", "+"], bodies, ["", ".0", ".00", ".5", "."]):
        yield f"{sign}{body}{frac}"


@pytest.mark.parametrize("text", list(answer_texts()))
def test_gsm8k_answers_are_read_as_the_reward_reads_them(tmp_path, text):
    """Stored answers equal what rewards.extract_answer reads from the same '#### ...' line; what it does
    not read as that number (or at all) is an error naming the line, or a skipped fraction."""
    rows = TRAIN[:12] + [("How many?", f"So it is.\n#### {text}", None)]
    train = write_gsm8k(tmp_path / "train.jsonl", rows)
    test = write_gsm8k(tmp_path / "test.jsonl", TEST)
    reward_reads = rewards.extract_answer(f"#### {text}")
    try:
        out = gsm8k.prepare(train, test, n_val=2, out=str(tmp_path / "out"), verbose=False)
    except UserError as e:
        msg = str(e)
        assert "\n" not in msg and f"{train}, line 13:" in msg and "set_int_max_str_digits" not in msg, msg
        return  # (stricter than the reward, which also reads "#### 7." or "#### 14 apples": never another number)
    stored = {r["question"].split("\n")[0]: r["answer"] for s in ("train", "val")
              for r in map(json.loads, open(f"{out}/{s}.jsonl"))}
    if "How many?" not in stored:  # skipped: a fraction ("1.5"), counted
        assert reward_reads is None and "." in text, text
        return
    assert stored["How many?"] == reward_reads, (text, stored["How many?"], reward_reads)


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_gsm8k_empty_questions_are_skipped_and_counted(tmp_path, capsys, question):
    rows = TRAIN[:12] + [(question, "1+1 = 2\n#### 2", 2)] * 2
    train = write_gsm8k(tmp_path / "train.jsonl", rows)
    out = gsm8k.prepare(train, write_gsm8k(tmp_path / "test.jsonl", TEST), n_val=2, out=str(tmp_path / "out"))
    assert "skipped 2 problem(s) with an empty question (line 13, 14)" in capsys.readouterr().out
    assert json.load(open(f"{out}/meta.json"))["dropped"]["train_empty_question"] == 2
    assert all(r["question"].split("\n")[0].strip() for s in ("train", "val", "test")
               for r in map(json.loads, open(f"{out}/{s}.jsonl")))


def test_an_over_long_question_is_named(tiny_setup, tmp_path):
    """One test question longer than the base's context: the error names its file and line, not
    max_new_tokens alone; one that fits only without the new tokens names both."""
    import torch
    data = torch.load(tiny_setup, weights_only=False)["data_dir"]
    copy = str(tmp_path / os.path.basename(data))
    shutil.copytree(data, copy)
    rows = open(f"{copy}/test.jsonl").read().splitlines()
    rows[6] = json.dumps({**json.loads(rows[6]), "question": "Mia has 1 pear. " * 40})
    open(f"{copy}/test.jsonl", "w").write("\n".join(rows) + "\n")
    ckpt = torch.load(tiny_setup, weights_only=False)
    ckpt["data_dir"] = copy
    torch.save(ckpt, tmp_path / "base.pt")
    with pytest.raises(UserError, match=f"question at line 7 of {copy}/test.jsonl .* is \\d+ tokens, the base's "
                                        "whole context 128: remove it"):
        train_grpo.main([f"--base_ckpt={tmp_path}/base.pt", f"--out_dir={tmp_path}/run", "--max_new_tokens=8"])


def test_question_lengths_are_refused_where_the_knobs_are_checked(tiny_setup):
    """checks/grpo_knobs.check_question_lengths: a question that fills the base's context alone is named
    by its file and line; one that fits only without the new tokens names max_new_tokens and what fits."""
    from types import SimpleNamespace
    import torch
    from checks.grpo_knobs import check_question_lengths
    from data.prompts import encode_prompt
    enc = datadir.load_tokenizer(torch.load(tiny_setup, weights_only=True)["data_dir"])
    splits = {"train": [{"question": "Mia has 1 pear."}], "val": [],
              "test": [{"question": "Mia has 1 pear."}, {"question": "Mia has 1 pear. " * 3}]}
    n = len(encode_prompt(enc, splits["test"][1]["question"]))
    model = SimpleNamespace(config=SimpleNamespace(block_size=n + 4))
    assert check_question_lengths({"max_new_tokens": 4}, model, enc, splits, "D") == n
    with pytest.raises(UserError, match=rf"^config key 'max_new_tokens' = 5 is not allowed: the longest question, "
                                        rf"{n} tokens at line 2 of D/test.jsonl \('Mia has 1 pear. Mia.*\.\.\.\), "
                                        rf"\+ max_new_tokens must fit the base's context of {n + 4}: give at "
                                        r"most 4, or remove that question$"):
        check_question_lengths({"max_new_tokens": 5}, model, enc, splits, "D")
    model.config.block_size = n
    with pytest.raises(UserError, match=rf"^the question at line 2 of D/test.jsonl .* is {n} tokens, the base's "
                                        rf"whole context {n}: remove it$"):
        check_question_lengths({"max_new_tokens": 1}, model, enc, splits, "D")


# ------------------------------------------------ a Countdown base (train_base.py's): advice that works
SEARCHED = dict(n_numbers=3, max_number=10, max_target=100, max_misses=1, n_train=30, n_val=5,
                n_test=5, num_merges=0)


@pytest.fixture
def countdown_base(tmp_path, monkeypatch):
    """(checkpoint, its data directory, that directory's train.jsonl bytes): a random Countdown base
    on data/countdown/searched.py's data, built under tmp_path."""
    import torch
    from data.countdown import searched
    from model import GPT, GPTConfig
    from runs.checkpoint import save_checkpoint
    monkeypatch.setattr(searched, "ROOT", str(tmp_path / "data"))
    d = searched.prepare(**SEARCHED, verbose=False)
    enc = datadir.load_tokenizer(d)
    torch.manual_seed(0)
    args = dict(block_size=256, vocab_size=enc.n_vocab, n_layer=1, n_head=1, n_embd=8)
    path = str(tmp_path / "base" / "ckpt.pt")
    save_checkpoint({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args,
                     "data_dir": d, "iter_num": 0, "config": {"task": "countdown"},
                     "train_seconds": 0.0, "metrics": {}}, path)
    with open(os.path.join(d, "train.jsonl"), "rb") as f:
        return path, d, f.read()


def grpo(base, tmp_path, *extra):
    return train_grpo.main([f"--base_ckpt={base}", "--task=countdown", f"--out_dir={tmp_path / 'run'}",
                            "--max_iters=1", "--batch_size=2", "--group_size=2", "--eval_n=2",
                            "--eval_k=1", "--max_new_tokens=4", *extra])


@pytest.mark.parametrize("other", ["arith", "gsm8k", "countdown"])
def test_countdown_base_given_another_data_dir_is_told_to_leave_it(made, countdown_base, tmp_path,
                                                                  other, monkeypatch):
    """Another task's directory, or prepare.py's Countdown directory: the base reads its own data,
    so the fix is data_dir '' (neither --task nor prepare.py would do); following it, the run starts."""
    base, own, _ = countdown_base
    with pytest.raises(UserError, match=r"the base checkpoint .* was trained on its own task data "
                                        rf"\({own}\): leave data_dir ''$"):
        grpo(base, tmp_path, f"--data_dir={made[other]}")
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(train_grpo, "train", lambda cfg, run: None)  # started: enough
    grpo(base, tmp_path)


def follow(message, monkeypatch, tmp_path):
    """Do what the message says: remove the directory, run the command it names (in process, its
    knobs parsed from --k=v, the searched root where the fixture put it)."""
    import ast
    from data.countdown import searched
    d, knobs = re.search(r"remove (\S+) and build it again with: "
                         r"python data/countdown/searched.py((?: --\w+=[\w.]+)+)", message).groups()
    knobs = dict(a[2:].split("=") for a in knobs.split())
    shutil.rmtree(d)
    searched.prepare(**{k: ast.literal_eval(v) for k, v in knobs.items()}, verbose=False)


@pytest.mark.parametrize("how", [".task", "every file", "every file, resumed"])
def test_countdown_base_whose_data_another_task_claims_is_rebuilt_as_advised(
        made, countdown_base, tmp_path, monkeypatch, how):
    """Its .task names arith, or arith's files are copied over it: the message names searched.py
    with the directory's knobs (prepare.py builds another kind of directory); followed, it gives
    back the very data the base was trained on, and the run starts."""
    base, own, train_bytes = countdown_base
    if how == ".task":
        with open(os.path.join(own, ".task"), "w") as f:
            f.write("arith\n")
    else:
        for name in ("train.jsonl", "val.jsonl", "test.jsonl", "meta.json", ".task"):
            shutil.copyfile(os.path.join(made["arith"], name), os.path.join(own, name))
    with pytest.raises(UserError) as e:
        if how.endswith("resumed"):  # train_base.py's resume says the same
            datadir.check_task_data(own, "countdown", resuming=True)
        else:
            grpo(base, tmp_path)
    message = str(e.value)
    assert "\n" not in message and "prepare.py" not in message, message
    follow(message, monkeypatch, tmp_path)
    with open(os.path.join(own, "train.jsonl"), "rb") as f:
        assert f.read() == train_bytes
    monkeypatch.setattr(train_grpo, "train", lambda cfg, run: None)
    grpo(base, tmp_path, f"--data_dir={own}/")  # its own directory in another spelling
