"""
A self-contained HTML page of post-hoc TracIn attributions (analysis.attribute --html=...): one section per
question, with its most helpful and most harmful rollouts and each checkpoint's share of the influence.

One file, inline CSS only: no script, no external stylesheet, font or image, so it opens offline,
prints, and can be mailed. Every text that comes from a run or a user (questions, prompts, completions,
paths) goes through esc(): a completion that says `<script>` or `</table>` is shown, never obeyed.
"""
# configurator first: a Ctrl-C during the imports below is one line, not a traceback
from configurator import UserError, cli_main, quiet_start
quiet_start(__name__)
import html
import os
import unicodedata

from analysis.outputs import file_beside, put_in_place

CSS = """
body { font: 14px/1.4 sans-serif; max-width: 1100px; margin: 1em auto; color: #111; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; border-top: 1px solid #999; padding-top: .6em; }
h3 { font-size: 1em; margin-bottom: .2em; }
table { border-collapse: collapse; width: 100%; margin: .3em 0 1em; }
th, td { border: 1px solid #bbb; padding: 2px 5px; vertical-align: top; text-align: left; }
th { background: #eee; } td.num, td.score { text-align: right; white-space: nowrap; font-family: monospace; }
td.text { white-space: pre-wrap; font-family: monospace; font-size: 12px; }
.bar { background: #4a78c2; height: 12px; min-width: 1px; }
.barcell { width: 45%; } .defect { color: #b00; font-weight: bold; }
.note { color: #444; font-size: 13px; }
code, span.text { unicode-bidi: isolate; }  /* right-to-left text in a question cannot reorder ours */
@media print { body { max-width: none; } tr { page-break-inside: avoid; } }
"""
FORMULA = ("TracIn(z_test, z_i) = &Sigma;<sub>t</sub> &eta;<sub>t</sub> k<sub>t</sub> &lang;&nabla;L(z_test, "
           "&theta;<sub>t</sub>), &nabla;L(z_i, &theta;<sub>t</sub>)&rang;")  # our own markup, no user text


# Characters a page would not show as themselves, so text could look other than it is: control characters
# (an untrained model's completions hold them), format characters (Cf: bidirectional overrides, embeddings,
# isolates and marks U+202A-202E, U+2066-2069, U+200E/F, U+061C, which reorder what follows; zero-width
# spaces and joiners, soft hyphen, BOM, tag characters, which hide), line and paragraph separators,
# lone surrogates (not even writable as UTF-8), private-use and unassigned code points (a newer Unicode may
# make them format characters), and the invisible letters and variation selectors below.
HIDDEN_CATEGORIES = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
INVISIBLE = {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0, *range(0x180B, 0x1810),
             *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)}


def shown(ch):
    """ch itself, or where it could reorder or hide text, its code point written out: \\xNN, \\uNNNN, \\UNNNNNNNN."""
    o = ord(ch)
    if ch in "\t\n" or (o not in INVISIBLE and unicodedata.category(ch) not in HIDDEN_CATEGORIES):
        return ch
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def esc(value):
    """Any run's or user's text as HTML text (quotes too: safe inside attributes), every character that could
    reorder or hide text shown as its escaped code point (shown)."""
    text = str(value)
    if not text.isascii() or not text.isprintable():  # the common case, plain ASCII text, skips the loop
        text = "".join(map(shown, text))
    return html.escape(text, quote=True)


def rollout_table(entries, with_defect, score_key="tracin_score", score_label="TracIn score"):
    """Rows of rollouts in the order given (the caller's score order): score, reward, advantage, iteration,
    the planted-defect flag when the run recorded one, prompt and completion."""
    head = ["#", score_label, "reward", "advantage", "iter"] + (["defective"] if with_defect else [])
    rows = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head + ["prompt", "completion"]) + "</tr>"]
    for rank, e in enumerate(entries, 1):
        defect = e.get("defective")
        flag = ("" if not with_defect else '<td class="defect">yes</td>' if defect else
                "<td>no</td>" if defect is not None else "<td>?</td>")
        rows.append(f'<tr><td class="num">{rank}</td><td class="score">{e[score_key]:+.4e}</td>'
                    f'<td class="num">{e["reward"]:.3f}</td><td class="num">{e["advantage"]:+.3f}</td>'
                    f'<td class="num">{esc(e["iter"])}</td>{flag}'
                    f'<td class="text">{esc(e["prompt"])}</td><td class="text">{esc(e["completion"])}</td></tr>')
    return "\n".join(rows) + "</table>" if entries else '<p class="note">none (no rollout scored on this side)</p>'


def checkpoint_bars(result, names):
    """Each checkpoint's share of the total influence, sum_i |w_t <g_i, G_t>| over the scored rollouts
    (absolute values: helpful and harmful rollouts must not cancel), as a bar, with its weight w_t."""
    per_ckpt = [0.0] * result["num_checkpoints"]
    for e in result["scores"]:
        for t, c in enumerate(e["checkpoint_contributions"]):
            per_ckpt[t] += abs(c)
    total = sum(per_ckpt) or 1.0
    weights = result.get("checkpoint_weights", [None] * len(per_ckpt))
    names = list(names)[-len(per_ckpt):] if names else [f"checkpoint {t}" for t in range(len(per_ckpt))]
    rows = ["<table><tr><th>checkpoint</th><th>weight &eta;<sub>t</sub> k<sub>t</sub></th>"
            "<th>share of |influence|</th><th></th></tr>"]
    for name, w, part in zip(names, weights, per_ckpt):
        share = 100.0 * part / total
        rows.append(f'<tr><td>{esc(name)}</td><td class="num">{"?" if w is None else f"{w:.3e}"}</td>'
                    f'<td class="num">{share:.1f}%</td><td class="barcell">'
                    f'<div class="bar" style="width: {share:.1f}%"></div></td></tr>')
    return "\n".join(rows) + "</table>"


def question_section(n, section, meta):
    """One attributed question: its answer, the top-k helpful (descending) and harmful (ascending)
    rollouts, and the checkpoints' shares."""
    res, correct = section["result"], section.get("correct")
    verdict = "unknown" if correct is None else "correct" if correct else "wrong"
    return (f'<h2 id="q{n}">Question {n}</h2>\n<p><b>Question:</b> <span class="text">{esc(section["question"])}'
            f'</span></p>\n<p><b>Model&#39;s greedy answer:</b> <code>{esc(section["completion"])}</code> '
            f'(correct: {verdict})</p>\n'
            f'<p class="note">{res["num_train_samples"]} rollouts scored; mean score '
            f'{res["mean_influence_score"]:+.3e}, max {res["max_influence_score"]:+.3e}.</p>\n'
            f'<h3>Most helpful rollouts (positive: training on it lowered this answer&#39;s loss)</h3>\n'
            f'{rollout_table(res["most_influential_positive"], meta["defect"])}\n'
            f'<h3>Most harmful rollouts (negative: training on it raised this answer&#39;s loss)</h3>\n'
            f'{rollout_table(res["most_influential_negative"], meta["defect"])}\n'
            f'<h3>Checkpoints</h3>\n{checkpoint_bars(res, meta.get("checkpoints"))}')


def summed_helpful(sections, top_k):
    """The rollouts that help most summed over the questions: scores added per rollout ('index' is its
    place in the scored list, the same for every question of one run), top_k with a positive sum."""
    total, entry = {}, {}
    for s in sections:
        for e in s["result"]["scores"]:
            total[e["index"]] = total.get(e["index"], 0.0) + e["tracin_score"]
            entry[e["index"]] = e
    best = sorted((i for i in total if total[i] > 0), key=lambda i: -total[i])[:top_k]
    return [{**entry[i], "summed_score": total[i]} for i in best]


def summary_section(sections, meta):
    rows = summed_helpful(sections, meta.get("top_k", 5))
    links = "".join(f'<li><a href="#q{n}">{esc(s["question"])}</a> &rarr; <code>{esc(s["completion"])}</code></li>'
                    for n, s in enumerate(sections, 1))
    return (f'<h2 id="summary">Summary over {len(sections)} questions</h2>\n<ol>{links}</ol>\n'
            f'<h3>Rollouts that help most, TracIn scores summed over the questions</h3>\n'
            f'{rollout_table(rows, meta["defect"], "summed_score", "summed TracIn score")}')


SCORE_NAMES = {"tracin_score": "TracIn score (summed)", "cosine_score": "cosine-normalised TracIn",
               "self_influence": "self-influence (TracIn paper's baseline)",
               "advantage": "advantage alone (the floor: every target has A > 0)"}


def detection_rows(detection):
    """How well each ranking finds the planted defect's rewarded rollouts: AUC, top shares against base rate."""
    rows = ["<table><tr><th>ranked by</th><th>AUC</th><th>AUC among A &gt; 0</th><th>top 1 %</th><th>top 5 %</th>"
            "<th>top 10 %</th><th>base rate</th><th>targets / rollouts</th></tr>"]
    for key, m in detection.items():
        rows.append(f'<tr><td>{esc(SCORE_NAMES.get(key, key))}</td><td class="num">{m["auc"]:.3f}</td>'
                    f'<td class="num">{m.get("auc_rewarded", float("nan")):.3f}</td>'
                    + "".join(f'<td class="num">{100 * m[k]:.1f}%</td>'
                              for k in ("top_1pct", "top_5pct", "top_10pct", "base_rate"))
                    + f'<td class="num">{m["n_targets"]} / {m["n"]}</td></tr>')
    return "\n".join(rows) + "</table>"


def audit_section(a, meta):
    """analysis.attribute --audit=N: the model's wrong test answers, the rollouts ranked by their influence summed over
    them, and, where a defect was planted, how well that ranking finds it (analysis/audit.py)."""
    res = a["result"]
    loss = ("each wrong answer&#39;s negative log-likelihood" if a["loss"] == "wrong" else
            "each wrong answer&#39;s negative log-likelihood minus that of the reference solution")
    wrong = ["<table><tr><th>#</th><th>test question</th><th>reference answer</th><th>model&#39;s greedy answer"
             "</th><th>correct</th></tr>"]
    wrong += [f'<tr><td class="num">{n}</td><td class="text">{esc(w["question"])}</td><td class="num">'
              f'{esc(w["answer"])}</td><td class="text">{esc(w["completion"])}</td><td>no</td></tr>'
              for n, w in enumerate(a["wrong"], 1)]
    found = ("" if not a["detection"] else
             f'<h3>Finding the planted defect</h3>\n<p class="note">Targets: the {esc(a["targets"])}. AUC: the '
             f'probability that a random target ranks above a random other rollout (0.5: chance); among A &gt; 0: the '
             f'same among the rewarded rollouts only (defective against clean); top x %: the targets&#39; share '
             f'among the x % highest-ranked rollouts.</p>\n{detection_rows(a["detection"])}')
    lead = a.get("lead") or {"key": "tracin_score", **res}  # (an audit written before it led with the cosine)
    label = {"cosine_score": "summed cosine", "tracin_score": "summed TracIn score"}[lead["key"]]
    ranked_by = ("the cosine of their gradient with the wrong answers&#39; (TracIn over the gradients&#39; norms: "
                 "a long or high-advantage rollout does not lead by its length)" if lead["key"] == "cosine_score"
                 else "their TracIn score")
    return (f'<h2 id="audit">Audit: what went wrong</h2>\n<p>The final model answered the test split greedily; '
            f'the first {len(a["wrong"])} wrong answers among {a["n_answered"]} problems are the test targets, '
            f'test loss: {loss}. {a["n_scored"]} rollouts the run trained on are ranked by {ranked_by} '
            f'summed over the targets: positive = its step made the wrong answers likelier.</p>\n'
            f'<h3>Wrong answers</h3>\n' + "\n".join(wrong) + "</table>\n"
            f'<h3>Rollouts that made the wrong answers likelier most</h3>\n'
            f'{rollout_table(lead["most_influential_positive"], meta["defect"], lead["key"], label)}\n'
            f'<h3>Rollouts that opposed them most</h3>\n'
            f'{rollout_table(lead["most_influential_negative"], meta["defect"], lead["key"], label)}\n'
            f'{found}\n<h3>Checkpoints</h3>\n{checkpoint_bars(res, meta.get("checkpoints"))}')


def method_paragraph(meta):
    """The formula computed and the knobs it was computed with."""
    probe = meta.get("n_probe") or "all"
    layers = meta.get("layer_filter") or "all LoRA layers"
    return (f'<p class="note">Score computed: {FORMULA}, summed over the run&#39;s checkpoints t; &eta;<sub>t</sub> '
            f'is the learning rate stored in checkpoint t, k<sub>t</sub> the training steps it stands for '
            f'(trapezoid rule over the checkpoint iterations; mode &quot;simple&quot; uses the last checkpoint '
            f'with weight 1). Test loss: the answer&#39;s negative log-likelihood; a rollout&#39;s: its GRPO '
            f'policy-gradient loss, both at the run&#39;s sampling temperature. Positive = helpful. '
            f'Mode: <b>{esc(meta.get("mode"))}</b>; n_probe: <b>{esc(probe)}</b> rollouts with nonzero '
            f'advantage; layer_filter: <b>{esc(layers)}</b>.</p>')


def write_report(path, sections, meta, audit=None, ours=lambda path: True):
    """Write the HTML report atomically (a reader never sees half a page); a file at path is
    replaced only where ours(path) says analysis.attribute wrote it (outputs.put_in_place).
    sections: [{'question', 'completion', 'correct' (True/False/None = unknown), 'result'
    (find_critical_samples' dict)}]; with more than one, a summary comes first.
    meta: {'run', 'mode', 'n_probe', 'layer_filter', 'top_k', 'checkpoints' (names, oldest first)}.
    audit: attribute.audit's dict (analysis.attribute --audit=N), shown first."""
    results = [s["result"] for s in sections] + ([audit["result"]] if audit else [])
    meta = {**meta, "defect": any("defective" in e for r in results for e in r["scores"])}
    what = (f"an audit of {len(audit['wrong'])} wrong test answers and " if audit else "") + f"{len(sections)} question(s)"
    body = [f'<h1>TracIn attribution report</h1>\n<p>Run: <code>{esc(meta.get("run", ""))}</code>; '
            f'{what}.</p>', method_paragraph(meta)]
    if audit:
        body.append(audit_section(audit, meta))
    if len(sections) > 1:
        body.append(summary_section(sections, meta))
    body += [question_section(n, s, meta) for n, s in enumerate(sections, 1)]
    page = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n<title>TracIn attribution report'
            f'</title>\n<style>{CSS}</style></head><body>\n' + "\n".join(body) + "\n</body></html>\n")
    tmp = file_beside(path, ".html")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
    except BaseException as e:
        if os.path.lexists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):  # a full disk: named by the report's path, not the temporary file's
            raise OSError(e.errno, f"{e.strerror or e} (writing the HTML report)", path) from None
        raise
    put_in_place(tmp, path, ours, "analysis.attribute")


def main(argv):
    raise UserError("the report is written by the attribution: python -m analysis.attribute "
                    "--out_dir=RUN --question=\"...\" (its --html=PATH)")


if __name__ == "__main__":  # not a command of its own
    cli_main(main)
