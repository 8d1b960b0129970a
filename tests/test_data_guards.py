# Task data guards: every size knob bounded before any work, errors naming the key that was typed,
# damaged markers and missing splits named with their own task's command, a full disk named and
# cleaned up, a resumed GRPO run bound to the data it started on.
# Run: python -m pytest tests/test_data_guards.py -q
# References: the directory tree before and after a refused command (nothing written), wall-clock
# bounds (a refusal takes well under a second where the work would take hours), counts made by brute
# force over the generators, the OS itself for a full disk (RLIMIT_FSIZE: a write past it fails with
# EFBIG).
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

import train_base as tb
import train_grpo as tg
from configurator import UserError, configure
from data import datadir
from data.countdown import prepare as countdown, searched
from data.countdown.solutions import all_tries, max_solutions, max_tries, searched_solution
from data.curriculum import parse_levels
from data.gsm8k import prepare as gsm8k
from data.gsm_synth import prepare as synth
from fileio import write_atomic
from runs.checkpoint import load_checkpoint, save_checkpoint
from checks.grpo_knobs import validate as validate_grpo
from test_task_data import TEST, TRAIN, write_gsm8k
from test_train_grpo import run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_SYNTH = dict(steps=1, max_operand=5, ops="+", n_train=60, n_val=10, n_test=10, num_merges=20,
                   verbose=False)


def refused_fast(call, match):
    """call() raises a UserError matching `match` in under a second (before any work)."""
    start = time.time()
    with pytest.raises(UserError, match=match) as e:
        call()
    assert time.time() - start < 1.0 and "\n" not in str(e.value)
    return str(e.value)


# --- 1. sizes bounded by what the task can produce, before any work ------------------------------
@pytest.mark.parametrize("knobs, match", [
    (dict(n_train=1000, variants=10_000_000),
     r"variants=10000000: must be at most 999: n_train=1000 training"),
    (dict(n_numbers=2, variants=2 ** 40, n_train=1, n_val=1, n_test=1),
     r"variants=1099511627776: must be at most 164: the distinct"),
    (dict(variants=2 ** 40, n_train=1),
     r"variants=1099511627776: must be at most 999000: n_train=1 training"),
    (dict(n_numbers=2, max_misses=1, variants=25, n_train=10, n_val=2, n_test=2),
     r"variants=25: must be at most 20: the distinct"),
    (dict(n_train=10 ** 9),
     r"n_train=1000000000: must be at most 16472: .* at most 17472 distinct problems"),
    (dict(n_val=10 ** 12), r"n_val=1000000000000: must be smaller: n_train \+ n_val \+ n_test = "),
    (dict(max_misses=10 ** 6), r"max_misses=1000000: must be in \[0, 47\]"),
    (dict(n_numbers=4, max_misses=2000), r"max_misses=2000: must be in \[0, 1151\]"),
])
def test_searched_sizes_are_bounded_before_any_work(tmp_path, monkeypatch, knobs, match):
    monkeypatch.setattr(searched, "ROOT", str(tmp_path))
    refused_fast(lambda: searched.prepare(**knobs, verbose=False), match)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("knobs, match", [
    (dict(n_train=10 ** 8), r"n_train=100000000: must be at most 999000: .* the 1000000 rows"),
    (dict(n_test=10 ** 7), r"n_test=10000000: must be at most 979500"),
    (dict(min_numbers=2, max_numbers=2, max_number=3, n_train=100, n_val=5, n_test=5),
     r"n_train=100: must be at most 14: .* at most 24 distinct problems"),
])
def test_countdown_sizes_are_bounded_before_any_work(tmp_path, knobs, match):
    out = tmp_path / "cd"
    refused_fast(lambda: countdown.prepare(**knobs, out=str(out), verbose=False), match)
    assert not out.exists()


@pytest.mark.parametrize("knobs, match", [
    (dict(n_train=10 ** 9), r"n_train=1000000000: must be at most 999000"),
    (dict(steps=1, max_operand=1, ops="*", n_train=300, n_val=10, n_test=10),
     r"n_train=300: must be at most 268: .* at most 288 distinct problems"),
    (dict(steps=1, max_operand=1, ops="*", n_train=10, n_val=500, n_test=500),
     r"n_val=500: must be smaller"),
    (dict(steps=10 ** 6), r"steps=1000000: must be <= 50"),
    (dict(steps=3, min_steps=1, max_operand=1, ops="/", n_train=10 ** 6),
     r"n_train=1000000: must be at most"),
])
def test_arith_sizes_are_bounded_before_any_work(tmp_path, knobs, match):
    refused_fast(lambda: synth.prepare(**{"verbose": False, **knobs}, root=str(tmp_path)), match)
    assert os.listdir(tmp_path) == []


def test_gsm8k_n_val_is_bounded_before_the_files_are_read(tmp_path):
    missing = str(tmp_path / "none.jsonl")  # never read: the knob is refused first
    refused_fast(lambda: gsm8k.prepare(missing, missing, n_val=10 ** 15, out=str(tmp_path / "g")),
                 r"n_val=1000000000000000: must be at most 1000000")


@pytest.mark.parametrize("n_numbers, max_misses", [(2, 0), (2, 1), (2, 3), (3, 0), (3, 1)])
def test_the_bound_on_variants_holds_for_real_problems(n_numbers, max_misses):
    """No problem has more distinct searched solutions than max_solutions says (by drawing)."""
    problems = [([3, 6], 9), ([4, 2], 2), ([5, 5], 10), ([2, 3, 4], 24), ([7, 3, 5], 26)]
    for numbers, target in (p for p in problems if len(p[0]) == n_numbers):
        assert len(all_tries(numbers)) <= max_tries(n_numbers)
        seen = {searched_solution(numbers, target, max_misses, s)[0] for s in range(400)}
        assert len(seen) <= max_solutions(n_numbers, max_misses)


def test_the_bound_on_arith_problems_holds():
    """Drawing far more than count_problems allows finds at most that many distinct questions."""
    import random
    for steps, max_operand, ops in ((1, 1, "*"), (1, 2, "/"), (1, 1, "-"), (2, 1, "*")):
        rng = random.Random(0)
        seen = {synth.make_problem(rng, steps, max_operand, ops)[0] for _ in range(20000)}
        assert len(seen) <= synth.count_problems(steps, max_operand, ops)


def test_curriculum_sizes_are_bounded(tmp_path):
    with pytest.raises(UserError, match=r"steps in \[1, 50\]"):
        parse_levels("1:5,100000000:5")
    cfg = configure(tg.defaults, [f"--out_dir={tmp_path}/r", "--curriculum=1:1",
                                  "--eval_n=100000000"])
    refused_fast(lambda: validate_grpo(cfg),
                 r"config key 'eval_n' = 100000000 is not allowed: at most \d+ with")


# --- 2. errors name the key typed; a knob another task reads is refused -------------------------
@pytest.mark.parametrize("args, match", [
    (["--task=countdown", "--n_train=300", "--countdown_variants=10000000"],
     "config key 'countdown_variants' = 10000000 is not allowed: must be at most 3330: "),
    (["--task=countdown", "--countdown_variants=10000000"],
     r"'countdown_variants' = 10000000 .* at most 49: n_train=20000 training problems written "
     r"countdown_variants times"),
    (["config/countdown_base.py", "--countdown_variants=10000000"],
     r"'countdown_variants' = 10000000 .* at most 555"),
    (["--task=countdown", "--countdown_max_number=500"],
     "config key 'countdown_max_number' = 500 is not allowed"),
    (["--task=countdown", "--countdown_numbers=9"],
     "config key 'countdown_numbers' = 9 is not allowed"),
    (["--task=countdown", "--countdown_max_target=0"],
     "config key 'countdown_max_target' = 0 is not allowed"),
    (["--task=countdown", "--countdown_max_misses=99"],
     r"'countdown_max_misses' = 99 .* in \[0, 47\]"),
    (["--task=countdown"], r"'n_train' = 20000 .* at most 16472: n_train \+ n_val \+ n_test .* "
                           r"countdown_numbers=3, countdown_max_number=12"),
    (["--task=countdown", "--n_train=100", "--countdown_max_number=1"],
     r"'n_train' = 100 .* countdown_max_number=1"),
    (["--task_steps=3", "--task_min_steps=5"], r"'task_min_steps' = 5 .* in \[0, task_steps=3\]"),
    (["--task_steps=1000"], r"config key 'task_steps' = 1000 is not allowed: must be <= 50"),
    (["--n_train=100000000"],
     r"config key 'n_train' = 100000000 is not allowed: must be at most 999000"),
    (["--task_ops=*", "--task_max_operand=1", "--task_steps=1", "--n_train=5"],
     r"'n_train' = 5 .* smaller"),
])
def test_base_data_errors_name_the_config_key(tmp_path, args, match):
    out = tmp_path / "base"
    refused_fast(lambda: tb.main([f"--out_dir={out}", *args]), match)
    assert not out.exists()


@pytest.mark.parametrize("task, key, value", [
    ("arith", "countdown_variants", 8), ("arith", "countdown_numbers", 4),
    ("arith", "countdown_max_number", 9), ("arith", "countdown_max_target", 50),
    ("arith", "countdown_max_misses", 0), ("countdown", "task_steps", 3),
    ("countdown", "task_ops", "+-*"), ("countdown", "task_noise", 0.5),
    ("countdown", "task_max_operand", 9), ("countdown", "task_min_steps", 1),
])
def test_a_knob_the_task_does_not_read_is_refused(tmp_path, task, key, value):
    out = tmp_path / "base"
    argv = [f"--out_dir={out}", f"--task={task}", "--n_train=100", f"--{key}={value}"]
    refused_fast(lambda: tb.main(argv),
                 re.escape(f"config key '{key}' = {value!r} does nothing with task='{task}' (only"))
    assert not out.exists()


def test_config_files_set_only_their_own_tasks_knobs(tmp_path):
    """The shipped base configs pass the check (as a run reads them), with sizes their tasks can
    give."""
    from data.tasks import check_base_knobs
    for name in ("tiny_base.py", "countdown_base.py"):
        cfg = configure(tb.defaults, [os.path.join(REPO, "config", name), f"--out_dir={tmp_path}"])
        check_base_knobs(cfg, tb.defaults)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """task -> a directory its prepare.py built, at a place none of them names by default."""
    root = tmp_path_factory.mktemp("made")
    src = (write_gsm8k(root / "train.jsonl", TRAIN), write_gsm8k(root / "test.jsonl", TEST))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(searched, "ROOT", str(root / "elsewhere"))
        found = searched.prepare(3, 9, 60, 2, n_train=20, n_val=3, n_test=3, num_merges=5,
                                 verbose=False)
    return {"arith": synth.prepare(**SMALL_SYNTH, root=str(root / "a")),
            "gsm8k": gsm8k.prepare(*src, n_val=5, out=str(root / "g" / "mine"), verbose=False),
            "countdown": countdown.prepare(n_train=30, n_val=5, n_test=5,
                                           out=str(root / "c" / "mine"), verbose=False),
            "searched": found}


SCRIPT = {"arith": "data/gsm_synth/prepare.py", "gsm8k": "data/gsm8k/prepare.py",
          "countdown": "data/countdown/prepare.py", "searched": "data/countdown/searched.py"}


def copy(made, which, tmp_path):
    d = str(tmp_path / os.path.basename(made[which]))
    shutil.copytree(made[which], d)
    return d


@pytest.mark.parametrize("which", list(SCRIPT))
@pytest.mark.parametrize("lost", [("test.jsonl",), ("meta.json", "val.jsonl"),
                                  ("meta.json", "train.jsonl")])
def test_a_missing_split_names_its_own_tasks_command(made, tmp_path, which, lost):
    d = copy(made, which, tmp_path)
    for name in lost:
        os.remove(os.path.join(d, name))
    split = [n for n in lost if n != "meta.json"][0].split(".")[0]
    with pytest.raises(UserError) as e:
        datadir.load_split(d, split)
    cmd = shlex.split(str(e.value).split("build the task data again with: ")[1])
    assert cmd[:2] == ["python", SCRIPT[which]], str(e.value)


@pytest.mark.parametrize("name, which", [
    ("n3-4_m50", "countdown"), ("n2-2_m9_t100_r3", "countdown"),
    ("search_n3_m9_x60_s2_t40", "searched"), ("prepared_v200", "gsm8k"), ("s2_m20_as_n0", "arith")])
def test_a_missing_directory_is_named_by_its_name(tmp_path, name, which):
    """Nothing left to read: the name (as its prepare.py spells it) says whose command builds it."""
    command = datadir.rebuild_command(str(tmp_path / "gone" / name))
    assert command.split()[:2] == ["python", SCRIPT[which]]


DAMAGED = [b"", b"\n", b"coutndown\n", b"gsm9k", b"\xff\xfe\x00garbage", b"arith countdown\n",
           b"ARITH\n"]


@pytest.mark.parametrize("marker", DAMAGED + ["a directory"])
@pytest.mark.parametrize("which", ["arith", "countdown", "gsm8k"])
def test_a_damaged_marker_is_named_and_never_taken_as_a_task(made, tmp_path, which, marker):
    d = copy(made, which, tmp_path)
    path = os.path.join(d, datadir.TASK_FILE)
    os.remove(path)
    if marker == "a directory":
        os.mkdir(path)
    else:
        open(path, "wb").write(marker)
    task = "arith" if which == "arith" else which
    # a run reading it: the marker is damaged, and the command that builds the directory again
    said = r"\.task is damaged \(.*not one of arith, gsm8k, countdown\): remove"
    with pytest.raises(UserError, match=said) as e:
        datadir.check_task_data(d, task)
    assert "different tasks" not in str(e.value) and f"python {SCRIPT[which]}" in str(e.value)
    # a prepare.py writing it: the same words, not "files this command did not write"
    before = sorted(os.listdir(d))
    with pytest.raises(UserError, match=r"\.task is damaged") as e:
        datadir.check_out(d, task)
    assert "did not write" not in str(e.value) and sorted(os.listdir(d)) == before
    assert datadir.marked_task(d) == task  # meta.json still says it; the marker is no task


def test_a_damaged_marker_refused_by_prepare_itself(tmp_path):
    d = synth.prepare(**SMALL_SYNTH, root=str(tmp_path))
    open(os.path.join(d, ".task"), "w").write("arithmetic\n")
    said = r"\.task is damaged \(it reads 'arithmetic'.*remove .* run this again"
    with pytest.raises(UserError, match=said):
        synth.prepare(**SMALL_SYNTH, root=str(tmp_path))


# --- a full disk during preparation: the path named, no temporary file left ----------------------
def _limited(limit):
    def start():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return start


@pytest.mark.parametrize("script, args, first", [
    ("data/countdown/prepare.py", ["--n_train=3000", "--n_val=5", "--n_test=5"], "train.jsonl"),
    ("data/gsm_synth/prepare.py", ["--n_train=3000", "--n_val=5", "--n_test=5", "--num_merges=5"],
     "train.jsonl"),
    ("data/countdown/prepare.py", ["--n_train=20", "--n_val=2000", "--n_test=5"], "val.jsonl"),
])
def test_a_full_disk_names_the_path_and_leaves_no_temporary_file(tmp_path, script, args, first):
    out = tmp_path / "out"
    where = [f"--out={out}"] if "countdown" in script else [f"--root={out}"]
    r = subprocess.run([sys.executable, script, *args, *where], cwd=REPO, capture_output=True,
                       text=True, preexec_fn=_limited(50_000), timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    d = str(out) if "countdown" in script else os.path.join(out, os.listdir(out)[0])
    assert r.stderr.startswith(f"error: {os.path.join(d, first)}: File too large"), r.stderr
    assert not [n for n in os.listdir(d) if n.endswith(".tmp")] and "meta.json" not in os.listdir(d)


def test_a_write_that_fails_removes_its_temporary_file(tmp_path, monkeypatch):
    """write_atomic in-process: the move of a complete temporary file fails (ENOSPC): named,
    removed."""
    real_replace = os.replace

    def to_full(src, dst):  # the temporary file is complete; the move fails as on a full disk
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", to_full)
    with pytest.raises(OSError) as e:
        write_atomic(str(tmp_path / "train.jsonl"), "x" * 100)
    monkeypatch.setattr(os, "replace", real_replace)
    assert e.value.filename == str(tmp_path / "train.jsonl") and e.value.errno == 28
    assert os.listdir(tmp_path) == []


# --- 3. a resumed run is bound to the data it started on ----------------------------------------
def test_the_fingerprint_covers_splits_and_tokenizer(made, tmp_path):
    for which in ("arith", "countdown"):
        d = copy(made, which, tmp_path)
        fp = datadir.data_fingerprint(d)
        assert fp == datadir.data_fingerprint(made[which])  # bytes, not the path
        names = ["train.jsonl", "val.jsonl", "test.jsonl"]
        names += ["tokenizer.json"] if which == "arith" else []
        for name in names:
            text = open(os.path.join(d, name)).read()
            open(os.path.join(d, name), "w").write(text + " ")
            assert datadir.data_fingerprint(d) != fp, name
            open(os.path.join(d, name), "w").write(text)
        assert datadir.bound_data(d, {"data_fingerprint": fp}) == fp
        assert datadir.bound_data(d, {}) == fp == datadir.bound_data(d, None)  # older checkpoints
        with pytest.raises(UserError, match=f"data_dir {d} is not the data this run was trained"):
            datadir.bound_data(d, {"data_fingerprint": "0" * 64})


@pytest.mark.usefixtures("chars_reward")
def test_a_resumed_run_refuses_data_built_again_from_other_files(tiny_setup, tmp_path):
    out = tmp_path / "r"
    run(tiny_setup, out, "--max_iters=1")
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    data_dir = load_checkpoint(tiny_setup)["data_dir"]
    assert ckpt["data_fingerprint"] == datadir.data_fingerprint(data_dir)
    test = os.path.join(data_dir, "test.jsonl")
    original = open(test).read()
    rows = [json.loads(line) for line in original.splitlines()]
    try:  # the same sizes, other problems: what a rebuild from other sources leaves
        other = [{**r, "question": r["question"] + " "} for r in rows]
        open(test, "w").write("".join(json.dumps(r) + "\n" for r in other))
        with pytest.raises(UserError, match="is not the data this run was trained on"):
            tg.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=2"])
        del ckpt["data_fingerprint"]  # a checkpoint written before the binding: resumed as it is
        save_checkpoint(ckpt, str(out / "ckpt.pt"))
        tg.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=2"])
    finally:
        open(test, "w").write(original)
    assert load_checkpoint(str(out / "ckpt.pt"))["iter_num"] == 2
