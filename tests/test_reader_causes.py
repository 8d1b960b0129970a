# What the run-directory readers (analysis.attribute, analysis.hack) say of a damaged or unusual run
# names the real cause, and a record they cannot decode is skipped by name, never a crash:
# - a rollouts.jsonl token id equal to the vocabulary size (one past the last id) is skipped with a
#   warning naming its line, by both readers (decoding it would crash);
# - a run whose completion masks are all zero (every completion truncated under
#   mask_truncated_completions) has nonzero advantages: attribution says no token was counted;
# - analysis.hack: a `defective` value it never reads drops no record; a log whose lines that scored
#   the exact reward were damaged does not guess "stopped before the first?".
# References: the tables of the same run without the damage (analysis.hack), the rollouts counted here.
# Run: python -m pytest -q tests/test_reader_causes.py
import json

import pytest

from analysis import attribute, hack
from configurator import UserError, cli_main
from data.datadir import load_tokenizer
from runs.checkpoint import load_checkpoint
from test_hack_inputs import STEPS, data_dir, make_run, others_row, record  # noqa: F401 (fixture)
from test_tracin_cli import grpo_dir, run  # noqa: F401 (fixtures: a tiny GRPO run, a copy per test)

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")
ATTRIBUTE = ["--question=Mia has 2 pears. How many?", "--n_probe=4"]


def rewrite_rollouts(run, change):
    """rollouts.jsonl with change(record, line number) applied to every record."""
    path = run / "rollouts.jsonl"
    rows = [json.loads(line) for line in open(path)]
    path.write_text("".join(json.dumps(change(r, n) or r) + "\n" for n, r in enumerate(rows, 1)))
    return len(rows)


def test_a_token_id_equal_to_the_vocabulary_size_is_skipped_by_attribution(run, capsys):
    vocab = load_tokenizer(load_checkpoint(str(run / "ckpt.pt"))["data_dir"]).n_vocab  # the model's too
    def one_past(r, n):  # noqa: E306
        if n == 2:
            r["completion_tokens"][0][0] = vocab
    rewrite_rollouts(run, one_past)
    cli_main(attribute.main, [f"--out_dir={run}", *ATTRIBUTE])
    err = capsys.readouterr().err
    said = f"rollouts.jsonl line 2: the record has a completion that is not token ids below {vocab}"
    assert said in err and "skipped" in err


def test_a_token_id_equal_to_the_vocabulary_size_is_skipped_by_hack(tmp_path, capsys, data_dir):
    enc = load_tokenizer(data_dir)
    bad = record(enc, 2, selected=(True, True))
    bad["completion_tokens"][1][-1] = enc.n_vocab
    hack.main([make_run(tmp_path / "r", data_dir, [record(enc, 1), bad, record(enc, 3)])])
    out = capsys.readouterr()
    assert others_row(out.out) == (2, 4)  # the two good records; the bad one counts for nothing
    assert f"rollouts.jsonl line 2: the record has a completion that is not token ids below " \
           f"{enc.n_vocab}" in out.err


def test_attribution_of_all_zero_masks_names_the_uncounted_tokens(run, capsys):
    zeros = lambda r, _: {**r, "completion_mask": [[0] * len(m) for m in r["completion_mask"]]}  # noqa: E731
    n = rewrite_rollouts(run, zeros)
    with pytest.raises(SystemExit) as e:
        cli_main(attribute.main, [f"--out_dir={run}", *ATTRIBUTE])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "holds no rollout with a nonzero advantage" not in err and n
    assert "rollouts with a nonzero advantage counts a completion token" in err
    assert "completion mask is zero" in err


@pytest.mark.parametrize("defective", [["x"], "no", [None, None]])
def test_hack_counts_a_record_whose_unread_defective_value_is_malformed(tmp_path, capsys, data_dir,
                                                                        defective):
    enc = load_tokenizer(data_dir)
    records = [record(enc, 1), {**record(enc, 2), "defective": defective}]
    hack.main([make_run(tmp_path / "r", data_dir, records)])
    out = capsys.readouterr()
    assert others_row(out.out) == (2, 4) and "skipped" not in out.err, out  # both records read


@pytest.mark.parametrize("damage", ["cut", "text"])
def test_hack_names_damaged_log_lines_instead_of_guessing_an_early_stop(tmp_path, capsys, data_dir,
                                                                        damage):
    enc = load_tokenizer(data_dir)
    run = make_run(tmp_path / "r", data_dir, [record(enc, 1)])
    lines = open(f"{run}/log.jsonl").read().splitlines()
    if damage == "cut":  # every step's line cut off, as by a crash mid-write: the evaluation's line only
        lines = lines[:1] + [line[:len(line) // 2] for line in lines[1:]]
    else:  # every step's exact reward written as text: left out with a warning
        lines = lines[:1] + [json.dumps({**s, "rewards/countdown": "high"}) for s in STEPS]
    open(f"{run}/log.jsonl", "w").write("\n".join(lines) + "\n")
    with pytest.raises(UserError) as e:
        hack.main([run])
    assert "never scored the exact reward 'countdown'" in str(e.value)
    assert "stopped before the first" not in str(e.value) and "damaged lines" in str(e.value)
