"""The real tasks end to end on a tiny random Qwen2-style directory (tests/hf_dirs.py), with the smoke
configs: prepare (GSM8K from a fixture in the official format; Countdown generated), sample.py, the
task's rewards, GRPO with TracIn, tracin.py's post-hoc attribution and export.py. A random model
scores 0 on the task, so a length reward ("chars") is added to give the groups an advantage to learn
from; the task's own rewards still score every completion. Run: python -m pytest -q tests/test_smoke.py"""
import glob
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="transformers writes the tiny model directory (installed by .ci/run)")
pytest.importorskip("tokenizers", reason="tokenizers trains its tokenizer (installed by .ci/run)")
from analysis import attribute
import export  # noqa: E402
import tracin  # noqa: E402
import train_grpo  # noqa: E402
from hf_dirs import make_dir  # noqa: E402
from test_task_data import TEST, TRAIN, write_gsm8k  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen"))
    make_dir(path, "qwen2", tied=True)
    return path


def task_dir(task, tmp_path):
    if task == "gsm8k":
        from data.gsm8k.prepare import prepare
        return prepare(write_gsm8k(tmp_path / "train.jsonl", TRAIN), write_gsm8k(tmp_path / "test.jsonl", TEST),
                       n_val=5, out=str(tmp_path / "gsm8k"), verbose=False)
    from data.countdown.prepare import prepare
    return prepare(n_train=200, n_val=20, n_test=20, out=str(tmp_path / "countdown"), verbose=False)


@pytest.mark.parametrize("task", ["gsm8k", "countdown"])
def test_smoke_config_runs_every_path(task, model_dir, tmp_path, chars_reward, capsys):
    from data.prompts import encode_prompt
    from runs.loading import load_policy
    from data.tasks import TASKS
    data, run = task_dir(task, tmp_path), str(tmp_path / "run")
    rewards = (*TASKS[task]["rewards"], "chars")
    cfg = train_grpo.main([f"config/smoke_{task}.py", f"--base_ckpt={model_dir}", f"--data_dir={data}",
                           f"--out_dir={run}", f"--reward_funcs={rewards!r}", "--reward_weights=(1.0, 0.1, 1.0)"])
    assert cfg["task"] == task and cfg["tracin"]
    logs = [json.loads(line) for line in open(f"{run}/log.jsonl")]
    steps = [r for r in logs if "reward" in r]
    assert len(steps) == 3 and all(f"rewards/{TASKS[task]['correct']}" in r for r in steps)
    assert "test/accuracy" in logs[-1]  # evaluated with the task's correctness reward
    if task == "countdown":  # no well-formed <answer> from a random model: nothing parsed, each one counted
        assert sum(r.get("rewards/countdown/skipped", 0) for r in steps) > 0
    question = json.loads(open(f"{data}/train.jsonl").readline())["question"]
    _, enc, _ = load_policy(f"{run}/ckpt.pt")  # the run's prompts: the question alone, its own instruction
    from transformers import AutoTokenizer
    want = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=True)
    assert encode_prompt(enc, question) == list(want["input_ids"])

    attribute.main([f"--out_dir={run}", f"--question={question}", "--n_probe=8"])
    (result,) = glob.glob(f"{run}/tracin_*.json")  # one file per question and answer
    assert json.load(open(result))["scores"]
    export.main([f"--out_dir={run}"])
    assert os.path.isfile(f"{run}/peft_adapter/adapter_model.safetensors")
    res = subprocess.run([sys.executable, "sample.py", f"--ckpt={run}/ckpt.pt", "--num_samples=1",
                          "--max_new_tokens=8", f"--question={question}"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and f"--- {question}" in res.stdout, res.stderr


def test_other_tasks_need_a_model_directory(tiny_setup, tmp_path):
    from configurator import UserError
    with pytest.raises(UserError, match="task.*must be 'arith', the task of the base"):
        train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path}/r", "--task=countdown"])
    with pytest.raises(UserError, match="task"):
        train_grpo.main([f"--base_ckpt={tiny_setup}", f"--out_dir={tmp_path}/r", "--task=chess"])
    with pytest.raises(UserError, match=f"model directory {tmp_path}/models/q not found: download it once"):
        train_grpo.main(["config/countdown_qwen15b.py", f"--base_ckpt={tmp_path}/models/q", f"--out_dir={tmp_path}/r",
                         "--device=cpu"])
    assert not os.path.exists(f"{tmp_path}/r")  # refused before any file
