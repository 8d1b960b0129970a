# A base model whose weights hold NaN or Inf: sample.py says which weight in one line (no traceback from
# sampling), and a GRPO run on it stops with advice that can work (a finite base), not "lower learning_rate".
# Run: python -m pytest -q tests/test_nonfinite_base.py
import copy
import shutil

import pytest
import torch

import sample
from model import NonFiniteLogits
from configurator import UserError, cli_main
from runs.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")
BAD = [float("nan"), float("inf"), -float("inf")]


def spoil(sd, name, value, where=0):
    """One element of weight `name` set to value (a state dict's tensor, in place)."""
    sd[name].view(-1)[where] = value


def refused(capsys, argv):
    capsys.readouterr()  # what came before (transformers' warnings while writing a directory)
    with pytest.raises(SystemExit) as e:
        cli_main(sample.main, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("value", BAD)
def test_a_base_checkpoint_with_a_non_finite_weight_is_one_line(tiny_setup, tmp_path, capsys, value):
    ckpt = load_checkpoint(tiny_setup)
    names = [n for n, t in ckpt["model"].items() if t.is_floating_point()]
    assert len(names) >= 5
    for name in names[::2]:  # embeddings, norms, attention, MLP, ...
        bad = copy.deepcopy(ckpt)  # keeps a tied head one tensor with the embedding
        spoil(bad["model"], name, value, where=bad["model"][name].numel() - 1)
        path = str(tmp_path / "ckpt.pt")
        save_checkpoint(bad, path)
        err = refused(capsys, [f"--ckpt={path}", "--question=Mia has 2 pears.", "--max_new_tokens=4"])
        assert "holds NaN/Inf" in err and f"{path}:" in err and "weight" in err, name


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_model_directory_with_a_non_finite_weight_is_one_line(tmp_path, capsys, family):
    pytest.importorskip("transformers", reason="transformers writes the reference directory (.ci/run)")
    from safetensors.torch import load_file, save_file
    from hf_dirs import make_dir
    src = tmp_path / "src"
    make_dir(str(src), family)
    sd = load_file(str(src / "model.safetensors"))
    for i, name in enumerate(sorted(sd)[::3]):
        d = tmp_path / f"d{i}"
        shutil.copytree(src, d)
        bad = {k: v.clone() for k, v in sd.items()}
        spoil(bad, name, BAD[i % 3])
        save_file(bad, str(d / "model.safetensors"), metadata={"format": "pt"})
        err = refused(capsys, [f"--ckpt={d}", "--start=Sam buys", "--max_new_tokens=4", "--temperature=0"])
        assert "holds NaN/Inf" in err, name


def test_non_finite_logits_from_finite_weights_are_one_line(tiny_setup, monkeypatch, capsys):
    def overflow(*a, **k):
        raise NonFiniteLogits("NaN/Inf logits in 2 of 2 sampled rows")
    monkeypatch.setattr(sample, "generate", overflow)
    err = refused(capsys, [f"--ckpt={tiny_setup}", "--question=Mia has 2 pears.", "--max_new_tokens=4"])
    assert "NaN/Inf logits in 2 of 2 sampled rows" in err


def test_a_grpo_run_on_a_nan_base_names_the_base_not_the_learning_rate(tiny_setup, tmp_path, chars_reward):
    import train_grpo
    ckpt = load_checkpoint(tiny_setup)
    spoil(ckpt["model"], "transformer.wte.weight", float("nan"))
    base = str(tmp_path / "base.pt")
    save_checkpoint(ckpt, base)
    with pytest.raises(UserError) as e:
        train_grpo.main([f"--base_ckpt={base}", f"--out_dir={tmp_path}/run", "--max_iters=4", "--max_skipped_steps=2",
                         "--batch_size=2", "--group_size=2", "--eval_n=2", "--max_new_tokens=4"])
    msg = str(e.value)
    assert "learning_rate" not in msg and "transformer.wte.weight holds NaN/Inf" in msg and base in msg
