# Tests for data/gsm_synth/prepare.py (synthetic problems, splits, offline BPE tokenizer).
# Hermetic: small data sets built into pytest temporary directories (no network, no repo files).
# Run with: python -m pytest tests/test_prepare.py -q
#
# Independent references used:
#   - determinism: a second build into another root, compared byte for byte;
#   - arithmetic: every `a op b = c` line re-evaluated here with Python's operators, the chain of
#     results followed from the question's starting number to the `#### <answer>` line;
#   - splits: set intersection of the questions;
#   - tokenizer: single-token round trips and a scan of every token's bytes in the vocabulary;
#   - noise: the clean build with the same knobs, each noisy solution re-derived by hand;
#   - errors: one-line UserErrors naming the knob or the file; a damaged data directory is compared,
#     after prepare() rebuilt it, byte for byte with an untouched build.
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import data.gsm_synth.prepare as prep
from configurator import UserError, cli_main
from data.datadir import load_split, load_tokenizer, rebuild_command
from data.gsm_synth.prepare import prepare
from data.tokenizer import build_encoding

EOT = "<|endoftext|>"
KNOBS = dict(steps=2, max_operand=20, ops="+-*/", n_train=300, n_val=20, n_test=20, num_merges=40,
             verbose=False)
LINE = re.compile(r"^(\d+)([-+*/])(\d+)=(\d+)$")


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    a = prepare(**KNOBS, root=str(tmp_path_factory.mktemp("a")))
    b = prepare(**KNOBS, root=str(tmp_path_factory.mktemp("b")))
    return a, b


@pytest.fixture(scope="module")
def enc(data_dirs):
    return load_tokenizer(data_dirs[0])


def test_prepare_is_byte_identical_across_runs(data_dirs):
    a, b = data_dirs
    assert a != b
    files = sorted(os.listdir(a))
    assert files == sorted(os.listdir(b))
    assert {"train.jsonl", "val.jsonl", "test.jsonl", "tokenizer.json", "meta.json"} <= set(files)
    for name in files:
        with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
            assert fa.read() == fb.read(), name


def test_prepare_again_returns_existing_dir_unchanged(data_dirs):
    a = data_dirs[0]
    before = {n: os.path.getmtime(os.path.join(a, n)) for n in os.listdir(a)}
    root = os.path.dirname(a)
    assert prepare(**KNOBS, root=root) == a
    assert {n: os.path.getmtime(os.path.join(a, n)) for n in os.listdir(a)} == before


def test_split_sizes_and_no_shared_question(data_dirs):
    d = data_dirs[0]
    splits = {s: load_split(d, s) for s in ("train", "val", "test")}
    assert {s: len(v) for s, v in splits.items()} == {"train": 300, "val": 20, "test": 20}
    qs = {s: [e["question"] for e in v] for s, v in splits.items()}
    for s in qs:
        assert len(set(qs[s])) == len(qs[s]), f"duplicate question inside {s}"
    assert not set(qs["train"]) & set(qs["val"])
    assert not set(qs["train"]) & set(qs["test"])
    assert not set(qs["val"]) & set(qs["test"])
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    assert meta["sizes"] == {"train": 300, "val": 20, "test": 20}


def operations(question):
    """How many operations a generated question asks for: its sentences minus the first and the last."""
    return len(re.findall(r"[.?](?: |$)", question)) - 2


def check_arithmetic(example, steps):
    """Every line `a op b = c` is right, lines chain, and the last line is `#### <answer>`."""
    lines = example["solution"].split("\n")
    assert len(lines) == steps + 1
    assert lines[-1] == f"#### {example['answer']}"
    cur = int(re.match(r"^\S+ has (\d+) ", example["question"]).group(1))
    for line in lines[:-1]:
        m = LINE.match(line)
        assert m, line
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        assert a == cur, (line, cur)
        if op == "/":
            assert b != 0 and a % b == 0, line              # divisions are exact
        assert eval(f"{a}{op}{b}") == c, line
        cur = c
    assert cur == example["answer"]
    assert isinstance(example["answer"], int) and example["answer"] >= 0


def test_solutions_are_correct_gsm8k_form(data_dirs):
    ops_seen = set()
    for split in ("train", "val", "test"):
        for e in load_split(data_dirs[0], split):
            check_arithmetic(e, KNOBS["steps"])
            ops_seen |= set(re.findall(r"\d([-+*/])\d", e["solution"]))
    assert ops_seen == set("+-*/")


def test_every_digit_is_one_token(enc):
    for d in "0123456789":
        toks = enc.encode(d)
        assert len(toks) == 1 and enc.decode(toks) == d
    number = "98765432101234567890"
    toks = enc.encode(number)
    assert [enc.decode([t]) for t in toks] == list(number)
    # in context too: digits never merge with neighbours
    for text in ("12+5=17\n#### 17", "Mia has 120 apples.", " 42"):
        pieces = [enc.decode_single_token_bytes(t) for t in enc.encode(text)]
        assert all(len(p) == 1 for p in pieces if any(ch in b"0123456789" for ch in p)), pieces
    # no token of the vocabulary holds two digits (or a digit glued to anything)
    for t in range(enc.n_vocab):
        if t == enc.eot_token:
            continue
        b = enc.decode_single_token_bytes(t)
        n_digits = sum(ch in b"0123456789" for ch in b)
        assert n_digits <= 1 and (n_digits == 0 or len(b) == 1), (t, b)


def test_split_pattern_isolates_digits_even_with_digit_merges():
    # A small data set may simply never learn a digit merge; force some into the vocabulary and
    # check that the pre-tokenizer still never lets them apply.
    enc = build_encoding([b"12", b"00", b" 1", b"=1", b"he"])
    for text in ("12", "100", "x 12=12", "#### 1200"):
        pieces = [enc.decode_single_token_bytes(t) for t in enc.encode(text)]
        assert b"".join(pieces) == text.encode()
        assert all(len(p) == 1 for p in pieces if any(ch in b"0123456789" for ch in p)), pieces
    assert enc.encode("he") == [256 + 4]                       # the non-digit merge does apply


def test_bpe_learned_merges_and_round_trips(data_dirs, enc):
    assert enc.n_vocab == 256 + KNOBS["num_merges"] + 1        # bytes + merges + <|endoftext|>
    for e in load_split(data_dirs[0], "val"):
        text = e["question"] + "\n" + e["solution"]
        assert enc.decode(enc.encode(text)) == text
    q = load_split(data_dirs[0], "train")[0]["question"]
    assert len(enc.encode(q)) < len(q.encode())               # the merges compress real text


def test_eot_special_token(data_dirs, enc):
    assert enc.encode(EOT, allowed_special={EOT}) == [enc.eot_token]
    assert enc.encode(EOT, allowed_special="all") == [enc.eot_token]
    assert enc.decode([enc.eot_token]) == EOT
    assert enc.eot_token == enc.n_vocab - 1
    with open(os.path.join(data_dirs[0], "meta.json")) as f:
        meta = json.load(f)
    assert meta["eot_token"] == enc.eot_token and meta["vocab_size"] == enc.n_vocab
    with pytest.raises(ValueError):                       # plain text cannot smuggle the special token in
        enc.encode("question " + EOT)


def test_load_from_a_missing_dir_names_the_file_and_the_command(tmp_path):
    d = str(tmp_path / "s2_m10_as_n55")  # no meta.json to read: the knobs come from the directory's name
    for load in (lambda: load_tokenizer(d), lambda: load_split(d, "train")):
        with pytest.raises(UserError) as e:
            load()
        msg = str(e.value)
        assert "\n" not in msg and "No such file" in msg
        assert os.path.join(d, "tokenizer.json") in msg or os.path.join(d, "train.jsonl") in msg
        assert f"python data/gsm_synth/prepare.py --steps=2 --max_operand=10 --ops=+- --noise=0.55 " \
               f"--root={tmp_path}" in msg


def copy_of(data_dir, tmp_path):
    """A copy of a built data directory under a fresh root; returns (root, copied dir)."""
    root = tmp_path / "root"
    shutil.copytree(data_dir, root / os.path.basename(data_dir))
    return str(root), str(root / os.path.basename(data_dir))


def same_files(a, b):
    return sorted(os.listdir(a)) == sorted(os.listdir(b)) and all(
        open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read() for n in os.listdir(a))


def damage(d, name, change):
    """Replace the text of d/name by change(text); change=None removes the file."""
    path = os.path.join(d, name)
    with open(path) as f:
        text = f.read()
    os.remove(path)
    if change is not None:
        with open(path, "w") as f:
            f.write(change(text))


def drop_last_merge(text):  # still valid JSON, but one token less than meta.json's vocab_size
    tok = json.loads(text)
    return json.dumps({**tok, "merges": tok["merges"][:-1]})


@pytest.mark.parametrize("name, change", [
    ("tokenizer.json", lambda text: text[:len(text) // 2]),
    ("tokenizer.json", lambda text: "[]"),
    ("train.jsonl", lambda text: text[:len(text) // 2]),             # cut in the middle of a line
    ("test.jsonl", lambda text: text.replace('"answer"', '"answr"', 1)),
])
def test_load_of_a_damaged_file_names_it_and_the_command_rebuilds_it(data_dirs, tmp_path, name, change):
    root, d = copy_of(data_dirs[0], tmp_path)
    damage(d, name, change)
    with pytest.raises(UserError) as e:
        load_tokenizer(d) if name == "tokenizer.json" else load_split(d, name.split(".")[0])
    msg = str(e.value)
    assert msg.startswith(f"{os.path.join(d, name)}: ") and "\n" not in msg
    if name.endswith(".jsonl"):
        assert re.search(r"line \d+ is not a problem", msg)
    cmd = shlex.split(msg.split("build the task data again with: ")[1])
    assert cmd[:2] == ["python", "data/gsm_synth/prepare.py"]
    assert {"--n_train=300", "--n_val=20", "--n_test=20", "--ops=+-*/", "--num_merges=40", f"--root={root}"} \
        <= set(cmd)
    cli_main(prep.main, cmd[2:])  # the command it names builds the directory again
    assert same_files(d, data_dirs[1])


@pytest.mark.parametrize("name, change, said", [
    ("val.jsonl", None, "val.jsonl: No such file"),
    ("train.jsonl", lambda text: text + "{}\n", "train.jsonl: line 301 is not a problem"),
    ("test.jsonl", lambda text: "", "test.jsonl: it holds no problem"),
    ("val.jsonl", lambda text: text + text.splitlines(True)[0], "val.jsonl has 21 problems, meta.json says 20"),
    ("meta.json", lambda text: "{", "meta.json: not valid JSON"),
    ("tokenizer.json", lambda text: text[:-1], "tokenizer.json: not valid JSON"),
    ("tokenizer.json", drop_last_merge, "tokenizer.json has 296 tokens, meta.json says 297"),
])
def test_prepare_rebuilds_a_damaged_dir(data_dirs, tmp_path, capsys, name, change, said):
    root, d = copy_of(data_dirs[0], tmp_path)
    damage(d, name, change)
    assert prepare(**KNOBS, root=root) == d
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"warning: {d} is damaged (") and said in out[0], out
    assert same_files(d, data_dirs[1])


def test_interrupted_rebuild_is_rebuilt_next_time(data_dirs, tmp_path, monkeypatch):
    root, d = copy_of(data_dirs[0], tmp_path)
    damage(d, "val.jsonl", lambda text: "")
    with monkeypatch.context() as m:
        m.setattr(prep, "train_bpe", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))  # Ctrl-C mid-build
        with pytest.raises(KeyboardInterrupt):
            prepare(**KNOBS, root=root)
    # nothing was written before the build was complete: the directory is as it was, still damaged
    assert os.path.exists(os.path.join(d, "meta.json")) and open(os.path.join(d, "val.jsonl")).read() == ""
    assert prepare(**KNOBS, root=root) == d
    assert same_files(d, data_dirs[1])


@pytest.mark.parametrize("bad, said", [
    (dict(steps=0), "steps=0: must be >= 1"), (dict(max_operand=0), "max_operand=0: must be >= 1"),
    (dict(ops=""), "ops='': must be a non-empty subset of '+-*/'"), (dict(ops="+x"), "ops='+x'"),
    (dict(ops="%"), "ops='%'"), (dict(noise=-0.1), "noise=-0.1: must be between 0 and 1"),
    (dict(noise=1.5), "noise=1.5: must be between 0 and 1"),
    (dict(noise=0.5, steps=1), "noise=0.5: must be 0 with steps=1"),
    (dict(n_train=0), "n_train=0: must be >= 1"), (dict(n_val=0), "n_val=0"), (dict(n_test=-1), "n_test=-1"),
])
def test_bad_knobs_raise_user_error(tmp_path, bad, said):
    with pytest.raises(UserError, match=re.escape(f"bad task knob {said}")):
        prepare(**{**KNOBS, **bad}, root=str(tmp_path))
    assert os.listdir(tmp_path) == []                     # nothing written


def test_too_few_distinct_problems_raises(tmp_path):
    # steps=1, max_operand=1, ops="*": 12 names x 12 items x 2 factors = 288 distinct questions
    with pytest.raises(UserError, match="distinct"):
        prepare(steps=1, max_operand=1, ops="*", n_train=300, n_val=1, n_test=1, verbose=False,
                root=str(tmp_path))
    assert not any(os.path.exists(os.path.join(r, "meta.json")) for r, _, _ in os.walk(tmp_path))


@pytest.mark.parametrize("args, said", [
    (["--steps=abc"], "error: config key 'steps' expects int, got 'abc'"),
    (["--unknown=1"], "error: unknown config key 'unknown'"),
    (["--ops=x"], "error: bad task knob ops='x'"),
])
def test_cli_errors_are_one_line(tmp_path, args, said):
    script = os.path.abspath(prep.__file__)
    r = subprocess.run([sys.executable, script, *args, f"--root={tmp_path}"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith(said) and r.stderr.count("\n") == 1, r.stderr
    assert os.listdir(tmp_path) == []


def test_cli_builds_the_same_dir(data_dirs, tmp_path, capsys):
    args = ["--steps=2", "--max_operand=20", "--ops=+-*/", "--n_train=300", "--n_val=20", "--n_test=20",
            "--num_merges=40", f"--root={tmp_path}"]
    cli_main(prep.main, args)
    d = capsys.readouterr().out.strip().splitlines()[-1]
    assert d == str(tmp_path / os.path.basename(data_dirs[0]))
    assert same_files(d, data_dirs[1])


def test_noise_truncates_some_training_solutions_only(data_dirs, tmp_path):
    clean_dir = data_dirs[0]
    noisy_dir = prepare(**{**KNOBS, "noise": 0.5}, root=str(tmp_path))
    assert noisy_dir != clean_dir
    for split in ("val", "test"):                           # evaluation data stays clean
        assert load_split(noisy_dir, split) == load_split(clean_dir, split)
    n_noisy = 0
    for clean, noisy in zip(load_split(clean_dir, "train"), load_split(noisy_dir, "train"), strict=True):
        assert noisy["question"] == clean["question"] and noisy["answer"] == clean["answer"]
        if noisy["solution"] != clean["solution"]:
            n_noisy += 1
            eqs = clean["solution"].split("\n")[:-1]        # stop one step early, report that result
            assert noisy["solution"] == "\n".join(eqs[:-1] + ["#### " + eqs[-2].split("=")[1]])
    assert 0.3 * 300 < n_noisy < 0.7 * 300


def test_min_steps_mixes_lengths_and_keeps_the_default_directory(tmp_path):
    """min_steps=1, steps=3: every split holds correct problems of 1, 2 and 3 operations, each count
    about a third; noise stops only problems of >= 2 operations early; min_steps == steps is the
    default data, in the default directory."""
    root = str(tmp_path)
    knobs = dict(steps=3, max_operand=20, ops="+-", n_train=600, n_val=60, n_test=60, num_merges=20, verbose=False)
    d = prepare(**knobs, min_steps=1, root=root)
    assert os.path.basename(d).endswith("_l1")
    clean = {s: load_split(d, s) for s in ("train", "val", "test")}
    for split, rows in clean.items():
        counts = {n: 0 for n in (1, 2, 3)}
        for e in rows:
            n = operations(e["question"])
            check_arithmetic(e, n)
            counts[n] += 1
        assert min(counts.values()) >= len(rows) / 6, (split, counts)  # uniform: a third each
    noisy = load_split(prepare(**knobs, min_steps=1, noise=0.5, root=root), "train")
    early = [c for c, n in zip(clean["train"], noisy) if c["solution"] != n["solution"]]
    assert early and all(c["solution"].count("\n") >= 2 for c in early)
    assert all(prep.stop_early(c["solution"]) == n["solution"]
               for c, n in zip(clean["train"], noisy) if c["solution"] != n["solution"])
    plain = prepare(**knobs, root=root)
    assert prepare(**knobs, min_steps=3, root=root) == plain and "_l" not in os.path.basename(plain)
    with pytest.raises(UserError, match=r"min_steps=4: must be in \[0, steps=3\]"):
        prepare(**knobs, min_steps=4, root=root)
    assert "--min_steps=1" in rebuild_command(d)


# A small training split learns fewer merges than asked (130 of 150 here): the rebuild command must ask
# for the same number as the build did, or it builds another directory (..._b130) and repairs nothing.
FEW = dict(steps=1, max_operand=5, ops="+", n_train=300, n_val=20, n_test=20, verbose=False)
REPO = prep.REPO  # the repository root: the printed commands run from there


def cut_a_line(text):
    return text[:len(text) // 2]


@pytest.mark.parametrize("num_merges", [150, 300])
@pytest.mark.parametrize("name, change", [
    ("tokenizer.json", None), ("tokenizer.json", cut_a_line), ("val.jsonl", None),
    ("test.jsonl", lambda text: "garbled\n" + text), ("train.jsonl", cut_a_line)])
def test_the_printed_rebuild_command_repairs_that_directory(tmp_path, num_merges, name, change):
    """Damage a directory; the error's command, run as printed (from the repository root), rebuilds that
    same directory byte for byte."""
    clean = prepare(**FEW, num_merges=num_merges, root=str(tmp_path / "clean"))
    assert json.load(open(os.path.join(clean, "meta.json")))["vocab_size"] - 257 < 150 <= num_merges
    root, d = copy_of(clean, tmp_path)
    damage(d, name, change)
    with pytest.raises(UserError) as e:
        load_tokenizer(d) if name == "tokenizer.json" else load_split(d, name.split(".")[0])
    cmd = shlex.split(str(e.value).split("build the task data again with: ")[1])
    assert cmd[:2] == ["python", "data/gsm_synth/prepare.py"] and f"--root={root}" in cmd
    assert (f"--num_merges={num_merges}" in cmd) == (num_merges != 150)  # the number asked, never the learned
    r = subprocess.run([sys.executable, *cmd[1:]], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == d, r.stderr
    assert same_files(d, clean)


def test_rebuild_command_of_an_older_or_unreadable_meta(tmp_path):
    """meta.json written before it recorded num_merges: the directory's name says it (_b300); meta.json
    unreadable: every knob from the name; the default number: no flag."""
    d = prepare(**FEW, num_merges=300, root=str(tmp_path))
    assert json.load(open(os.path.join(d, "meta.json")))["num_merges"] == 300
    assert "num_merges" not in json.load(open(prepare(**FEW, root=str(tmp_path)) + "/meta.json"))  # default: as before
    damage(d, "meta.json", lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "num_merges"}))
    assert "--num_merges=300" in rebuild_command(d).split()
    damage(d, "meta.json", lambda text: "{")
    assert rebuild_command(d) == (f"python data/gsm_synth/prepare.py --steps=1 --max_operand=5 --ops=+ "
                                       f"--noise=0.0 --n_train=300 --n_val=20 --n_test=20 --num_merges=300 "
                                       f"--root={tmp_path}")


def test_rebuild_commands_of_the_other_tasks(tmp_path):
    """A damaged countdown or gsm8k directory names its own prepare.py, not gsm_synth's; the countdown one,
    followed, rebuilds that directory byte for byte."""
    from data.countdown.prepare import prepare as countdown
    knobs = dict(n_train=60, n_val=10, n_test=10, max_number=30, verbose=False)
    clean, d = countdown(**knobs, out=str(tmp_path / "a")), countdown(**knobs, out=str(tmp_path / "b"))
    damage(d, "test.jsonl", None)
    with pytest.raises(UserError) as e:
        load_split(d, "test")
    cmd = shlex.split(str(e.value).split("build the task data again with: ")[1])
    assert cmd == ["python", "data/countdown/prepare.py", "--n_train=60", "--n_val=10", "--n_test=10",
                   "--max_number=30", f"--out={d}"]
    r = subprocess.run([sys.executable, *cmd[1:]], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert same_files(d, clean)
    gsm8k = tmp_path / "gsm8k" / "prepared_v200"
    gsm8k.mkdir(parents=True)
    # no meta.json: the folder says gsm8k, the name n_val; not where data/gsm8k/prepare.py puts it: --out
    assert rebuild_command(str(gsm8k)) == f"python data/gsm8k/prepare.py --n_val=200 --out={gsm8k}"
