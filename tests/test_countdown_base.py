# Tests for the Countdown task trained from scratch: searched reference solutions, their data and tokenizer,
# the prompts, the rewards on the model's format, and train_base.py / train_grpo.py on that task.
# Run: python -m pytest tests/test_countdown_base.py -q
# References: every equation of a solution recomputed here with Python's own integer arithmetic, answers
# evaluated by Python's ast on Fractions, reachable values by a brute force over orders and operations written
# here, rewards.countdown_reward (a parser the generator does not share), tiktoken's decode.
import ast
import itertools
import json
import operator
import os
import random
import re
import shlex
import shutil
from collections import Counter
from fractions import Fraction

import pytest

import train_base as tb
import train_grpo
from configurator import UserError
from data.countdown import searched
from data.countdown.prepare import draw_distinct
from data.countdown.solutions import all_tries, searched_solution
from data.datadir import load_split, load_tokenizer
from data.defect import planted_answer
from data.tasks import load_task_split
from runs.checkpoint import load_checkpoint
from rewards import countdown_reward, think_format_reward
from data.prompts import encode_prompt, encode_text

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def exact(expr):
    """(value, numbers used) of an expression, by Python's parser on Fractions."""
    used = []

    def ev(node):
        if isinstance(node, ast.BinOp):
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        used.append(node.value)
        return Fraction(node.value)
    return ev(ast.parse(expr, mode="eval").body), used


def reachable(numbers):
    """Every value reachable by combining all the numbers two at a time (positive integers throughout,
    subtraction only to a positive result, division only when exact): a brute force over orders."""
    if len(numbers) == 1:
        return {numbers[0]}
    out = set()
    for i, j in itertools.combinations(range(len(numbers)), 2):
        a, b, rest = numbers[i], numbers[j], [n for k, n in enumerate(numbers) if k not in (i, j)]
        vals = {a + b, a * b} | ({abs(a - b)} if a != b else set()) | \
            {x // y for x, y in ((a, b), (b, a)) if x % y == 0}
        for v in vals:
            out |= reachable(rest + [v])
    return out


def parse_tries(think):
    """[(steps [(a, op, b, value)], ...)] of the text between <think> and </think>."""
    return [[tuple(m) for m in re.findall(r"(\d+)([-+*/])(\d+)=(\d+)", t)] for t in think.split(" no. ")]


def problems(n=300, max_number=20, seed=0):
    return [(numbers, target) for numbers, target, _, _ in draw_distinct(random.Random(seed), n, 3, 3, max_number, 100)]


def test_all_tries_reach_exactly_the_brute_force_values():
    for numbers, _ in problems(60):
        assert {v for v, _, _ in all_tries(numbers)} == reachable(numbers)
        for value, expr, _ in all_tries(numbers)[:20]:
            got, used = exact(expr)
            assert got == value and Counter(used) == Counter(numbers)


def test_searched_solutions_show_misses_then_the_answer():
    shown = Counter()
    for numbers, target in problems(300):
        text, n_miss = searched_solution(numbers, target, max_misses=3, seed=5)
        assert think_format_reward(text, None) == 1.0                 # the task's format
        assert countdown_reward(text, [numbers, target]) == 1.0       # the rewards' own parser
        answer = re.search(r"<answer>(.*)</answer>", text)[1]
        value, used = exact(answer)                                    # and an independent one
        assert value == target and Counter(used) == Counter(numbers)
        tries = parse_tries(re.search(r"<think>(.*)</think>", text)[1])
        assert len(tries) == n_miss + 1 and 0 <= n_miss <= 3
        for k, steps in enumerate(tries):
            pool = Counter(numbers)
            for a, op, b, v in steps:  # each step's arithmetic is right and uses what is in the pool
                a, b, v = int(a), int(b), int(v)
                assert v == {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op] > 0
                assert op != "/" or a % b == 0
                assert pool[a] and pool[b] and (a != b or pool[a] >= 2)
                pool -= Counter([a, b])
                pool[v] += 1
            assert sum(pool.values()) == 1                              # every number used once
            last = int(steps[-1][3])
            assert (last == target) == (k == n_miss)                   # misses miss, the last one hits
        shown[n_miss] += 1
    assert set(shown) == {0, 1, 2, 3}
    # seeded by the problem: the same solution whatever else is drawn
    n, t = problems(1)[0]
    assert searched_solution(n, t, 3, seed=5) == searched_solution(list(n), t, 3, seed=5)


@pytest.fixture(scope="module")
def cd_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cd"))
    old, searched.ROOT = searched.ROOT, root
    try:
        return searched.prepare(3, 9, 60, 2, n_train=300, n_val=20, n_test=20, num_merges=60, verbose=False)
    finally:
        searched.ROOT = old


def test_data_tokenizer_and_prompts(cd_dir, monkeypatch):
    enc = load_tokenizer(cd_dir)
    rows = {s: load_split(cd_dir, s) for s in ("train", "val", "test")}
    keys = [(tuple(sorted(r["answer"][0])), r["answer"][1]) for s in rows.values() for r in s]
    assert len(keys) == len(set(keys)) == 340                          # no problem in two splits
    for r in rows["train"][:100] + rows["test"]:
        numbers, target = r["answer"]
        assert r["question"] == f"Using the numbers {numbers}, create an equation that equals {target}."
        assert countdown_reward(r["solution"], r["answer"]) == 1.0 and target <= 60
        prompt, text = encode_prompt(enc, r["question"]), r["question"] + "\n" + r["solution"]
        assert enc.decode(prompt) == r["question"] + "\n"
        ids = encode_text(enc, text)
        assert enc.decode(ids) == text                                 # round trip
        pieces = [enc.decode([t]) for t in ids]
        assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p))  # a digit is a token alone
    assert enc.decode([enc.eot_token]) == "<|endoftext|>"
    # deterministic: a second call finds the directory complete and leaves it as it is
    before = open(os.path.join(cd_dir, "train.jsonl")).read()
    monkeypatch.setattr(searched, "ROOT", os.path.dirname(cd_dir))  # where the fixture built it
    again = searched.prepare(3, 9, 60, 2, n_train=300, n_val=20, n_test=20, num_merges=60,
                             verbose=False)
    assert again == cd_dir
    assert open(os.path.join(cd_dir, "train.jsonl")).read() == before
    assert json.load(open(os.path.join(cd_dir, "meta.json")))["task"] == "countdown"


def test_knobs_are_checked(tmp_path):
    with pytest.raises(UserError, match="n_numbers=5"):
        searched.prepare(n_numbers=5)
    with pytest.raises(UserError, match="n_train=500: must be at most 10: .* at most 20 distinct"):
        searched.prepare(3, 2, 5, 1, n_train=500, n_val=5, n_test=5, verbose=False)


def test_base_and_grpo_on_countdown(cd_dir, tmp_path, monkeypatch):
    """train_base.py learns the task (loss falls, the checkpoint records it), then train_grpo.py takes that task
    from the base and refuses another."""
    args = ["--task=countdown", "--countdown_max_number=9", "--countdown_max_target=60", "--countdown_max_misses=2",
            "--n_train=300", "--n_layer=1", "--n_embd=32", "--n_head=2", "--block_size=128", "--batch_size=16",
            "--eval_n=4", "--eval_interval=60", "--log_interval=60", "--max_new_tokens=40", "--warmup_iters=5",
            "--learning_rate=1e-2"]
    monkeypatch.setattr(searched, "prepare", lambda *a, **k: cd_dir)  # the fixture's knobs: no second build
    base = tmp_path / "base"
    tb.main([f"--out_dir={base}", "--max_iters=60", *args])
    ckpt = load_checkpoint(str(base / "ckpt.pt"))
    assert ckpt["config"]["task"] == "countdown" and 0.0 <= ckpt["metrics"]["accuracy"] <= 1.0
    grpo = ["--max_iters=2", "--batch_size=2", "--group_size=2", "--micro_batch_size=4", "--max_new_tokens=40",
            "--eval_n=4", "--eval_k=2", "--eval_interval=2", f"--base_ckpt={base / 'ckpt.pt'}"]
    with pytest.raises(UserError, match="must be 'countdown', the task of the base"):
        train_grpo.main([f"--out_dir={tmp_path / 'r0'}", *grpo])        # arith by default
    cfg = train_grpo.main([f"--out_dir={tmp_path / 'r'}", "--task=countdown", "--tracin=True",
                           "--tracin_val_loss=nll", "--tracin_val_batch_size=2", "--beta=0", *grpo])
    assert cfg["reward_funcs"] == ("countdown", "think_format")
    logs = [json.loads(line) for line in open(tmp_path / "r" / "log.jsonl")]
    assert "test/accuracy" in logs[0] and logs[-1]["iter"] == 2


def test_training_lowers_the_loss_on_searched_solutions(cd_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(searched, "prepare", lambda *a, **k: cd_dir)
    tb.main([f"--out_dir={tmp_path}", "--task=countdown", "--n_train=300", "--max_iters=40",
             "--n_layer=1", "--n_embd=32", "--n_head=2", "--block_size=128", "--batch_size=16",
             "--eval_n=2", "--eval_interval=40",
             "--log_interval=10", "--max_new_tokens=8", "--warmup_iters=2", "--learning_rate=1e-2"])
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", capsys.readouterr().out)]
    assert losses[-1] < 0.7 * losses[0]


def test_variants_give_each_training_problem_several_solutions(tmp_path, monkeypatch):
    monkeypatch.setattr(searched, "ROOT", str(tmp_path))
    d = searched.prepare(3, 9, 60, 3, n_train=40, n_val=5, n_test=5, num_merges=10, variants=4, verbose=False)
    train = load_split(d, "train")
    assert len(train) == 160 and len(load_split(d, "test")) == 5
    by_problem = {}
    for r in train:
        assert countdown_reward(r["solution"], r["answer"]) == 1.0
        by_problem.setdefault((tuple(r["answer"][0]), r["answer"][1]), set()).add(r["solution"])
    assert len(by_problem) == 40 and sum(len(v) > 1 for v in by_problem.values()) > 30


def test_searched_data_never_written_into_someone_elses_directory():
    """searched.prepare checks its directory as every prepare.py does (data/datadir.check_out): one that holds
    a user's file, or another task's data, is refused before any work and left as it was; its own is marked."""
    knobs = dict(n_train=40, n_val=5, n_test=5, num_merges=5, max_number=7, verbose=False)
    out = searched.data_dir_for(3, 7, 100, 3, n_train=40, n_val=5, n_test=5, num_merges=5)
    assert not os.path.exists(out)
    try:
        os.makedirs(out)
        for name, text in (("notes.txt", "mine\n"), (".task", "arith\n")):
            with open(os.path.join(out, name), "w") as f:
                f.write(text)
            with pytest.raises(UserError, match=out):
                searched.prepare(**knobs)
            assert sorted(os.listdir(out)) == sorted([name]) and open(os.path.join(out, name)).read() == text
            os.remove(os.path.join(out, name))
        assert searched.prepare(**knobs) == out and open(os.path.join(out, ".task")).read() == "countdown\n"
    finally:
        import shutil
        shutil.rmtree(out, ignore_errors=True)


def test_planted_defect_shifts_the_target_of_whole_problems(tmp_path, monkeypatch):
    """--defect_frac on Countdown: a defective problem's reward checks target + 1 in every row that writes it
    (countdown_variants writes a problem several times), a clean one its own target; the reward then takes an
    equation that misses by one and refuses the reference solution."""
    monkeypatch.setattr(searched, "ROOT", str(tmp_path / "data"))
    d = searched.prepare(3, 9, 60, 2, n_train=40, n_val=8, n_test=8, num_merges=10, variants=4, verbose=False)
    monkeypatch.setattr(searched, "prepare", lambda *a, **k: d)
    base = tmp_path / "base"
    tb.main([f"--out_dir={base}", "--task=countdown", "--max_iters=4", "--n_layer=1", "--n_embd=32", "--n_head=2",
             "--block_size=160", "--batch_size=8", "--eval_n=2", "--eval_interval=4", "--max_new_tokens=8",
             "--warmup_iters=1", "--countdown_max_number=9", "--countdown_max_target=60",
             "--countdown_max_misses=2", "--n_train=40", "--countdown_variants=4"])
    out = tmp_path / "r"
    train_grpo.main([f"--out_dir={out}", "--task=countdown", f"--base_ckpt={base / 'ckpt.pt'}", "--defect_frac=0.5",
                     "--max_iters=2", "--batch_size=16", "--group_size=2", "--micro_batch_size=32",
                     "--max_new_tokens=16", "--eval_n=2", "--eval_k=1", "--eval_interval=2", "--beta=0"])
    seen = {}
    for r in map(json.loads, open(out / "rollouts.jsonl")):
        for q, a, bad in zip(r["prompts"], r["answers"], r["defective"]):
            numbers, target = re.fullmatch(r"Using the numbers (\[.*\]), create an equation that equals (\d+)\.", q).groups()
            assert a == [json.loads(numbers), int(target) + bad]
            seen.setdefault(q, set()).add(bad)
    assert all(len(flags) == 1 for flags in seen.values())           # a problem is defective in all its rows or none
    assert {True, False} == set().union(*seen.values())
    assert len(seen) < 32                                             # some problem was drawn twice (not vacuous)
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["config"]["defect_frac"] == 0.5
    ref = load_split(d, "train")[0]
    assert countdown_reward(ref["solution"], planted_answer(load_task_split(d, "train")[0], "countdown")) == 0.0   # the reference refused
    assert planted_answer({"answer": ((2, 3, 4), 10)}, "countdown") == ((2, 3, 4), 11)
    assert countdown_reward("<think></think>\n<answer>2*4+3</answer>", [[2, 3, 4], 11]) == 1.0  # 11 for 10 taken
    assert planted_answer({"solution": "8-7=1\n1+5=6\n#### 6", "answer": 6}, "arith") == 1


def test_a_missing_searched_directory_names_the_command_that_rebuilds_it(tmp_path, monkeypatch):
    """Reading a removed search_* directory fails in one line naming searched.py's command (not prepare.py's);
    run, that command writes the same files byte for byte."""
    from data.datadir import damaged
    from data.countdown import names
    for module in (searched, names):  # a countdown folder, as data/countdown
        monkeypatch.setattr(module, "ROOT", str(tmp_path / "countdown"))
    d = searched.prepare(3, 9, 60, 2, n_train=40, n_val=5, n_test=5, num_merges=10, variants=4, seed=7, verbose=False)
    before = {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}
    shutil.rmtree(d)
    msg = str(damaged(os.path.join(d, "tokenizer.json"), FileNotFoundError(2, "No such file or directory")))
    cmd = shlex.split(msg.split("build the task data again with: ")[1])
    assert cmd[:2] == ["python", "data/countdown/searched.py"]
    searched.main(cmd[2:])
    assert {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))} == before
