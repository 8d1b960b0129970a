# A GRPO checkpoint's adapter enters a script at runs/checkpoint.load_adapter (sampling, export, attribution,
# resume) and runs/loading.check_lora: an adapter that does not fit the model, or a run's LoRA knobs that do
# not fit its base, is one line and exit 2 before any sampling or file, as lora.py once said it.
# Run: python -m pytest -q tests/test_adapter_inputs.py
import pytest

import sample
import train_grpo as tg
from configurator import cli_main
from runs.checkpoint import load_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def grpo_ckpt(tiny_setup, tmp_path_factory):
    """A one-step GRPO run's checkpoint on the tiny base."""
    out = tmp_path_factory.mktemp("run")
    tg.main([f"--base_ckpt={tiny_setup}", f"--out_dir={out}", "--max_iters=1", "--batch_size=2", "--group_size=2",
             "--max_new_tokens=4", "--eval_n=2", "--eval_k=1", "--ckpt_interval=1"])
    return load_checkpoint(str(out / "ckpt.pt"))


def said_by_sample(capsys, path):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli_main(sample.main, [f"--ckpt={path}", "--question=Mia has 2 pears.", "--max_new_tokens=2"])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "---" not in out  # nothing sampled
    return err[len("error: "):-1]


def test_an_adapter_with_a_weight_missing_is_one_line(grpo_ckpt, tmp_path, capsys):
    ckpt = dict(grpo_ckpt, lora=dict(grpo_ckpt["lora"]))
    gone = sorted(ckpt["lora"])[0]
    del ckpt["lora"][gone]
    save_checkpoint(ckpt, str(tmp_path / "ckpt.pt"))
    assert said_by_sample(capsys, tmp_path / "ckpt.pt") == (
        f"LoRA weights do not fit this model: missing [{gone!r}], unexpected [] "
        "(were they saved with other lora_targets?)")


def test_an_adapter_weight_of_another_shape_is_one_line(grpo_ckpt, tmp_path, capsys):
    ckpt = dict(grpo_ckpt, lora=dict(grpo_ckpt["lora"]))
    key = sorted(k for k in ckpt["lora"] if ".lora_A." in k)[0]
    r, d = ckpt["lora"][key].shape
    ckpt["lora"][key] = ckpt["lora"][key][:r - 1]
    save_checkpoint(ckpt, str(tmp_path / "ckpt.pt"))
    assert said_by_sample(capsys, tmp_path / "ckpt.pt") == (
        f"LoRA weight {key} has shape ({r - 1}, {d}), model expects ({r}, {d}) "
        "(another lora_r, or a base of another shape?)")


def test_a_runs_lora_targets_that_match_no_layer_of_its_base_are_one_line(grpo_ckpt, tmp_path, capsys):
    ckpt = dict(grpo_ckpt, config=dict(grpo_ckpt["config"], lora_targets=("q_proj",)))
    save_checkpoint(ckpt, str(tmp_path / "ckpt.pt"))
    said = said_by_sample(capsys, tmp_path / "ckpt.pt")
    assert said.startswith("LoRA targets ['q_proj'] match no nn.Linear in the model (its linear layers: [")


def test_a_resumed_run_whose_adapter_does_not_fit_is_refused_before_a_step(grpo_ckpt, tiny_setup, tmp_path):
    from configurator import UserError
    ckpt = dict(grpo_ckpt, lora=dict(grpo_ckpt["lora"]))
    del ckpt["lora"][sorted(ckpt["lora"])[0]]
    save_checkpoint(ckpt, str(tmp_path / "ckpt.pt"))
    with pytest.raises(UserError, match=r"^LoRA weights do not fit this model: missing \["):
        tg.main([f"--out_dir={tmp_path}", "--init_from=resume", "--max_iters=2"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no step, no log written
