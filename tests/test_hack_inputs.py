# analysis.hack on a damaged run directory: a rollouts.jsonl record whose answer is not
# [numbers, target], whose influence is null or whose selected is text, a log value that is text:
# each skipped (or left out) with a warning naming file and line, the tables made from the rest;
# a run that never scored the exact reward refused in one line. References: the tables of the same
# run without the damaged line, counted here. Run: python -m pytest -q tests/test_hack_inputs.py
import json
import os

import pytest
import torch

from analysis import hack
from configurator import UserError
from data.datadir import load_tokenizer
from data.gsm_synth.prepare import prepare


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return prepare(steps=1, max_operand=5, ops="+", n_train=300, n_val=20, n_test=20,
                   num_merges=20, verbose=False, root=str(root))


STEPS = [{"iter": i, "elapsed": float(i), "rewards/countdown_claim": 0.5,
          "rewards/countdown": 0.25, "hack_rate": 0.25, "selection_rate": 0.5}
         for i in range(1, 4)]


def make_run(path, data_dir, records, log=None, funcs=("countdown_claim", "countdown")):
    """A TracIn run directory as train_grpo.py leaves it: ckpt.pt (its config), log.jsonl,
    rollouts.jsonl."""
    os.makedirs(path)
    cfg = {"tracin": True, "tracin_val_loss": "pg", "tracin_val_batch_size": 2,
           "reward_funcs": funcs}
    torch.save({"config": cfg, "data_dir": data_dir, "lora": {}}, os.path.join(path, "ckpt.pt"))
    log = log or [{"iter": 0, "elapsed": 0.0, "test/accuracy": 0.1}, *STEPS]
    for name, rows in (("log.jsonl", log), ("rollouts.jsonl", records)):
        with open(os.path.join(path, name), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def record(enc, step, selected=(True, False), influence=(0.5, -0.25)):
    ids = enc.encode("1+2=3")
    return {"iter": step, "prompts": ["p"], "answers": [[[1, 2], 3]],
            "completion_tokens": [ids, ids], "completion_mask": [[1] * len(ids)] * 2,
            "rewards": [1.0, 0.0], "advantages": [1.0, -1.0],
            "influence": list(influence), "selected": list(selected)}


def others_row(table):
    """(kept, all) of the 'others' column of the TracIn table: no completion here is a hack
    or right (the tiny tokenizer's '1+2=3' is no Countdown answer)."""
    row = table.strip().splitlines()[-1].split("|")
    kept, _, n = row[4].split()[:3]
    return int(kept), int(n)


@pytest.mark.parametrize("damage, said", [
    (dict(answers=["7"]), "answer that is not of the task's form"),
    (dict(answers=[[1, 2, 3]]), "answer that is not of the task's form"),
    (dict(answers=[[[1, 2], "3"]]), "answer that is not of the task's form"),
    (dict(influence=[None, 0.1]), "value of influence that is not a number"),
    (dict(selected=["no", "no"]), "value of selected that is not true or false"),
    (dict(selected="no"), "not a list"),
])
def test_a_damaged_record_is_skipped_by_name_and_the_rest_counted(tmp_path, capsys, data_dir,
                                                                  damage, said):
    enc = load_tokenizer(data_dir)
    good = [record(enc, 1), record(enc, 3)]
    hack.main([make_run(tmp_path / "good", data_dir, good)])
    assert others_row(capsys.readouterr().out) == (2, 4)  # one of each record's two kept
    bad = [good[0], {**record(enc, 2, selected=(True, True)), **damage}, good[1]]
    run = make_run(tmp_path / "bad", data_dir, bad)
    hack.main([run])
    out = capsys.readouterr()
    assert others_row(out.out) == (2, 4)  # the damaged record counts for nothing
    assert f"rollouts.jsonl line 2: the record " in out.err and said in out.err


@pytest.mark.parametrize("key, value", [("rewards/countdown", "high"), ("hack_rate", [0.5]),
                                        ("test/accuracy", "10 %")])
def test_a_text_log_value_is_left_out_by_name(tmp_path, capsys, data_dir, key, value):
    enc = load_tokenizer(data_dir)
    log = [{"iter": 0, "elapsed": 0.0, "test/accuracy": 0.1}, *STEPS]
    log[2] = {**log[2], key: value}
    hack.main([make_run(tmp_path / "r", data_dir, [record(enc, 1)], log)])
    out = capsys.readouterr()
    assert f"log.jsonl line 3: {key} is {json.dumps(value)}, not a number; left out" in out.err
    assert "| TracIn pg, 2 val |" in out.out


@pytest.mark.parametrize("funcs, why", [(("countdown_claim", "think_format"), "lack it: add it"),
                                        (("countdown_claim", "countdown"), "no training step")])
def test_a_run_that_never_scored_the_exact_reward_is_named(tmp_path, capsys, data_dir, funcs,
                                                           why):
    enc = load_tokenizer(data_dir)
    steps = [{k: v for k, v in s.items() if k not in ("rewards/countdown", "hack_rate")}
             for s in STEPS]
    log = [{"iter": 0, "elapsed": 0.0, "test/accuracy": 0.1}, *steps]
    run = make_run(tmp_path / "r", data_dir, [record(enc, 1)], log, funcs)
    with pytest.raises(UserError, match=f"never scored the exact reward 'countdown'.*{why}"):
        hack.main([run])
    assert "nan" not in capsys.readouterr().out
