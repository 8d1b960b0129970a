# Tests for the HTML attribution report (analysis/report.py, analysis.attribute --html / --questions_file) on a real tiny
# train_grpo.py run with planted defects. Run: python -m pytest tests/test_report.py -q
#
# Independent references: Python's own html.parser reads the page back (tags, attributes and text as a
# browser's tokenizer would); the expected row order comes from the JSON tracin.py writes beside it.
import glob
import json
import shutil
from analysis import attribute
from html.parser import HTMLParser

import pytest

import tracin
from configurator import UserError, cli_main
from runs.checkpoint import load_checkpoint
from test_tracin_cli import tiny_run

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop")
HOSTILE = 'Mia has <script>alert(1)</script></table> "2" pears & more. How many?'


@pytest.fixture(scope="module")
def defect_dir(tiny_setup, tmp_path_factory):
    """test_tracin_cli's tiny run with half the training problems planted with a wrong answer."""
    return tiny_run(tiny_setup, tmp_path_factory, "--defect_frac=0.5")


@pytest.fixture
def run(defect_dir, tmp_path):
    return shutil.copytree(defect_dir, tmp_path / "run")


def main(run, *args):
    attribute.main([f"--out_dir={run}", "--n_probe=8", "--top_k=3", *args])


class Page(HTMLParser):
    """Every start tag with its attributes, every text, each table's rows as [(td class, td text)]."""
    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.tags, self.sections, self.tables, self.cell, self.text = [], [], [], None, []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "h2":
            self.sections.append(attrs.get("id"))
        if tag == "table":
            self.tables.append([])
        if tag == "tr":
            self.tables[-1].append([])
        if tag == "td":
            self.cell = [attrs.get("class"), ""]
            self.tables[-1][-1].append(self.cell)

    def handle_endtag(self, tag):
        if tag == "td":
            self.cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell[1] += data


def scores(table):
    return [float(text) for row in table for cls, text in row if cls == "score"]


def test_report_rows_in_score_order_with_defect_flags_and_checkpoint_bars(run):
    main(run, "--question=Mia has 2 pears. She gets 3 more. How many?")
    text = (run / "tracin_report.html").read_text()
    page = Page(text)
    (res_path,) = glob.glob(str(run / "tracin_*.json"))
    res = json.load(open(res_path))
    assert page.sections == ["q1"]                                      # one question, no summary
    helpful, harmful, ckpts = page.tables
    assert scores(helpful) == pytest.approx([e["tracin_score"] for e in res["most_influential_positive"]],
                                            rel=1e-3)
    assert scores(helpful) == sorted(scores(helpful), reverse=True) and all(s > 0 for s in scores(helpful))
    assert scores(harmful) == sorted(scores(harmful)) and all(s < 0 for s in scores(harmful))
    assert len(scores(helpful)) + len(scores(harmful)) > 0
    flags = {row[5][1] for row in helpful[1:] + harmful[1:]}                # rank, score, reward, adv, iter, flag
    assert flags <= {"yes", "no"} and any("defective" in e for e in res["scores"])  # the run planted defects
    names = ["ckpt_000000.pt", "ckpt_000002.pt", "ckpt_000003.pt"]
    assert [row[0][1] for row in ckpts[1:]] == names
    lr = [load_checkpoint(str(run / n))["lr"] for n in names]
    w = [lr[0] * 1.0, lr[1] * 1.5, lr[2] * 0.5]                          # w_t = eta_t k_t, trapezoid k_t
    assert res["checkpoint_weights"] == pytest.approx(w)
    assert [float(row[1][1]) for row in ckpts[1:]] == pytest.approx(w, rel=1e-3)
    shares = [float(row[2][1].rstrip("%")) for row in ckpts[1:]]
    assert sum(shares) == pytest.approx(100.0, abs=0.2)
    bars = [a["style"] for t, a in page.tags if t == "div" and a.get("class") == "bar"]
    assert bars == [f"width: {s:.1f}%" for s in shares]
    assert "n_probe: 8" in "".join(page.text) and "memory_efficient" in text


def test_hostile_text_is_escaped_and_nothing_is_loaded(run):
    main(run, f"--question={HOSTILE}", f"--html={run}/r.html")
    text = (run / "r.html").read_text()
    page = Page(text)
    assert not any(t in ("script", "link", "img", "iframe", "object", "embed") for t, _ in page.tags)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;/table&gt;" in text and "<script" not in text
    assert HOSTILE in "".join(page.text)                                  # shown as text, whole
    assert len(page.tables) == 3                                          # the </table> closed none early
    low = text.lower()
    assert "src=" not in low and "@import" not in low and "url(" not in low
    assert all(not a.get("href", "#").lstrip().lower().startswith(("http", "//", "file", "javascript"))
               for _, a in page.tags)
    assert not (run / "tracin_report.html").exists()                      # --html named another file


def test_questions_file_one_section_each_plus_a_summary(run, tmp_path):
    qs = ["Mia has 2 pears. How many?", HOSTILE, "Sam has 3 cards. He gets 1 more. How many?"]
    path = tmp_path / "qs.txt"
    path.write_text(f"{qs[0]}\n\n   \n{qs[1]}\n{qs[2]}\n")                 # blank lines skipped
    main(run, f"--questions_file={path}")
    page = Page((run / "tracin_report.html").read_text())
    assert page.sections == ["summary", "q1", "q2", "q3"]
    assert len(glob.glob(str(run / "tracin_*.json"))) == 3                # one JSON per answer still
    summed = scores(page.tables[0])
    assert summed == sorted(summed, reverse=True) and all(s > 0 for s in summed) and len(summed) <= 3
    links = [a["href"] for t, a in page.tags if t == "a"]
    assert links == ["#q1", "#q2", "#q3"]


def test_html_empty_writes_no_report(run):
    main(run, "--question=Mia has 2 pears. How many?", "--html=")
    assert not glob.glob(str(run / "*.html"))


@pytest.mark.parametrize("args,message", [
    ([], "or --audit=N"),
    (["--question=hi", "--questions_file={tmp}/qs.txt"], "not both question options"),
    (["--questions_file={tmp}/missing.txt"], "is not a file"),
    (["--questions_file={tmp}/empty.txt"], "holds no question"),
    (["--questions_file={tmp}/qs.txt", "--completion=5"], "is the answer to --question"),
    (["--question=hi", "--html={tmp}/no/such/r.html"], "cannot write html"),
    (["--question=hi", "--html={tmp}/r.txt"], "must end in .html"),
    (["--question=hi", "--html=1"], "must be a path ending in .html")])
def test_bad_questions_and_html_are_one_line_errors_before_any_work(run, tmp_path, monkeypatch, capsys,
                                                                  args, message):
    import sample
    monkeypatch.setattr(sample, "load_policy", lambda *a, **k: pytest.fail("work started"))
    (tmp_path / "qs.txt").write_text("hi\n")
    (tmp_path / "empty.txt").write_text("\n  \n")
    argv = [f"--out_dir={run}", *(a.format(tmp=tmp_path) for a in args)]
    with pytest.raises(UserError, match=message):
        attribute.main(argv)
    with pytest.raises(SystemExit) as e:
        cli_main(attribute.main, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
