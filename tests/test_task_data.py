# Tests for data/gsm8k/prepare.py (the official GSM8K files -> task data) and data/countdown/prepare.py
# (generated Countdown problems). Hermetic: a small GSM8K-format fixture written here, small Countdown
# sets, everything under pytest's temporary directories (no network, no repository data).
# Run with: python -m pytest -q tests/test_task_data.py
#
# Independent references used:
#   - GSM8K: the fixture's expected answers written by hand; the solutions scored by rewards.py's own
#     format and correctness rewards; splits compared as sets of question texts;
#   - Countdown: every <answer> expression evaluated here by walking Python's ast (BinOp and Constant
#     only, Fractions), not by the generator's own parser; determinism by a second build compared
#     byte for byte;
#   - errors: one-line UserErrors naming the file and line, or the knob.
import ast
import json
import operator
import os
import re
import subprocess
import sys
from fractions import Fraction

import pytest

import rewards
from configurator import UserError
from data.countdown import prepare as countdown
from data.gsm8k import prepare as gsm8k
from data.datadir import load_split

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLITS = ("train", "val", "test")

# ---------------------------------------------------------------------------------------------- GSM8K

# (question, official answer text, the int that answer must become); written in GSM8K's form
TRAIN = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
     "How many clips did Natalia sell altogether in April and May?",
     "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
     "in April and May.\n#### 72", 72),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
     "How much did she earn?",
     "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
     "$<<0.2*50=10>>10.\n#### 10", 10),
    ("A bakery sells 1,150 loaves on Monday and 84 more on Tuesday. How many loaves did it sell on both days?",
     "On Tuesday it sold 84 loaves, so on both days it sold 1,150 + 84 = <<1150+84=1234>>1,234 loaves.\n"
     "#### 1,234", 1234),
    ("The temperature at dawn was 5 degrees. By midnight it had dropped 8 degrees. What was the "
     "temperature at midnight?",
     "5 - 8 = <<5-8=-3>>-3 degrees.\n#### -3", -3),
    ("Tom buys 8 boxes of pencils with 9 pencils each. How many pencils does he have?",
     "He has 8*9 = <<8*9=72>>72 pencils.\n#### 72.0", 72),
    ("A pizza is cut into 8 slices. Ann eats 3 slices and Ben eats 2. How many slices are left?",
     "They eat 3+2 = <<3+2=5>>5 slices.\nSo 8-5 = <<8-5=3>>3 slices are left.\n#### 3", 3),
    ("Mark has a garden with 3 rows of 12 tulips. He picks 10 tulips. How many are left?",
     "He has 3*12 = <<3*12=36>>36 tulips.\nAfter picking, 36-10 = <<36-10=26>>26 are left.\n#### 26", 26),
    ("Julie is reading a 120-page book. Yesterday she read 12 pages and today twice as many. "
     "If she wants to read half of the remaining pages tomorrow, how many pages should she read?",
     "Today she read 12 x 2 = <<12*2=24>>24 pages.\nSo far she read 12 + 24 = <<12+24=36>>36 pages.\n"
     "There are 120 - 36 = <<120-36=84>>84 pages left.\nShe should read 84/2 = <<84/2=42>>42 pages.\n#### 42", 42),
    ("James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
     "He writes each friend 3*2 = <<3*2=6>>6 pages a week.\nSo he writes 6*2 = <<6*2=12>>12 pages every week.\n"
     "That means he writes 12*52 = <<12*52=624>>624 pages a year.\n#### 624", 624),
    ("Betty needs $100 for a wallet. She has half of it. Her parents give her $15 and her grandparents "
     "twice as much. How much more money does Betty need?",
     "She has 100 / 2 = $<<100/2=50>>50.\nHer grandparents give 15 * 2 = $<<15*2=30>>30.\n"
     "She needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.\n#### 5", 5),
    ("A school has 1,200 students. 3/4 of them ride the bus. How many students ride the bus?",
     "3/4 of 1,200 is 1200*3/4 = <<1200*3/4=900>>900 students.\n#### 900", 900),
    ("A company paid $2,500 for rent and $1,750 for power. How much did it pay in total?",
     "2500 + 1750 = <<2500+1750=4250>>4,250\n#### 4,250", 4250),
    ("Sara has 7 marbles. She gives 2 to each of her 5 friends. How many marbles does she have now?",
     "She gives away 2*5 = <<2*5=10>>10 marbles.\n7 - 10 = <<7-10=-3>>-3, so she owes 3.\n#### -3", -3),
    ("A train travels 60 miles per hour for 3 hours. How far does it go?",
     "60 * 3 = <<60*3=180>>180 miles.\n#### 180", 180),
    ("Lisa saves $5 a week for 10 weeks, then spends $12. How much does she have left?",
     "She saves 5*10 = <<5*10=50>>50 dollars.\n50-12 = <<50-12=38>>38.\n#### 38", 38),
    ("A farmer has 24 cows and sells a third of them. How many cows are left?",
     "He sells 24/3 = <<24/3=8>>8 cows.\n24-8 = <<24-8=16>>16 cows are left.\n#### 16", 16),
    ("Each box holds 6 eggs. How many boxes do 45 eggs fill, counting a partly filled box?",
     "45/6 = <<45/6=7.5>>7.5, so 8 boxes are needed.\n#### 8", 8),
    ("Three friends share 2 pizzas equally. How many pizzas does each friend get?",
     "2/3 of a pizza each... as a decimal 2/3 = <<2/3=0.67>>0.67.\n#### 0.67", None),  # not whole: skipped
    ("A shop sells pens at $3 each. How much do 15 pens cost?",
     "15*3 = <<15*3=45>>45 dollars.\n#### 45", 45),
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
     "How many clips did Natalia sell altogether in April and May?",
     "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
     "in April and May.\n#### 72", 72),  # an exact duplicate of the first: kept once
    ("A library has 350 books and buys 125 more. How many books does it have?",
     "350 + 125 = <<350+125=475>>475 books.\n#### 475", 475),
    ("Kim runs 4 km a day for a week. How far does she run?",
     "4 * 7 = <<4*7=28>>28 km.\n#### 28", 28),
    ("A bus has 40 seats. 27 are taken. How many are free?",
     "40-27 = <<40-27=13>>13 seats.\n#### 13", 13),
    ("A rope 90 cm long is cut into 6 equal pieces. How long is each piece?",
     "90/6 = <<90/6=15>>15 cm.\n#### 15", 15),
]
TEST = [
    ("A shop sells pens at $3 each. How much do 15 pens cost?",
     "15*3 = <<15*3=45>>45 dollars.\n#### 45", 45),  # also in train: dropped from test
    ("Ravi has 14 stamps and buys 3 sheets of 10 stamps. How many stamps does he have?",
     "3*10 = <<3*10=30>>30 new stamps.\n14+30 = <<14+30=44>>44 stamps.\n#### 44", 44),
    ("A car uses 8 liters of fuel per 100 km. How much fuel does it use for 350 km?",
     "350/100 = <<350/100=3.5>>3.5 hundreds of km.\n3.5*8 = <<3.5*8=28>>28 liters.\n#### 28", 28),
    ("A hall has 1,024 chairs in 32 equal rows. How many chairs are in each row?",
     "1,024/32 = <<1024/32=32>>32 chairs.\n#### 32", 32),
    ("Omar had $20 and spent $26 on credit. What is his balance?",
     "20-26 = <<20-26=-6>>-6 dollars.\n#### -6", -6),
    ("Ravi has 14 stamps and buys 3 sheets of 10 stamps. How many stamps does he have?",
     "3*10 = <<3*10=30>>30 new stamps.\n14+30 = <<14+30=44>>44 stamps.\n#### 44", 44),  # duplicate in test
    ("Five pencils cost $2.50. How much do 10 cost?",
     "10/5 = <<10/5=2>>2, 2*2.50 = <<2*2.5=5>>5.00 dollars.\n#### 5.00", 5),
]
N_VAL = 5


def write_gsm8k(path, rows):
    with open(path, "w") as f:
        f.write("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a, _ in rows))
    return str(path)


@pytest.fixture
def sources(tmp_path):
    return write_gsm8k(tmp_path / "train.jsonl", TRAIN), write_gsm8k(tmp_path / "test.jsonl", TEST)


@pytest.fixture
def gsm8k_dir(sources, tmp_path):
    return gsm8k.prepare(*sources, n_val=N_VAL, out=str(tmp_path / "prepared"), verbose=False)


def expected_answers(rows):
    return {" ".join(q.split()): a for q, _, a in rows}


def plain(question):
    """The problem text of a prepared question (without the instruction)."""
    assert question.endswith("\n" + gsm8k.INSTRUCTION)
    return " ".join(question[:-len(gsm8k.INSTRUCTION) - 1].split())


def test_gsm8k_splits_are_disjoint_and_val_comes_from_train(gsm8k_dir):
    splits = {s: load_split(gsm8k_dir, s) for s in SPLITS}
    qs = {s: [plain(r["question"]) for r in rows] for s, rows in splits.items()}
    for s in SPLITS:
        assert len(set(qs[s])) == len(qs[s]), f"a question repeated in {s}"
    assert not set(qs["train"]) & set(qs["val"]) and not set(qs["train"]) & set(qs["test"])
    assert not set(qs["val"]) & set(qs["test"])
    train_file, test_file = expected_answers(TRAIN), expected_answers(TEST)
    whole = {q for q, a in train_file.items() if a is not None}
    assert set(qs["train"]) | set(qs["val"]) == whole  # every whole-answer train problem, once
    assert set(qs["test"]) == set(test_file) - set(train_file)
    assert {s: len(v) for s, v in splits.items()} == {"train": len(whole) - N_VAL, "val": N_VAL, "test": 5}
    with open(os.path.join(gsm8k_dir, "meta.json")) as f:
        meta = json.load(f)
    assert meta["task"] == "gsm8k" and meta["sizes"] == {s: len(v) for s, v in splits.items()}
    assert meta["dropped"] == {"train_duplicates": 1, "test_duplicates_or_in_train": 2,
                               "train_not_whole": 1, "test_not_whole": 0}


def test_gsm8k_rows_answers_and_solutions(gsm8k_dir):
    expected = {**expected_answers(TEST), **expected_answers(TRAIN)}
    rows = [r for s in SPLITS for r in load_split(gsm8k_dir, s)]
    for r in rows:
        assert sorted(r) == ["answer", "question", "solution"]
        assert type(r["answer"]) is int and r["answer"] == expected[plain(r["question"])]
        assert "<<" not in r["solution"] and ">>" not in r["solution"]
        assert r["solution"].split("\n")[-1] == f"#### {r['answer']}"
        assert r["solution"].count("####") == 1
        # the reference completion scores full marks with the project's own rewards
        assert rewards.format_reward(r["solution"], r["answer"]) == 1.0
        assert rewards.correctness_reward(r["solution"], r["answer"]) == 1.0
    by_q = {plain(r["question"]): r for r in rows}
    first = by_q[" ".join(TRAIN[0][0].split())]
    assert first["solution"] == ("Natalia sold 48/2 = 24 clips in May.\n"
                                 "Natalia sold 48+24 = 72 clips altogether in April and May.\n#### 72")
    assert {a for a in (r["answer"] for r in rows)} >= {1234, -3, 72, 4250, -6, 5}


def test_gsm8k_is_deterministic_and_seeded(sources, gsm8k_dir, tmp_path):
    again = gsm8k.prepare(*sources, n_val=N_VAL, out=str(tmp_path / "again"), verbose=False)
    for name in SPLITS:
        with open(os.path.join(gsm8k_dir, f"{name}.jsonl"), "rb") as a, \
                open(os.path.join(again, f"{name}.jsonl"), "rb") as b:
            assert a.read() == b.read(), name
    other = gsm8k.prepare(*sources, n_val=N_VAL, seed=7, out=str(tmp_path / "seed7"), verbose=False)
    assert load_split(other, "val") != load_split(gsm8k_dir, "val")
    assert load_split(other, "test") == load_split(gsm8k_dir, "test")


def snapshot(d):
    return {n: (os.stat(os.path.join(d, n)).st_mtime_ns, open(os.path.join(d, n), "rb").read())
            for n in sorted(os.listdir(d))}


def test_gsm8k_again_returns_the_dir_untouched_and_rebuilds_a_damaged_one(sources, gsm8k_dir, capsys):
    before = snapshot(gsm8k_dir)
    assert gsm8k.prepare(*sources, n_val=N_VAL, out=gsm8k_dir, verbose=False) == gsm8k_dir
    assert snapshot(gsm8k_dir) == before
    os.remove(os.path.join(gsm8k_dir, "val.jsonl"))
    assert gsm8k.prepare(*sources, n_val=N_VAL, out=gsm8k_dir, verbose=False) == gsm8k_dir
    assert "building it again" in capsys.readouterr().out
    assert {n: b for n, (_, b) in snapshot(gsm8k_dir).items()} == {n: b for n, (_, b) in before.items()}
    # a changed source file makes the directory stale
    write_gsm8k(sources[1], TEST[1:3])
    gsm8k.prepare(*sources, n_val=N_VAL, out=gsm8k_dir, verbose=False)
    assert len(load_split(gsm8k_dir, "test")) == 2


def test_gsm8k_default_dir_depends_on_the_knobs():
    assert gsm8k.data_dir_for() == os.path.join(REPO, "data", "gsm8k", "prepared")
    assert gsm8k.data_dir_for(n_val=200, seed=1) != gsm8k.data_dir_for()


BAD_LINES = {  # name: (file text, the line the error must name, a phrase of the error)
    "non-JSON line 3": (lambda good: good[:2] + ["this is not json"] + good[3:], 3, "not a line of JSON"),
    "no answer field": (lambda good: good[:1] + [json.dumps({"question": "Q?"})] + good[2:], 2, "'answer'"),
    "not an object": (lambda good: good[:1] + ["[1, 2]"] + good[2:], 2, "'question'"),
    "no ####": (lambda good: good[:3] + [json.dumps({"question": "Q?", "answer": "It is 4."})] + good[4:], 4,
                "'#### N'"),
    "#### without a number": (lambda good: good[:4] + [json.dumps({"question": "Q?", "answer": "x\n#### four"})],
                              5, "'#### N'"),
    "truncated last line": (lambda good: good[:-1] + [good[-1][:40]], len(TRAIN), "not a line of JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_gsm8k_bad_line_is_one_line_error_naming_file_and_line(sources, tmp_path, case):
    make, line, said = BAD_LINES[case]
    with open(sources[0]) as f:
        good = f.read().splitlines()
    with open(sources[0], "w") as f:
        f.write("\n".join(make(good)))  # no final newline: as a download cut short
    with pytest.raises(UserError) as e:
        gsm8k.prepare(*sources, n_val=N_VAL, out=str(tmp_path / "out"), verbose=False)
    msg = str(e.value)
    assert "\n" not in msg and f"{sources[0]}, line {line}:" in msg and said in msg, msg
    assert "wget https://raw.githubusercontent.com/openai/grade-school-math/" in msg
    assert not os.path.exists(tmp_path / "out" / "meta.json")


def test_gsm8k_missing_or_empty_file_is_one_line_error(sources, tmp_path):
    for train, test, named in ((str(tmp_path / "nope.jsonl"), sources[1], "nope.jsonl"),
                               (sources[0], write_gsm8k(tmp_path / "empty.jsonl", []), "empty.jsonl")):
        with pytest.raises(UserError) as e:
            gsm8k.prepare(train, test, n_val=N_VAL, out=str(tmp_path / "out"), verbose=False)
        msg = str(e.value)
        assert "\n" not in msg and named in msg and "wget" in msg, msg
        role = "train" if "nope" in named else "test"
        assert f"/data/{role}.jsonl -O {tmp_path / named}`" in msg  # the URL of that file, saved under its name


def test_gsm8k_bad_knobs(sources, tmp_path):
    with pytest.raises(UserError, match=r"n_val=0"):
        gsm8k.prepare(*sources, n_val=0, out=str(tmp_path / "a"), verbose=False)
    with pytest.raises(UserError, match=r"n_val=22: must be below the 22 distinct problems"):
        gsm8k.prepare(*sources, n_val=22, out=str(tmp_path / "b"), verbose=False)
    with pytest.raises(UserError, match=r"also in"):
        gsm8k.prepare(sources[0], sources[0], n_val=N_VAL, out=str(tmp_path / "c"), verbose=False)


def test_gsm8k_cli(sources, tmp_path):
    script = os.path.join(REPO, "data", "gsm8k", "prepare.py")
    out = str(tmp_path / "cli")
    r = subprocess.run([sys.executable, script, f"--train_file={sources[0]}", f"--test_file={sources[1]}",
                        f"--n_val={N_VAL}", f"--out={out}"], capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == out
    assert "skipped 1 problem(s)" in r.stdout  # the 0.67 answer, said once
    r = subprocess.run([sys.executable, script, f"--train_file={tmp_path / 'missing.jsonl'}", f"--out={out}2"],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "missing.jsonl" in r.stderr


# ------------------------------------------------------------------------------------------ Countdown

KNOBS = dict(n_train=300, n_val=30, n_test=30, min_numbers=3, max_numbers=4, max_number=40, seed=3, verbose=False)
ANSWER = re.compile(r"<think>[^<]+</think>\n<answer>([^<]+)</answer>")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def ast_eval(expr):
    """(value, numbers used) of an arithmetic expression, by Python's own parser: BinOp over int Constants only."""
    used = []

    def walk(node):
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        assert isinstance(node, ast.Constant) and type(node.value) is int, ast.dump(node)
        used.append(node.value)
        return Fraction(node.value)
    return walk(ast.parse(expr, mode="eval").body), used


@pytest.fixture(scope="module")
def countdown_dirs(tmp_path_factory):
    return tuple(countdown.prepare(**KNOBS, out=str(tmp_path_factory.mktemp(name) / "cd")) for name in "ab")


def test_countdown_is_byte_identical_across_builds(countdown_dirs):
    a, b = countdown_dirs
    assert sorted(os.listdir(a)) == sorted(os.listdir(b)) == [".task", "meta.json", "test.jsonl", "train.jsonl", "val.jsonl"]
    for name in os.listdir(a):
        with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
            assert fa.read() == fb.read(), name


def test_countdown_sizes_and_disjoint_splits(countdown_dirs):
    d = countdown_dirs[0]
    splits = {s: load_split(d, s) for s in SPLITS}
    assert {s: len(v) for s, v in splits.items()} == {"train": 300, "val": 30, "test": 30}
    keys = {s: [(tuple(sorted(r["answer"][0])), r["answer"][1]) for r in rows] for s, rows in splits.items()}
    every = [k for s in SPLITS for k in keys[s]]
    assert len(set(every)) == len(every)  # no problem twice, inside a split or across two
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    assert meta["task"] == "countdown" and meta["sizes"] == {"train": 300, "val": 30, "test": 30}


def test_countdown_every_solution_makes_the_target_from_all_numbers(countdown_dirs):
    counts = set()
    for split in SPLITS:
        for r in load_split(countdown_dirs[0], split):
            numbers, target = r["answer"]
            assert KNOBS["min_numbers"] <= len(numbers) <= KNOBS["max_numbers"]
            assert all(type(n) is int and 1 <= n <= KNOBS["max_number"] for n in numbers)
            assert type(target) is int and 1 <= target <= 999
            assert r["question"] == countdown.TEMPLATE.format(numbers=numbers, target=target)
            assert f"Using the numbers {numbers}, create an equation that equals {target}." in r["question"]
            m = ANSWER.fullmatch(r["solution"])
            assert m, r["solution"]
            value, used = ast_eval(m[1])
            assert value == target and sorted(used) == sorted(numbers), r
            counts.add(len(numbers))
    assert counts == {3, 4}


def test_countdown_again_returns_the_dir_untouched_and_rebuilds_a_damaged_one(countdown_dirs, tmp_path, capsys):
    d = countdown.prepare(**KNOBS, out=str(tmp_path / "cd"))
    before = snapshot(d)
    assert countdown.prepare(**KNOBS, out=d) == d and snapshot(d) == before
    with open(os.path.join(d, "train.jsonl"), "w") as f:
        f.write('{"question": "half a file"')
    assert countdown.prepare(**KNOBS, out=d) == d
    assert "building it again" in capsys.readouterr().out
    assert {n: b for n, (_, b) in snapshot(d).items()} == {n: b for n, (_, b) in before.items()}


def test_countdown_dir_names_follow_the_knobs():
    assert countdown.data_dir_for() == os.path.join(REPO, "data", "countdown", "n3-4_m99")
    assert os.path.basename(countdown.data_dir_for(n_train=100, seed=2, max_number=50)) == "n3-4_m50_t100_r2"


def test_countdown_generator_checks_itself():
    assert countdown.evaluate("(98 - 73) * 9 / (4 - 1)") == (Fraction(75), [98, 73, 9, 4, 1])
    with pytest.raises(AssertionError):
        countdown.row([3, 4, 5], 35, "3 * 4 + 5", ["3 * 4 = 12", "12 + 5 = 17"])  # a wrong reference


@pytest.mark.parametrize("bad, named", [
    (dict(min_numbers=1), "min_numbers=1"), (dict(max_numbers=2), "max_numbers=2"),
    (dict(max_numbers=7), "max_numbers=7"), (dict(n_train=0), "n_train=0"), (dict(n_val=0), "n_val=0"),
    (dict(n_test=-1), "n_test=-1"), (dict(max_number=0), "max_number=0"), (dict(max_number=1000), "max_number=1000"),
    (dict(min_numbers=2, max_numbers=2, max_number=1, n_train=5000), "n_train=5000"),  # over the bound
    # 7 problems exist with two numbers of 1 or 2 (1+1, 1*1, 1+2, 2-1, 2*1, 2+2, 2/2): 8 asked for
    (dict(min_numbers=2, max_numbers=2, max_number=2, n_train=6, n_val=1, n_test=1), "found only 7"),
])
def test_countdown_bad_knobs(tmp_path, bad, named):
    with pytest.raises(UserError) as e:
        countdown.prepare(**{**KNOBS, **bad}, out=str(tmp_path / "x"))
    assert named in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "x" / "meta.json")


def test_countdown_cli(tmp_path):
    script = os.path.join(REPO, "data", "countdown", "prepare.py")
    out = str(tmp_path / "cli")
    r = subprocess.run([sys.executable, script, "--n_train=50", "--n_val=5", "--n_test=5", f"--out={out}"],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == out and len(load_split(out, "test")) == 5
    r = subprocess.run([sys.executable, script, "--min_numbers=1", f"--out={out}2"],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip() == "error: bad task knob min_numbers=1: must be >= 2 (one number " \
                                                     "is no puzzle)"
