# Task data and base checkpoints that are wrong in ways the builders and readers must name: a rebuild
# refused after a good directory was found stale (the directory kept, byte for byte), prepare.py's
# Countdown data written over searched.py's (refused), a split of another task copied in or answers of
# no task's form (one line naming the file and line, never a silent 0 % or a traceback), JSON nested
# too deep, a curriculum on data without operators, a resumed base whose checkpoint is not one.
# References: the directory's bytes before and after, rows written by hand.
# Run: python -m pytest -q tests/test_data_inputs.py
import json
import os
import re
import shutil

import pytest
import torch

import train_base
from configurator import UserError
from data import curriculum
from data.countdown import prepare as countdown
from data.datadir import check_task_data, load_split, load_tokenizer
from data.gsm8k import prepare as gsm8k
from data.gsm_synth.prepare import prepare as prepare_synth
from test_task_data import N_VAL, TEST, TRAIN, snapshot, write_gsm8k

SMALL = dict(n_train=20, n_val=2, n_test=2, verbose=False)


@pytest.fixture
def sources(tmp_path):
    return write_gsm8k(tmp_path / "train.jsonl", TRAIN), write_gsm8k(tmp_path / "test.jsonl", TEST)


def test_a_rebuild_refused_after_the_stale_check_keeps_the_directory(sources, tmp_path):
    """Before, meta.json was removed as soon as the directory was found stale, then the new knobs
    were refused: the good directory was left marked incomplete."""
    good = gsm8k.prepare(*sources, n_val=N_VAL, out=str(tmp_path / "g"), verbose=False)
    before = snapshot(good)
    copies = write_gsm8k(tmp_path / "dup.jsonl", [TRAIN[0]] * 30)  # one distinct problem
    with pytest.raises(UserError, match="n_val=5: must be below the 1 distinct problems"):
        gsm8k.prepare(copies, sources[1], n_val=N_VAL, out=good, verbose=False)
    assert snapshot(good) == before
    cd = countdown.prepare(**SMALL, out=str(tmp_path / "c"))
    before = snapshot(cd)
    with pytest.raises(UserError, match="found only 7 distinct problems"):
        countdown.prepare(n_train=10, n_val=1, n_test=1, min_numbers=2, max_numbers=2,
                          max_number=2, out=cd, verbose=False)
    assert snapshot(cd) == before


def test_prepare_never_writes_over_searched_countdown_data(tmp_path):
    d = countdown.prepare(**SMALL, out=str(tmp_path / "s"))
    (tmp_path / "s" / "tokenizer.json").write_text("{}")  # as searched.py's directories hold one
    before = snapshot(d)
    with pytest.raises(UserError, match="searched solutions and a tokenizer .* give another --out"):
        countdown.prepare(**{**SMALL, "n_train": 10}, out=d)
    assert snapshot(d) == before


def write_split(d, split, rows):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{split}.jsonl"), "w") as f:
        f.write("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


ROW = {"question": "1+2?", "solution": "1+2=3\n#### 3", "answer": 3}


@pytest.mark.parametrize("rows, said", [
    ([{**ROW, "answer": "3"}], re.escape("line 1's answer \"3\" is not a whole number, nor [numbers")),
    ([{**ROW, "answer": [3, 3, 3]}], "line 1's answer"),
    ([{**ROW, "answer": True}], "line 1's answer true"),
    ([{**ROW, "answer": 3.0}], "line 1's answer 3.0"),
    ([ROW, {**ROW, "answer": [[1, 2], 3]}], "line 2's answer .*another task's problem"),
    ([{**ROW, "question": 5}], "line 1 is not a problem .*the first two text"),
    ([{**ROW, "solution": None}], "line 1 is not a problem"),
    (["[" * 100000], "line 1 is not a problem"),  # nested too deep for json: not a RecursionError
])
def test_a_split_of_no_tasks_form_is_named_by_its_line(tmp_path, rows, said):
    write_split(str(tmp_path), "train", rows)
    with pytest.raises(UserError, match=said):
        load_split(str(tmp_path), "train")


def test_the_forms_every_task_writes_are_read(tmp_path):
    for i, rows in enumerate(([ROW, {**ROW, "answer": -7}], [{**ROW, "answer": [[3, 5, 7], 24]}])):
        write_split(str(tmp_path / str(i)), "val", rows)
        assert [r["answer"] for r in load_split(str(tmp_path / str(i)), "val")] == \
            [r["answer"] for r in rows]


def test_a_split_of_another_task_copied_in_is_refused_by_name(tmp_path):
    """Before, only train.jsonl's first row was looked at: Countdown's test split in an arith
    directory was scored at 0 % without a word."""
    d = str(tmp_path / "d")
    for split in ("train", "val"):
        write_split(d, split, [ROW])
    write_split(d, "test", [{**ROW, "answer": [[1, 2], 3]}])
    with pytest.raises(UserError, match="holds files of different tasks .*test.jsonl: countdown"):
        check_task_data(d, "arith")
    write_split(d, "test", [ROW])
    check_task_data(d, "arith")  # all three agree
    with pytest.raises(UserError, match="give --task=arith"):
        check_task_data(d, "countdown")
    with pytest.raises(UserError, match="not the countdown data the run was trained on"):
        check_task_data(d, "countdown", resuming=True)  # no --task advice: a resume keeps its task


@pytest.mark.parametrize("meta, said", [
    ({"vocab_size": 5, "sizes": {"train": 1, "val": 1, "test": 1}}, "names no operators"),
    ({}, "cannot be read"), (None, "cannot be read .*No such file")])
def test_a_curriculum_on_data_without_operators_is_one_line(tmp_path, meta, said):
    if meta is not None:
        (tmp_path / "meta.json").write_text(json.dumps(meta))
    cfg = dict(curriculum="1:5,2:5", curriculum_threshold=0.8, curriculum_window=4,
               max_new_tokens=8, eval_n=4)
    with pytest.raises(UserError, match=f"curriculum: .*meta.json {said}.*: a curriculum .*gsm_synth"):
        curriculum.from_config(cfg, str(tmp_path), len, 64, [])


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A base trained for 2 iterations (its checkpoint resumable)."""
    from test_base_resume import ARGS
    out = str(tmp_path_factory.mktemp("base") / "b")
    d = prepare_synth(steps=1, max_operand=5, ops="+", n_train=200, n_val=10, n_test=10,
                      num_merges=20, verbose=False, root=str(tmp_path_factory.mktemp("data")))
    with pytest.MonkeyPatch.context() as m:  # the tiny task in place of the configured one
        m.setattr(train_base, "load_task", lambda cfg, verbose=True: (d, load_tokenizer(d)))
        train_base.main([f"--out_dir={out}", "--max_iters=2", *ARGS])
    return out


@pytest.mark.parametrize("change", [
    lambda c: torch.zeros(3), lambda c: {**c, "config": "x"}, lambda c: {**c, "model_args": "x"},
    lambda c: {k: v for k, v in c.items() if k != "rng"}, lambda c: {**c, "data_dir": 5},
    lambda c: {k: v for k, v in c.items() if k != "iter_num"}])
def test_a_resumed_checkpoint_that_is_not_a_bases_is_one_line(base_run, tmp_path, change):
    d = str(tmp_path / "b")
    shutil.copytree(base_run, d)
    ckpt = torch.load(f"{d}/ckpt.pt", weights_only=True)
    torch.save(change(ckpt), f"{d}/ckpt.pt")
    with pytest.raises(UserError, match="is not a train_base.py checkpoint|holds a Tensor, not a"):
        train_base.main([f"--out_dir={d}", "--init_from=resume"])


def test_an_optimizer_state_of_another_model_is_one_line(base_run, tmp_path):
    d = str(tmp_path / "b")
    shutil.copytree(base_run, d)
    ckpt = torch.load(f"{d}/ckpt.pt", weights_only=True)
    ckpt["optimizer"]["param_groups"] = ckpt["optimizer"]["param_groups"][:1]
    torch.save(ckpt, f"{d}/ckpt.pt")
    with pytest.raises(UserError, match="its optimizer state does not fit the model"):
        train_base.main([f"--out_dir={d}", "--init_from=resume"])
