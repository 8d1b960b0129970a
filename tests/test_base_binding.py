"""An adapter is bound to its whole base: weights, the configuration that changes what the model computes,
the tokenizer and its chat format. Each change of a Hugging Face base after training is refused by every
script that puts the adapter on it (sampling, attribution, export, resume), naming what changed; a run
saved before the base's identity was recorded (its tensors' fingerprint only) still loads and resumes.
A moved base gets one message from every script, naming --base_ckpt=PATH, and that fix works.
Run: python -m pytest -q tests/test_base_binding.py"""
import json
import os
import shutil

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is the test-only reference (installed by .ci/run)")
pytest.importorskip("tokenizers", reason="tokenizers trains the test tokenizers (installed by .ci/run)")

import train_grpo  # noqa: E402
from analysis import attribute  # noqa: E402
from configurator import UserError  # noqa: E402
from hf_dirs import make_dir, write_config  # noqa: E402
from runs.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
import export  # noqa: E402
import runs.loading  # noqa: E402
import sample  # noqa: E402

QUESTION = "Mia has 2 pears. How many?"
TINY = ["--max_iters=1", "--batch_size=2", "--group_size=2", "--max_new_tokens=6", "--eval_n=2", "--eval_k=1",
        "--ckpt_interval=1", "--learning_rate=0.05", "--reward_funcs=('chars',)", "--reward_weights=(1.0,)"]
LLAMA_TARGETS = "--lora_targets=('q_proj','v_proj')"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from data.gsm_synth.prepare import prepare
    return prepare(steps=1, max_operand=5, ops="+", n_train=60, n_val=10, n_test=10, num_merges=20, verbose=False,
                   root=str(tmp_path_factory.mktemp("data")))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A pristine tiny Qwen2 directory (chat template, untied head, non-default theta); tests copy it."""
    path = str(tmp_path_factory.mktemp("qwen"))
    make_dir(path, "qwen2", tied=False, rope_theta=50000.0)
    return path


@pytest.fixture
def trained(base, data, tmp_path, monkeypatch):
    """(base copy, run directory): a one-step GRPO run on a copy of the base, from the project root."""
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
    b, run = str(tmp_path / "base"), str(tmp_path / "run")
    shutil.copytree(base, b)
    train_grpo.main([f"--base_ckpt={b}", f"--data_dir={data}", f"--out_dir={run}", LLAMA_TARGETS, *TINY])
    return b, run


def every_script(run, *extra):
    """Each way an adapter is put back on its base: sampling, attribution, export, resume."""
    return {
        "sample": lambda: sample.main([f"--ckpt={run}/ckpt.pt", f"--question={QUESTION}", "--num_samples=1",
                                       "--max_new_tokens=4", *extra]),
        "attribute": lambda: attribute.main([f"--out_dir={run}", f"--question={QUESTION}", "--n_probe=2",
                                             "--html=", "--figure=", *extra]),
        "export": lambda: export.main([f"--out_dir={run}", f"--adapter_dir={run}/exported", *extra]),
        "resume": lambda: train_grpo.main([f"--out_dir={run}", "--init_from=resume", "--max_iters=2", *extra]),
    }


def edit_json(path, **changes):
    obj = json.load(open(path))
    for k, v in changes.items():
        obj.pop(k, None) if v is None else obj.__setitem__(k, v)
    json.dump(obj, open(path, "w"))


# each change to the base after training, and the words the refusal must hold (the values written here)
CONFIG_CHANGES = {
    "rope_theta": (dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "rope_theta 50000.0 -> 10000.0"),
    "rms_norm_eps": (dict(rms_norm_eps=1e-3), "norm_eps 1e-06 -> 0.001"),
    "tie_word_embeddings": (dict(tie_word_embeddings=True), "tie_head False -> True"),
}
TOKENIZER_CHANGES = {
    "chat template deleted": (lambda b: set_template(b, None), "the tokenizer's chat format; the tokenizer's chat template"),
    "chat template edited": (lambda b: set_template(b, "{{ messages }}"), "the tokenizer's chat template"),
    "stop ids": (lambda b: edit_json(f"{b}/generation_config.json", eos_token_id=[0]), "the tokenizer's stop ids"),
    "split pattern": (lambda b: edit_tokenizer(b, pattern=r"\p{L}+|\p{N}+|\s+|[^\s\p{L}\p{N}]+"),
                      "the tokenizer's split pattern"),
    "NFC normalisation": (lambda b: edit_tokenizer(b, normalizer=None), "the tokenizer's NFC normalisation"),
}


def set_template(b, text):
    """The chat template, wherever transformers saved it (tokenizer_config.json or chat_template.jinja)."""
    edit_json(f"{b}/tokenizer_config.json", chat_template=None)
    if os.path.exists(f"{b}/chat_template.jinja"):
        os.remove(f"{b}/chat_template.jinja")
    if text is not None:
        edit_json(f"{b}/tokenizer_config.json", chat_template=text)


def edit_tokenizer(b, **changes):
    tok = json.load(open(f"{b}/tokenizer.json"))
    if "pattern" in changes:
        tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = changes["pattern"]
    if "normalizer" in changes:
        tok["normalizer"] = changes["normalizer"]
    json.dump(tok, open(f"{b}/tokenizer.json", "w"))


@pytest.mark.parametrize("change", list(CONFIG_CHANGES) + list(TOKENIZER_CHANGES))
def test_a_changed_base_is_refused_by_every_script_naming_the_change(trained, change, monkeypatch):
    b, run = trained
    if change in CONFIG_CHANGES:
        write_config(b, **CONFIG_CHANGES[change][0])
        words = CONFIG_CHANGES[change][1]
    else:
        TOKENIZER_CHANGES[change][0](b)
        words = TOKENIZER_CHANGES[change][1]
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
    for name, call in every_script(run).items():
        with pytest.raises(UserError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and "another base than" in msg and words in msg, (name, msg)
        assert "its weights" not in msg, (name, msg)  # the tensors did not change: only what did is named
    assert not os.path.exists(f"{run}/exported")


def test_the_unchanged_base_and_changed_weights(trained, monkeypatch):
    """The same base passes every script; one weight changed is named as the weights."""
    from safetensors.torch import load_file, save_file
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
    b, run = trained
    runs.loading.load_policy(f"{run}/ckpt.pt")
    sd = load_file(f"{b}/model.safetensors")
    sd["model.norm.weight"][3] += 1e-3
    save_file(sd, f"{b}/model.safetensors", metadata={"format": "pt"})
    for name, call in every_script(run).items():
        with pytest.raises(UserError, match=r"changed: its weights \(fingerprint"):
            call()


def old_form(run):
    """The run as code before base_identity wrote it: the tensors' fingerprint, no identity, no absolute path."""
    for f in os.listdir(run):
        if f.startswith("ckpt") and f.endswith(".pt"):
            ck = load_checkpoint(f"{run}/{f}")
            ck.pop("base_identity", None), ck.pop("base_abspath", None)
            save_checkpoint(ck, f"{run}/{f}")


def test_a_run_saved_before_base_identity_still_loads_and_resumes(trained, monkeypatch, capsys):
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
    b, run = trained
    model_new, _, _ = runs.loading.load_policy(f"{run}/ckpt.pt")
    assert isinstance(load_checkpoint(f"{run}/ckpt.pt")["base_identity"]["tokenizer"], dict)
    old_form(run)
    model_old, _, _ = runs.loading.load_policy(f"{run}/ckpt.pt")
    x = torch.randint(0, 300, (1, 7))
    assert torch.equal(model_new(x)[0], model_old(x)[0])
    write_config(b, rms_norm_eps=1e-3)  # not covered by the old form: accepted, as before
    runs.loading.load_policy(f"{run}/ckpt.pt")
    write_config(b, rms_norm_eps=1e-6)
    train_grpo.main([f"--out_dir={run}", "--init_from=resume", "--max_iters=2"])
    ck = load_checkpoint(f"{run}/ckpt.pt")
    assert ck["iter_num"] == 2 and ck["base_identity"]["config"]["rope_theta"] == 50000.0  # written from now on
    from safetensors.torch import load_file, save_file
    old_form(run)
    sd = load_file(f"{b}/model.safetensors")
    sd["lm_head.weight"][0, 0] += 1.0
    save_file(sd, f"{b}/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match="changed: its weights"):  # what the old form covers is still checked
        runs.loading.load_policy(f"{run}/ckpt.pt")


def test_a_moved_base_gets_one_message_and_its_fix_works(trained, tmp_path, monkeypatch):
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
    b, run = trained
    moved = str(tmp_path / "elsewhere")
    os.rename(b, moved)
    for name, call in every_script(run).items():
        with pytest.raises(UserError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"the base {b} that ") and "--base_ckpt=PATH" in msg, (name, msg)
    for name, call in every_script(run, f"--base_ckpt={moved}").items():
        call()  # the fix the message names
    assert os.path.isfile(f"{run}/exported/adapter_config.json")
    with pytest.raises(UserError, match=r"--base_ckpt=\S+nowhere not found"):
        runs.loading.load_policy(f"{run}/ckpt.pt", base_ckpt=str(tmp_path / "nowhere"))


def test_a_relative_base_is_found_alike_by_every_script(base, data, tmp_path, monkeypatch):
    """A run started with a relative base, then every script run from another directory: each finds the
    base where the run found it (export too: it is a model directory, not a train_base.py checkpoint)."""
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
    shutil.copytree(base, tmp_path / "models" / "qwen")
    monkeypatch.chdir(tmp_path)
    run = str(tmp_path / "run")
    train_grpo.main(["--base_ckpt=models/qwen", f"--data_dir={data}", f"--out_dir={run}", LLAMA_TARGETS, *TINY])
    assert load_checkpoint(f"{run}/ckpt.pt")["base_ckpt"] == "models/qwen"
    os.makedirs(tmp_path / "other")
    monkeypatch.chdir(tmp_path / "other")
    for name, call in every_script(run).items():
        call()
    assert json.load(open(f"{run}/exported/adapter_config.json"))["base_model_name_or_path"] == \
        str(tmp_path / "models" / "qwen")


def test_a_grpo_checkpoint_or_a_directory_given_as_a_base_is_named(trained, tmp_path, monkeypatch):
    import rewards
    monkeypatch.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
    b, run = trained
    with pytest.raises(UserError, match=r"ckpt.pt is a train_grpo.py checkpoint \(a LoRA adapter on the base "):
        train_grpo.main([f"--base_ckpt={run}/ckpt.pt", f"--out_dir={tmp_path}/r2", *TINY])
    from bench.run import main as bench
    for given, words in ((b, "is a Hugging Face model directory, not a checkpoint file"), (run, "is a run directory"),
                         (f"{run}/ckpt.pt", "is a train_grpo.py checkpoint")):
        with pytest.raises(UserError) as e:
            bench([f"--base_ckpt={given}", "--rows=step_cost"])
        assert words in str(e.value) and "corrupt" not in str(e.value), str(e.value)
    from runs.checkpoint import load_checkpoint as load
    for given, words in ((b, "is a Hugging Face model directory, not a checkpoint file"),
                         (run, "is a run directory (its checkpoint: ")):
        with pytest.raises(UserError, match=words.replace("(", r"\(")):
            load(given)
