# Tests for the audit (analysis.attribute --audit=N, analysis/audit.py) and the influence figure (plot.influence_figure).
# Run: python -m pytest tests/test_audit.py -q
#
# Independent references, each written out here: the AUC as a count over every (target, other) pair; the
# top-x % shares from a Python sort; the wrong answers from one greedy generation per problem checked by
# the task's correctness reward; the summed ranking as the sum of one find_critical_samples call per wrong
# answer; the figure's points counted per kind from the entries given.
import io
import json
import random
import shutil

import numpy as np
import pytest

from analysis import attribute
from analysis import audit
from analysis import plot
from runs import rundir
import tracin
from configurator import UserError, cli_main
from runs.checkpoint import load_checkpoint
from rewards import REWARD_FUNCS
from data.prompts import decode_completions, encode_prompt, stop_tokens
from model import Sampling, generate
from runs.loading import load_policy
from data.tasks import load_task_split
from test_report import Page
from test_tracin_cli import tiny_run

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")


def pair_auc(scores, labels):
    """P(target above other) + 1/2 P(tie), over every pair."""
    pos = [s for s, l in zip(scores, labels) if l]
    neg = [s for s, l in zip(scores, labels) if not l]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def hand_share(scores, labels, frac):
    """Each rollout's chance to be among the top k under random tie-breaking, summed over the targets, / k."""
    k = max(1, round(frac * len(scores)))
    kth = sorted(scores, reverse=True)[k - 1]
    n_above, n_tied = sum(s > kth for s in scores), sum(s == kth for s in scores)
    chance = [1.0 if s > kth else (k - n_above) / n_tied if s == kth else 0.0 for s in scores]
    return sum(c for c, l in zip(chance, labels) if l) / k


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_and_top_shares_match_pair_counts_and_a_sort(seed):
    rng = random.Random(seed)
    n = 150
    scores = [round(rng.gauss(0, 1), 1) for _ in range(n)]        # rounded: many ties
    labels = [rng.random() < 0.2 + 0.3 * (s > 0) for s in scores]
    m = audit.detection(scores, labels)
    assert m["auc"] == pytest.approx(pair_auc(scores, labels), abs=1e-12)
    for f, key in ((0.01, "top_1pct"), (0.05, "top_5pct"), (0.10, "top_10pct")):
        assert m[key] == pytest.approx(hand_share(scores, labels, f))
    assert m["base_rate"] == pytest.approx(sum(labels) / n) and m["n_targets"] == sum(labels)
    assert audit.auc([1.0, 2.0, 3.0], [False, False, True]) == 1.0 and audit.auc([3, 2, 1], [1, 0, 0]) == 1.0
    assert audit.auc([5.0, 5.0], [True, False]) == 0.5                # a tie counts half
    # top 2 of [3, 2, 2, 2, 1]: the 3 (clean), then one of three 2's, one of them a target: 1/3 of a target
    assert audit.top_share([3, 2, 2, 2, 1], [0, 1, 0, 0, 1], 0.4) == pytest.approx((0 + 1 / 3) / 2)
    assert np.isnan(audit.auc([1.0, 2.0], [True, True]))             # no other rollout: undefined


def test_targets_and_trained_rollouts_definitions():
    rows = [{"defective": True, "advantage": 0.5}, {"defective": True, "advantage": -0.5},
            {"defective": False, "advantage": 1.0}, {"advantage": 2.0}]
    assert audit.defect_targets(rows).tolist() == [True, False, False, False]
    assert audit.defect_targets([{"advantage": 1.0}]) is None        # no planted defect recorded
    sel = [{"selected": True, "i": 0}, {"selected": False, "i": 1}, {"i": 2}]
    assert [s["i"] for s in audit.trained_rollouts(sel)] == [0, 2]   # TracIn run: only what it trained on
    with pytest.raises(UserError, match="trained on no recorded rollout"):
        audit.trained_rollouts([{"selected": False}])


@pytest.fixture(scope="module")
def defect_dir(tiny_setup_two_steps, tmp_path_factory):
    return tiny_run(tiny_setup_two_steps, tmp_path_factory, "--defect_frac=0.5")


@pytest.fixture
def run(defect_dir, tmp_path):
    return shutil.copytree(defect_dir, tmp_path / "run")


def test_audit_ranks_by_the_sum_of_per_answer_attributions(run):
    attribute.main([f"--out_dir={run}", "--audit=3", "--top_k=2"])
    a = json.load(open(run / "tracin_audit.json"))
    model, enc, data_dir = load_policy(str(run / "ckpt_000003.pt"))
    # the first 3 wrong greedy answers, one problem at a time
    correct, expected = REWARD_FUNCS["correctness"], []
    for e in load_task_split(data_dir, "test"):
        idx, _, mask = generate(model, [encode_prompt(enc, e["question"])], 8, stop_tokens(enc),
                                sampling=Sampling(temperature=0, vocab_size=enc.n_vocab))
        text = decode_completions(enc, idx, mask)[0]
        if correct(text, e["answer"]) != 1.0:
            expected.append((e["question"], text))
        if len(expected) == 3:
            break
    assert [(w["question"], w["completion"]) for w in a["wrong"]] == expected
    # the ranking: one attribution per wrong answer, scores added
    train = audit.trained_rollouts(attribute.load_rollouts(str(run / "rollouts.jsonl"), enc))
    ckpts = [str(run / f"ckpt_{i:06d}.pt") for i in (0, 2, 3)]
    temperature = load_checkpoint(ckpts[-1])["config"]["temperature"]  # the run's sampling temperature
    total = np.zeros(len(train))
    wrong = audit.find_wrong(model, enc, load_task_split(data_dir, "test"), 3, "arith", 8)[0]
    assert [(w["question"], w["completion"]) for w in wrong] == expected
    for w in wrong:
        res = attribute.find_critical_samples(model, ckpts, train, [tracin.nll_row(enc, w["question"],
                                                w["completion_tokens"])], enc, temperature=temperature,
                                                checkpoint_steps=[1.0, 1.5, 0.5])
        total += [e["tracin_score"] for e in res["scores"]]
    got = [e["tracin_score"] for e in a["result"]["scores"]]
    assert a["n_scored"] == len(train) and got == pytest.approx(total.tolist(), rel=1e-4, abs=1e-9)
    # the detection figures, recomputed from the JSON's own scores and flags
    labels = [bool(e.get("defective")) and e["advantage"] > 0 for e in a["result"]["scores"]]
    assert 0 < sum(labels) < len(labels)
    rewarded = [e["advantage"] > 0 for e in a["result"]["scores"]]
    assert list(a["detection"]) == ["cosine_score", "tracin_score", "self_influence", "advantage"]
    for key in a["detection"]:                                         # advantage: the floor, every target has A > 0
        s = [e[key] for e in a["result"]["scores"]]
        assert a["detection"][key]["auc"] == pytest.approx(pair_auc(s, labels))
        assert a["detection"][key]["top_10pct"] == pytest.approx(hand_share(s, labels, 0.10))
        among = [(x, l) for x, l, r in zip(s, labels, rewarded) if r]  # defective against clean, A > 0 only
        assert a["detection"][key]["auc_rewarded"] == pytest.approx(pair_auc(*zip(*among)))
    # the report: the audit section with each wrong answer marked wrong, the detection table, text escaped
    page = Page((run / "tracin_report.html").read_text())
    assert page.sections == ["audit"]
    wrong_table, helpful, harmful, found, ckpt_table = page.tables
    assert [row[3][1] for row in wrong_table[1:]] == [w["completion"] for w in a["wrong"]]
    assert [row[4][1] for row in wrong_table[1:]] == ["no"] * 3
    assert [float(row[1][1]) for row in found[1:]] == pytest.approx(
        [a["detection"][k]["auc"] for k in a["detection"]], abs=1e-3)
    # the audit leads with the cosine: its most-likelier rollouts are the highest cosines, by hand
    cos = sorted(a["result"]["scores"], key=lambda e: -e["cosine_score"])
    want = [e["cosine_score"] for e in cos[:2] if e["cosine_score"] > 0]  # --top_k=2
    assert a["lead"]["key"] == "cosine_score" and want
    assert [e["cosine_score"] for e in a["lead"]["most_influential_positive"]] == want
    assert [float(row[1][1]) for row in helpful[1:]] == pytest.approx(want, rel=1e-3)
    assert "<th>summed cosine</th>" in (run / "tracin_report.html").read_text()
    if plot.has_matplotlib():
        from matplotlib.image import imread
        assert imread(str(run / "tracin_influence.png")).shape[0] > 100


def test_contrast_loss_subtracts_the_reference_solutions(run):
    attribute.main([f"--out_dir={run}", "--audit=2", "--audit_loss=contrast", "--figure=", "--html="])
    a = json.load(open(run / "tracin_audit.json"))
    model, enc, data_dir = load_policy(str(run / "ckpt_000003.pt"))
    wrong = audit.find_wrong(model, enc, load_task_split(data_dir, "test"), 2, "arith", 8)[0]
    rows = audit.audit_tests(enc, wrong, "contrast")
    assert [r["advantage"] for r in rows] == [1.0, 1.0, -1.0, -1.0]    # -NLL of each reference solution
    train = audit.trained_rollouts(attribute.load_rollouts(str(run / "rollouts.jsonl"), enc))
    ckpts = [str(run / f"ckpt_{i:06d}.pt") for i in (0, 2, 3)]
    score = lambda tests: np.array([e["tracin_score"] for e in attribute.find_critical_samples(  # noqa: E731
        model, ckpts, train, tests, enc, checkpoint_steps=[1.0, 1.5, 0.5])["scores"]])
    expected = score(rows[:2]) - score([{**r, "advantage": 1.0} for r in rows[2:]])
    got = [e["tracin_score"] for e in a["result"]["scores"]]
    assert got == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-9)


def test_audit_with_a_free_question_whose_correctness_is_unknown(run):
    attribute.main([f"--out_dir={run}", "--audit=1", "--question=Mia has 2 pears. How many?", "--n_probe=4",
                 "--figure="])
    page = Page((run / "tracin_report.html").read_text())
    assert page.sections == ["audit", "q1"] and "(correct: unknown)" in "".join(page.text)
    assert len(list(run.glob("tracin_*.json"))) == 2                     # tracin_audit.json and the question's
    assert json.load(open(run / "tracin_audit.json"))["n_scored"] == 4   # --n_probe applies to both


def test_influence_figure_marks_defects_and_labels_the_top():
    pytest.importorskip("matplotlib")
    entries = [{"index": i, "iter": i // 4, "tracin_score": float(s), "advantage": a, "defective": d,
                "completion": f"c{i}"}
               for i, (s, a, d) in enumerate([(5, 1, True), (-4, -1, True), (3, 1, False), (-1, 1, False),
                                              (0.5, 1, True), (-6, -1, False), (2, -1, False), (1, 1, False)])]
    fig = plot.influence_figure(entries, "t", top_k=2)
    ax = fig.axes[0]
    sizes = {c.get_label().rsplit(" (", 1)[0]: len(c.get_offsets()) for c in ax.collections}
    assert sizes == {"clean prompt": 5, "defective prompt, rewarded (A > 0)": 2, "defective prompt, A < 0": 1}
    labels = {t.get_text(): t.xy[1] for t in ax.texts if hasattr(t, "xy")}
    assert labels == {"H1": 5.0, "H2": 3.0, "R1": -6.0, "R2": -4.0}   # highest and lowest scores
    # a '$' is no mathtext (a broken formula would stop savefig), a character no font has is escaped
    hostile = [{**entries[0], "completion": "$\\frac{$ \u0672 \x01"}]
    fig = plot.influence_figure(hostile, "Mia has $3 and $x^", top_k=1)
    fig.savefig(io.BytesIO(), format="png")
    assert any("\\u0672" in t.get_text() and "$\\\\frac{$" in t.get_text() for t in fig.axes[0].texts)


def test_figure_default_needs_matplotlib_a_named_one_is_refused_without(run, monkeypatch, capsys):
    monkeypatch.setattr(attribute, "has_matplotlib", lambda: False)
    with pytest.raises(UserError, match="needs matplotlib"):
        attribute.main([f"--out_dir={run}", "--audit=1", f"--figure={run}/f.png"])
    attribute.main([f"--out_dir={run}", "--audit=1", "--n_probe=4", "--html="])
    assert "matplotlib is not installed" in capsys.readouterr().out and not (run / "tracin_influence.png").exists()


@pytest.mark.parametrize("args,message", [
    (["--audit=-1"], "'audit' = -1"),
    (["--audit=2", "--question=hi", "--out_json=x.json"], "names one file"),
    (["--audit=2", "--completion=5"], "is the answer to --question"),
    (["--audit=2", "--audit_loss=nll"], "audit_loss"),
    (["--audit=2", "--figure=f.txt"], "must end in .png"),
    (["--audit=2", "--n_probe=1.5"], "'n_probe' = 1.5")])
def test_bad_audit_arguments_are_one_line_errors_before_any_work(run, monkeypatch, capsys, args, message):
    monkeypatch.setattr(attribute, "load_policy", lambda *a, **k: pytest.fail("work started"))
    argv = [f"--out_dir={run}", *args]
    with pytest.raises(UserError, match=message):
        attribute.main(argv)
    with pytest.raises(SystemExit) as e:
        cli_main(attribute.main, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_audit_of_a_model_with_no_wrong_answer_is_refused(run, monkeypatch):
    monkeypatch.setattr(attribute, "find_wrong", lambda *a, **k: ([], 20))
    with pytest.raises(UserError, match="answers all 20 test problems right"):
        attribute.main([f"--out_dir={run}", "--audit=1"])


def test_a_file_tracin_did_not_write_is_never_overwritten(run, tmp_path, monkeypatch, capsys):
    """--figure, --html, --out_json naming a user's file, or a directory that takes no file (/proc): one-line
    errors before any work, the file as it was, nothing new in the run directory."""
    monkeypatch.setattr(attribute, "load_policy", lambda *a, **k: pytest.fail("work started"))
    before = sorted(p.name for p in run.iterdir())
    for key, name in (("figure", "mine.png"), ("html", "mine.html"), ("out_json", "mine.json")):
        mine = tmp_path / name
        mine.write_text('{"my": "notes"}')
        with pytest.raises(SystemExit) as e:
            cli_main(attribute.main, [f"--out_dir={run}", "--audit=2", f"--{key}={mine}"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1
        assert err == f"error: {key} {mine} exists and was not written by analysis.attribute: it is never overwritten; " \
                      "remove it, or give another path\n"
        assert mine.read_text() == '{"my": "notes"}'
    with pytest.raises(UserError, match="cannot write figure /proc/x.png: "):
        attribute.main([f"--out_dir={run}", "--audit=2", "--figure=/proc/x.png"])
    assert sorted(p.name for p in run.iterdir()) == before


def test_what_tracin_wrote_is_replaced_and_said_so(run, tmp_path, capsys):
    paths = [f"--figure={tmp_path}/f.png", f"--html={tmp_path}/r.html", f"--out_json={tmp_path}/a.json"]
    if not plot.has_matplotlib():
        paths[0] = "--figure="
    for _ in range(2):
        attribute.main([f"--out_dir={run}", "--audit=1", "--n_probe=4", *paths])
    out = capsys.readouterr().out
    assert f"wrote {tmp_path}/a.json (replacing it)" in out and f"{tmp_path}/r.html (replacing the earlier one)" in out
    assert not plot.has_matplotlib() or f"{tmp_path}/f.png (replacing the earlier one)" in out


def test_fewer_wrong_answers_than_asked_are_named():
    a = {"wrong": [{}], "n_answered": 20, "n_scored": 4, "loss": "wrong", "detection": {}, "audit": 5}
    assert audit.summary_lines(a)[1] == "  note: --audit=5 asked for more wrong answers than the test split holds"
    assert len(audit.summary_lines({**a, "audit": 1})) == 1


def test_undefined_metrics_are_json_null(tmp_path, capsys):
    """An AUC with no target is NaN in memory; the JSON holds null there (bare NaN is not JSON), finite
    values unchanged, nested in dicts and lists."""
    assert np.isnan(audit.auc([0.3, 0.1], [False, False]))
    path = tmp_path / "a.json"
    rundir.write_json(str(path), {"m": {"auc": float("nan"), "top": [0.25, float("inf")]}, "n": 3}, "x")
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"m": {"auc": None, "top": [0.25, None]}, "n": 3}
