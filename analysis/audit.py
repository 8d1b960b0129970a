"""
What went wrong, and which training rollouts taught it: analysis.attribute --audit=N.

    python -m analysis.attribute --out_dir=out/cmpC/grpo_s3 --audit=16

The final model answers the task's test problems greedily; the first N it gets wrong become the test
targets, each with the model's own wrong answer. Every rollout the run trained on is then ranked by its
TracIn influence summed over those N answers. The sum is linear in the test gradient, so it is ONE
attribution against the summed test gradient, not N:

    sum_q TracIn(z_q, z_i) = sum_t w_t < sum_q grad L(z_q, theta_t), grad L(z_i, theta_t) >

Top of the ranking: the rollouts whose training steps most raised the wrong answers' likelihood.

Where the run planted a defect (train_grpo.py defect_frac), the ranking is also scored as a detector:
the TracIn paper's mislabeled-data experiment (Pruthi et al. 2020), on RL rollouts. The
targets are the rewarded rollouts of defective prompts: a prompt whose reference answer was planted
wrong, and a rollout of it with advantage A > 0, i.e. one whose likelihood the update raised because
the wrong reference rewarded it (defect_targets). Reported: the targets' share among the top 1 %, 5 %,
10 % of the ranking against their share of all rollouts (the base rate), and the AUC; the same for
the advantage alone, the floor (every target has A > 0), and each AUC among the rollouts with A > 0.
Measured on experiment C's runs in docs/experiments.md (the advantage alone ranks best there).
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, cli_main, quiet_start
quiet_start(__name__)
import numpy as np

from tracin import nll_row
from rewards import REWARD_FUNCS
from data.prompts import encode_prompt, encode_text, stop_tokens
from model import Sampling, generate
from data.tasks import TASKS

FRACS = (0.01, 0.05, 0.10)  # the top fractions whose target share is reported
LOSSES = ("wrong", "contrast")


def greedy_answers(model, enc, prompts, max_new_tokens):
    """The model's greedy completion (temperature 0) of each prompt, as token ids without the stop ids: at most
    max_new_tokens, and never into the last place of the context (a test row appends end-of-text there)."""
    room = model.config.block_size - 1 - max(len(p) for p in prompts)
    stops = stop_tokens(enc)
    greedy = Sampling(temperature=0, vocab_size=enc.n_vocab)
    idx, _, mask = generate(model, prompts, min(max_new_tokens, room), stops, sampling=greedy)
    T = mask.size(1)
    return [[t for t, keep in zip(row, m) if keep and t not in stops]
            for row, m in zip(idx[:, -T:].tolist(), mask.tolist())]


def find_wrong(model, enc, examples, n, task, max_new_tokens, batch=100):
    """The first n of `examples` that the model answers wrongly, greedily (temperature 0), wrong as the task's
    correctness reward says (tasks.TASKS), in split order. Returns (wrong, number of problems answered);
    each wrong one: {question, answer, solution, completion (text), completion_tokens}."""
    correct, wrong, seen = REWARD_FUNCS[TASKS[task]["correct"]], [], 0
    for s in range(0, len(examples), batch):
        chunk = examples[s:s + batch]
        prompts = [encode_prompt(enc, e["question"]) for e in chunk]
        for i, p in enumerate(prompts):  # an answer token and end-of-text must fit after the question
            if len(p) > model.config.block_size - 2:
                raise UserError(f"test question {s + i} of the split ({chunk[i]['question'][:40]!r}...) is {len(p)} "
                                f"tokens; the model's context of {model.config.block_size} leaves no room for an "
                                "answer: audit a model with a longer context, or a test split of shorter questions")
        answers = greedy_answers(model, enc, prompts, max_new_tokens)
        for e, toks in zip(chunk, answers):
            seen += 1
            text = enc.decode(toks)
            if correct(text, e["answer"]) != 1.0:
                wrong.append({"question": e["question"], "answer": e["answer"], "solution": e.get("solution"),
                              "completion": text, "completion_tokens": toks})
                if len(wrong) == n:
                    return wrong, seen
    return wrong, seen


def audit_tests(enc, wrong, loss="wrong"):
    """The test samples whose summed gradient the rollouts are scored against.
    'wrong':    each wrong answer with A = +1; test loss sum_q NLL(wrong_q)
    'contrast': also each reference solution with A = -1; test loss sum_q NLL(wrong_q) - NLL(solution_q):
                a rollout scores high when its step made the wrong answer likelier RELATIVE to the right one."""
    if loss not in LOSSES:
        raise UserError(f"audit_loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    rows = [nll_row(enc, w["question"], w["completion_tokens"]) for w in wrong]  # A = +1: loss = NLL
    if loss == "contrast":
        rows += [nll_row(enc, w["question"], encode_text(enc, w["solution"]), -1.0) for w in wrong]
    return rows


def defect_targets(samples):
    """(n,) bool: the rewarded rollouts of defective prompts, defective and advantage > 0; None where the run
    recorded no planted defect."""
    if not any("defective" in s for s in samples):
        return None
    return np.array([bool(s.get("defective")) and s["advantage"] > 0 for s in samples])


def average_ranks(x):
    """Ranks 1..n of x in ascending order; tied values share the mean of their ranks."""
    x = np.asarray(x, dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)                     # rank of each distinct value's last copy
    return (last - (counts - 1) / 2.0)[inverse]  # mean of ranks last-c+1 .. last


def auc(scores, labels):
    """P(score of a random target > score of a random other) + 1/2 P(tie): the Mann-Whitney U statistic over
    n_pos n_neg, U = sum of the targets' ranks - n_pos (n_pos + 1) / 2. 0.5 = a random ranking."""
    labels = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    u = average_ranks(scores)[labels].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def top_share(scores, labels, frac):
    """The targets' share among the top k = max(1, round(frac n)) scores, expected over random tie-breaking
    (the advantage, for one, takes few distinct values): the scores above the k-th count whole, the k - n_above
    places left go to the scores equal to it, each target among them with probability places / n_tied."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    k = max(1, int(round(frac * len(labels))))
    kth = np.sort(scores)[::-1][k - 1]
    above, tied = scores > kth, scores == kth
    return float((labels[above].sum() + (k - above.sum()) * labels[tied].mean()) / k)


def detection(scores, labels):
    """How well a ranking (higher score = more suspect) finds the targets: AUC, the top shares, base rate."""
    labels = np.asarray(labels, dtype=bool)
    out = {"auc": auc(scores, labels), "base_rate": float(labels.mean()), "n_targets": int(labels.sum()),
           "n": int(len(labels))}
    out.update({f"top_{round(100 * f)}pct": top_share(scores, labels, f) for f in FRACS})
    return out


def trained_rollouts(train):
    """The rollouts the run trained on: in a TracIn run, those it selected; in a standard run, every one
    (with nonzero advantage, as load_rollouts reads them); never those of a skipped step (NaN/Inf:
    its last update was not applied), nor a TracIn run's unselected ones. Left out too: a zero-advantage
    rollout, whose KL term moves the weights when beta > 0 (attribution scores the policy term)."""
    kept = [s for s in train if s.get("selected", True) is True and not s.get("skipped")]
    if not kept:
        raise UserError("the run trained on no recorded rollout (none selected, or every step skipped): "
                        "there is nothing to attribute")
    return kept


# the cosine first: where a run learned a planted defect it finds the defect's rewarded rollouts better
# than the dot product and the advantage alone, at the top of the ranking and among the rewarded ones
RANKINGS = ("cosine_score", "tracin_score", "self_influence", "advantage")


def extremes(scores, key, top_k):
    """(the top_k entries scoring highest above 0 by `key`, the top_k lowest below 0, lowest first)."""
    order = sorted(scores, key=lambda e: -e[key])  # ties keep the scored order
    return [e for e in order[:top_k] if e[key] > 0], [e for e in order[::-1][:top_k] if e[key] < 0]


def leading(scores, top_k):
    """(score key, then its extremes) of the ranking an audit leads with: the cosine where it was
    computed, else the summed TracIn score."""
    key = "cosine_score" if scores and "cosine_score" in scores[0] else "tracin_score"
    return (key, *extremes(scores, key, top_k))


def detection_table(result, labels):
    """Detection metrics of each score the attribution returned (TracIn, cosine-normalised, self-influence),
    and of the advantage alone: every target has A > 0, so a ranking by A already beats chance; that is the
    floor. 'auc_rewarded': the AUC among the rollouts with A > 0 only (defective against clean rewarded
    ones), which the advantage cannot separate."""
    table, rows = {}, result["scores"]
    if labels is None:
        return table
    rewarded = np.array([e["advantage"] > 0 for e in rows])
    for key in RANKINGS:
        if all(key in e for e in rows):
            scores = np.array([e[key] for e in rows], dtype=np.float64)
            table[key] = {**detection(scores, labels), "auc_rewarded": auc(scores[rewarded], labels[rewarded])}
    return table


TARGETS = "rewarded rollouts of defective prompts: planted wrong reference answer and advantage > 0"


def summary_lines(a):
    """The audit's verdict in a few printed lines."""
    lines = [f"audit: {len(a['wrong'])} wrong answers among the first {a['n_answered']} test problems "
             f"({a['n_answered'] - len(a['wrong'])} right); {a['n_scored']} trained rollouts ranked "
             f"by summed influence (test loss {a['loss']!r})"]
    if len(a["wrong"]) < a["audit"]:  # the whole test split was answered: there are no more wrong answers
        lines.append(f"  note: --audit={a['audit']} asked for more wrong answers than the test split holds")
    for key, m in a["detection"].items():
        lines.append(f"  {key:>14}: AUC {m['auc']:.3f} (among A > 0: {m['auc_rewarded']:.3f}) | top 1 % "
                     f"{m['top_1pct']:.1%} | top 5 % {m['top_5pct']:.1%} | top 10 % {m['top_10pct']:.1%} "
                     f"defective-rewarded, base rate {m['base_rate']:.1%} ({m['n_targets']} of {m['n']})")
    return lines


def main(argv):
    raise UserError("the audit is an option of the attribution: python -m analysis.attribute "
                    "--out_dir=RUN --audit=N")


if __name__ == "__main__":  # not a command of its own
    cli_main(main)
