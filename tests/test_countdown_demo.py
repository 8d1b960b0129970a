# analysis/countdown_demo.py: the demo's figure from train_grpo.py runs (learning curves and greedy
# completions of the same test problems before and after). Independent references: the "before" column
# against the base checkpoint loaded alone (no adapter at all), the "after" columns against the adapter
# merged into the weights (runs.loading.load_policy(merge=True), another code path than LoRA switched off/on).
import shutil

import pytest

from analysis import countdown_demo
from configurator import UserError
from data.tasks import load_task_split
from data.prompts import decode_completions, encode_prompt, stop_tokens
from model import Sampling, generate
from runs.loading import load_policy
from test_train_grpo import run as grpo_run


@pytest.fixture(scope="module")
def runs(tiny_setup, tmp_path_factory):
    import rewards
    root = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as mp:  # a reward that varies on an untrained model: the adapter moves
        mp.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
        grpo_run(tiny_setup, root / "grpo", "--max_iters=3", "--beta=0")
        grpo_run(tiny_setup, root / "tracin", "--max_iters=3", "--beta=0", "--tracin=True",
                 "--tracin_val_loss=nll", "--tracin_val_batch_size=2")
    return [str(root / "grpo"), str(root / "tracin")]


def greedy(path, problems, merge):
    model, enc, _ = load_policy(path, merge=merge)
    greedy = Sampling(temperature=0, vocab_size=enc.n_vocab)
    idx, _, mask = generate(model, [encode_prompt(enc, e["question"]) for e in problems], 8, stop_tokens(enc),
                            sampling=greedy)
    return decode_completions(enc, idx, mask)


def test_columns_are_the_base_and_each_final_adapter(runs, tiny_setup):
    problems, columns, correct, task = countdown_demo.greedy_answers(runs, 3)
    assert task == "arith"
    _, _, data_dir = load_policy(tiny_setup)
    assert [e["question"] for e in problems] == [e["question"] for e in load_task_split(data_dir, "test")[:3]]
    names = list(columns)
    assert names == ["base (step 0)", "grpo (step 3)", "tracin (step 3)"]
    assert columns["base (step 0)"] == greedy(tiny_setup, problems, False)
    for name, d in zip(names[1:], runs):
        assert columns[name] == greedy(f"{d}/ckpt.pt", problems, True)
    assert correct(columns[names[0]][0], problems[0]["answer"]) in (0.0, 1.0)


def test_figure_is_written(runs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "fig.png"
    countdown_demo.main([*runs, f"--out={out}", "--problems=2"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_one_line(runs, tmp_path, tiny_setup, tmp_path_factory):
    for argv, match in (([], "no run directory"), ([*runs, "--problems=0"], "--problems"),
                        ([*runs, "--out=/nonexistent/x.png"], "existing directory"), ([*runs, "--x=1"], "bad argument"),
                        ([str(tmp_path)], "no log.jsonl")):
        with pytest.raises(UserError, match=match):
            countdown_demo.main(argv)
    # a run on another base: refused, the figure has one "before" column
    other = tmp_path_factory.mktemp("other") / "ckpt.pt"
    shutil.copy(tiny_setup, other)
    import torch
    ck = torch.load(other, weights_only=False)
    ck["model"]["lm_head.weight"] = ck["model"]["lm_head.weight"] + 1
    torch.save(ck, other)
    with pytest.MonkeyPatch.context() as mp:
        import rewards
        mp.setitem(rewards.REWARD_FUNCS, "chars", lambda completion, answer: len(completion) / 10)
        grpo_run(str(other), tmp_path / "r2", "--max_iters=1")
    with pytest.raises(UserError, match="another base"):
        countdown_demo.greedy_answers([runs[0], str(tmp_path / "r2")], 1)


def test_the_title_names_the_runs_task_and_kinds(runs):
    from analysis.plot import load_log
    logs = [load_log(d) for d in runs]
    title = countdown_demo.figure_title("arith", logs, 2)
    assert title.startswith("Arithmetic word problems: GRPO and TracIn-GRPO from one base")
    assert "Countdown" not in title
    title = countdown_demo.figure_title("countdown", logs[:1], 2)
    assert title.startswith("Countdown: GRPO from one base")


@pytest.mark.parametrize("name", ["fig.png", "fig.pdf", "fig.svg", "fig.jpg", "FIG.PNG"])
def test_an_existing_file_is_never_overwritten(tmp_path, name):
    out = tmp_path / name
    out.write_bytes(b"someone else's file")
    with pytest.raises(UserError, match="exists and was not written by analysis.countdown_demo"):
        # refused before any run is read
        countdown_demo.main([str(tmp_path / "no_run"), f"--out={out}"])
    assert out.read_bytes() == b"someone else's file"


@pytest.mark.parametrize("name", ["fig.xyz", "fig", "fig.PNG.bak", "fig.html"])
def test_a_format_matplotlib_cannot_write_is_refused_first(tmp_path, name):
    with pytest.raises(UserError, match="matplotlib cannot write"):
        countdown_demo.main([str(tmp_path / "no_run"), f"--out={tmp_path / name}"])


def test_base_ckpt_is_taken_and_passed_on(runs, tiny_setup, tmp_path):
    """A moved base is found again with --base_ckpt, which the base-binding error advises."""
    moved = tmp_path / "moved.pt"
    shutil.copy(tiny_setup, moved)
    problems, columns, _, _ = countdown_demo.greedy_answers(runs[:1], 1, base_ckpt=str(moved))
    assert len(columns) == 2
    # the option parses (then --out is refused)
    with pytest.raises(UserError, match="matplotlib cannot write"):
        countdown_demo.main([*runs, f"--base_ckpt={moved}", f"--out={tmp_path / 'x.bad'}"])


@pytest.mark.parametrize("fmt", ["png", "pdf"])
def test_the_same_command_again_replaces_its_own_figure(runs, tmp_path, fmt):
    pytest.importorskip("matplotlib")
    out = tmp_path / f"fig.{fmt}"
    countdown_demo.main([*runs, f"--out={out}", "--problems=1"])
    countdown_demo.main([*runs, f"--out={out}", "--problems=1"])
    assert countdown_demo.written_here(str(out))
