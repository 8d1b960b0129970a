"""
Post-hoc TracIn on a finished run: which training rollouts helped or hurt the model's answer to a question?

    python -m analysis.attribute --out_dir=out/tracin --question="Mia has 3 apples. ..."
    python -m analysis.attribute --out_dir=out/tracin --questions_file=qs.txt   # one per line; HTML: --html=PATH
    python -m analysis.attribute --out_dir=out/tracin --audit=16   # which rollouts taught 16 wrong test answers

The method is tracin.tracin_cp (TracInCP over the run's checkpoints; its weights eta_t k_t are explained
there). find_critical_samples, below, is what a tool adds around it: the arguments refused before any work,
checkpoints read as data (tensors only), n_probe rollouts, the modes, the model put back, a Captum-shaped
result. The command line reads the run directory (checkpoints, rollouts.jsonl), answers the question
greedily with the final model, prints the top rollouts and writes a JSON file per answer, an HTML page
(analysis/report.py) and a figure (analysis/plot.py). --audit (audit, with analysis/audit.py's parts)
ranks the rollouts by their influence summed over the final model's wrong test answers.
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, check, check_choice, cli_main, configure, quiet_start
quiet_start(__name__)
import glob
import hashlib
import json
import math
import os
import pickle
import re
import shlex

import torch

from analysis.outputs import check_new_file, has_mark
from analysis.audit import (LOSSES, TARGETS, audit_tests, defect_targets, detection_table, find_wrong,
                            extremes, greedy_answers, leading, summary_lines, trained_rollouts)
from analysis.plot import has_matplotlib, plot_influence
from analysis.report import write_report
from data.tasks import load_task_split
from runs.checkpoint import load_adapter, load_checkpoint
from runs.metrics import read_records
from runs.rundir import reader_lock, run_files, unused_out_dir, write_json
from data.prompts import encode_prompt, encode_text, stop_tokens
from runs.loading import load_policy
from scale.device import check_device
from lora import load_lora_state_dict, lora_modules, lora_state_dict
from tracin import nll_row, rollout_batch, tracin_cp

# ---------------------------------------------------------------------------------------------
# The method (tracin.tracin_cp), with what a tool adds around it: the arguments checked before any
# work, the checkpoints read as data, rollouts probed, the model put back, a Captum-shaped result.

def find_critical_samples(model, checkpoints, train_samples, test_samples, enc, mode="memory_efficient",
                          learning_rates=None, layer_filter=None, n_probe=None, top_k=5, temperature=1.0,
                          micro_batch=64, normalize=False, self_influence=False, checkpoint_steps=None,
                          load=None):
    """Score training rollouts by their influence on test samples, tracin.tracin_cp's
        TracInCP(z_test, z_i) = sum_t w_t <g_test(theta_t), g_i(theta_t)>,   w_t = eta_t k_t,
    over checkpoints (GRPO checkpoints' paths, or state dicts, holding 'lora' and 'lr').
    eta_t: learning_rates, default each checkpoint's 'lr'. k_t, the training steps checkpoint t stands
    for: checkpoint_steps, default tracin.step_weights of the checkpoints' 'iter_num'.
    mode: 'simple' (the last checkpoint, w = 1), 'full' (all loaded first), 'memory_efficient' (one at
    a time). load: reads a path (default read_checkpoint: tensors and plain containers only).
    temperature: the run's. n_probe: that many rollouts, evenly spaced.
    normalize: also cosine_score, w_t <g_i, G_t> / (||g_i|| ||G_t||), G_t = sum_j g_test_j;
    self_influence: also w_t ||g_i||^2. Train/eval flag, LoRA weights, .grad: restored on return."""
    check_attribution_inputs(model, mode, checkpoints, train_samples, test_samples, enc)
    counts = {"n_probe": (n_probe, 0), "micro_batch": (micro_batch, 1), "top_k": (top_k, 0)}
    per_checkpoint = {"learning rates": learning_rates, "checkpoint_steps": checkpoint_steps}
    check_attribution_knobs(model, len(checkpoints), counts, temperature, per_checkpoint, layer_filter)
    load = load or read_checkpoint
    if mode == "simple":
        checkpoints = checkpoints[-1:]
        learning_rates, checkpoint_steps = [1.0], [1.0]
    n = len(train_samples)
    if n_probe and n_probe < n:
        train_samples = [train_samples[i * n // n_probe] for i in range(n_probe)]
    # micro-batches laid out once for every checkpoint, each padded to its own longest row only
    # (rollouts are recorded step by step: neighbours share their step's completion length)
    device = next(model.parameters()).device

    def fitted(rows):
        """rows laid out by rollout_batch; split in two where the padding (one row's long prompt
        beside another's long completion) makes them wider than the context: each row fits alone"""
        batch = rollout_batch(enc, rows, device)
        if batch[0].size(1) - 1 <= model.config.block_size or len(rows) == 1:
            return [batch]
        return fitted(rows[:len(rows) // 2]) + fitted(rows[len(rows) // 2:])

    def chunked(rows):
        return [b for s in range(0, len(rows), micro_batch) for b in fitted(rows[s:s + micro_batch])]
    train, test = chunked(train_samples), chunked(test_samples)
    # 'full': every checkpoint in memory first; 'memory_efficient' reads each in turn, once
    if mode == "full":
        checkpoints = [load(c) if isinstance(c, str) else c for c in checkpoints]
    names = [c if isinstance(c, str) else f"{t} (of {len(checkpoints)})" for t, c in enumerate(checkpoints)]

    def states():
        """Each checkpoint as tracin_cp reads it, in turn: its adapter and eta_t refused by name
        before any work on it."""
        for t, (ckpt, name) in enumerate(zip(checkpoints, names)):
            state = load(ckpt) if isinstance(ckpt, str) else ckpt
            lora = state["lora"] if "lora" in state else state
            try:  # named: one checkpoint of many (a base's, another run's); tracin_cp loads it again
                load_adapter(model, lora)
            except UserError as e:
                raise UserError(f"checkpoint {name}: {e}") from None
            eta = learning_rates[t] if learning_rates is not None else state.get("lr", 1.0)
            # k_t given, or checked once all iterations are known (tracin.step_weights)
            k = checkpoint_steps[t] if checkpoint_steps is not None else 1.0
            if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (eta, k)):
                raise UserError(f"checkpoint {name}: learning rate {eta!r}, steps {k!r}: give finite "
                                "numbers (learning_rates, checkpoint_steps)")
            theta = {"lora": lora, "lr": eta, "iter_num": state.get("iter_num")}
            del state, lora  # its optimizer state: one checkpoint in memory
            yield theta
    # put back in `finally`: the train/eval flag, LoRA weights, .grad (hook_products sets None)
    was_training, own_lora = model.training, lora_state_dict(model)
    grads = [(p, p.grad) for p in model.parameters()]
    # dropout off: deterministic scores; no gradient checkpointing (the hooks need that)
    model.eval()
    try:
        terms = tracin_cp(model, states(), train, test, temperature, layer_filter, checkpoint_steps)
    finally:
        load_lora_state_dict(model, own_lora)
        for p, g in grads:
            p.grad = g
        model.train(was_training)
    weights, contrib, cosine, selfinf = terms
    for name, c in zip(names, contrib):
        if not torch.isfinite(c).all():
            raise UserError(f"NaN/Inf gradient inner products at checkpoint {name}: its adapter or the "
                            "rollouts give non-finite gradients; leave it out")
    asked = (cosine if normalize else [], selfinf if self_influence else [])
    return attribution_result(train_samples, contrib, *asked, mode, weights, top_k)


def read_checkpoint(path):
    """A checkpoint file's dict, read as data: torch.load(weights_only=True) takes tensors and plain
    containers only, and refuses a pickled object, whose loading could run code; the command line
    passes runs/checkpoint.load_checkpoint, whose errors say more."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))  # the object torch refused to unpickle
        if isinstance(e, pickle.UnpicklingError) and found:
            raise UserError(f"checkpoint {path} holds a pickled Python object ({found[1]}), not only "
                            "tensors: refused, as loading it could run code") from None
        raise UserError(f"checkpoint {path} cannot be read ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise UserError(f"checkpoint {path} holds a {type(state).__name__}, not a dict")
    return state


def is_row(s, vocab_size):
    """Whether rollout_batch can lay s out: a dict of 'prompt' (text), 'completion_tokens' (1+ ids
    below vocab_size), 'completion_mask' (as long) and a finite 'advantage'."""
    get = s.get if isinstance(s, dict) else lambda key: None
    toks, mask, adv = get("completion_tokens"), get("completion_mask"), get("advantage")
    return (isinstance(get("prompt"), str)
            and isinstance(toks, list) and len(toks) > 0
            and all(type(t) is int and 0 <= t < vocab_size for t in toks)
            and isinstance(mask, list) and len(mask) == len(toks)
            and type(adv) in (int, float) and math.isfinite(adv))


def check_attribution_inputs(model, mode, checkpoints, train_samples, test_samples, enc):
    """find_critical_samples' mode, checkpoints and rows (their prompts as enc encodes them: the model's
    ids too), checked before any work."""
    if mode not in ("simple", "full", "memory_efficient"):
        raise UserError(f"mode must be 'simple', 'full' or 'memory_efficient', got {mode!r}")
    if isinstance(checkpoints, (str, dict)):  # one path's letters, one state dict's keys
        raise UserError(f"checkpoints: give a list (of paths or state dicts), not one {checkpoints!r:.60}")
    if not (checkpoints and train_samples and test_samples):
        what = "no checkpoints" if not checkpoints else "nothing"
        raise UserError(f"{what} to attribute over: give at least one checkpoint, one training rollout "
                        "and one test sample")
    vocab = model.config.vocab_size
    for name, rows in (("train_samples", train_samples), ("test_samples", test_samples)):
        i = next((i for i, s in enumerate(rows) if not is_row(s, vocab)), None)
        if i is not None:
            raise UserError(f"{name}[{i}] is not a rollout: give a dict of 'prompt' (text), "
                            f"'completion_tokens' (1+ ids below {vocab}), 'completion_mask' (as long) "
                            "and a finite 'advantage'")
        for i, s in enumerate(rows):  # laid out by rollout_batch: the prompt's ids, end-of-text as padding
            prompt = encode_prompt(enc, s["prompt"])
            outside = [t for t in prompt + [enc.eot_token] if not 0 <= t < vocab]
            if outside:
                raise UserError(f"{name}[{i}]: its prompt encodes to token id {outside[0]}, not below the "
                                f"model's vocabulary size {vocab}: give the tokenizer of the model's run")
            read = len(prompt) + len(s["completion_tokens"]) - 1  # the model reads all but the last id
            if read > model.config.block_size:
                raise UserError(f"{name}[{i}]: its prompt and completion are {read + 1} tokens, of which the "
                                f"model reads {read}, more than its context of {model.config.block_size}: "
                                "shorten it")


def check_attribution_knobs(model, n_checkpoints, counts, temperature, per_checkpoint, layer_filter):
    """find_critical_samples' counts {name: (value, least)}, temperature, per-checkpoint lists
    {name: list or None} and layer_filter, checked before any work."""
    for name, (n, least) in counts.items():  # n_probe (None: all), micro_batch, top_k
        if n is not None and (type(n) is not int or n < least):
            raise UserError(f"{name} must be an integer >= {least}, got {n!r}")
    if not temperature >= 0:  # NaN too
        raise UserError(f"temperature must be >= 0 (the run's; 0: greedy), got {temperature!r}")
    for name, per in per_checkpoint.items():
        if per is not None and len(per) != n_checkpoints:
            raise UserError(f"{n_checkpoints} checkpoints but {len(per)} {name}")
    layers = list(lora_modules(model))
    if layer_filter is not None and not any(layer_filter in n for n in layers):
        raise UserError(f"layer_filter {layer_filter!r} matches no LoRA layer ({layers[:4]} ...)")


def attribution_result(train_samples, contrib, cosine, selfinf, mode, weights, top_k):
    """find_critical_samples' result dictionary (Captum's TracIn documentation's, plus the weights w_t,
    oldest first). contrib, cosine, selfinf: (n,) float64 per checkpoint, none if not asked for."""
    scores = sum(contrib)  # TracInCP: the sum over checkpoints
    extra = {"cosine_score": sum(cosine), "self_influence": sum(selfinf)}  # 0: not asked for
    hidden = ("completion_tokens", "completion_mask")
    per_sample = []
    for i, s in enumerate(train_samples):
        shown = {k: v for k, v in s.items() if k not in hidden}
        asked = {k: v[i].item() for k, v in extra.items() if torch.is_tensor(v)}
        per_sample.append({**shown, "index": i, "tracin_score": scores[i].item(),
                           "checkpoint_contributions": [c[i].item() for c in contrib], **asked})
    by_size = sorted(per_sample, key=lambda e: -abs(e["tracin_score"]))
    positive, negative = extremes(per_sample, "tracin_score", top_k)
    return {"mode": mode,
            "num_checkpoints": len(weights),
            "checkpoint_weights": weights,
            "num_train_samples": len(per_sample),
            "critical_samples": by_size[:top_k],
            "scores": per_sample,
            "most_influential_positive": positive,
            "most_influential_negative": negative,
            "mean_influence_score": scores.mean().item(),
            "max_influence_score": scores.max().item()}


# ---------------------------------------------------------------------------------------------
# CLI: which training rollouts of a finished run helped or hurt the model's answer to a question?
defaults = dict(
    out_dir="out/tracin",      # a train_grpo.py run directory (ckpt_*.pt and rollouts.jsonl)
    question="",               # the test question
    questions_file="",         # or: a text file, one question per line (blank lines skipped); one report section each
    completion="",             # the answer text to attribute; empty: the final model's greedy answer
    mode="memory_efficient",   # 'simple' / 'full' / 'memory_efficient'
    audit=0,                   # N > 0: audit the first N test problems the final model answers wrongly (audit.py)
    audit_loss="wrong",        # the audit's test loss: 'wrong' (NLL of each wrong answer) or 'contrast' (minus
                               # the NLL of the reference solution: likelier wrong RELATIVE to right)
    n_probe=None,              # score n_probe rollouts with nonzero advantage, spread over the run (0: all);
                               # default: 512, or all when --audit is given
    top_k=5,
    layer_filter="",           # only LoRA layers whose name contains this ('' = all)
    normalize=True,            # also report cosine-normalised scores (rankings not dominated by gradient norm)
    self_influence=False,
    device="cpu",
    base_ckpt="",              # the run's base where it is now, if it moved ('' = where the run found it)
    out_json="",               # default: <out_dir>/tracin_<sha256(question + completion)[:12]>.json, one per answer
    html=None,                 # the HTML report; default (unset): <out_dir>/tracin_report.html; --html= : none
    figure=None,               # the slide figure (PNG, needs matplotlib); default: <out_dir>/tracin_influence.png
                               # when matplotlib is installed; --figure= : none
)


def load_rollouts(path, enc, vocab_size=None, block_size=None):
    """Every recorded rollout with nonzero advantage and a token its loss counted (zero advantage,
    or a mask of zeros: a truncated completion under mask_truncated_completions, give zero gradient
    and zero influence). A malformed line (e.g. cut off by a crash) or record (record_problem;
    vocab_size: the model's, default the tokenizer's) is skipped with a warning naming it; a
    rollout longer than the model's context (block_size) is refused, naming its line."""
    if not os.path.exists(path):
        raise UserError(f"no recorded rollouts at {path}: was this run made by train_grpo.py?")
    samples, stops, uncounted = [], stop_tokens(enc), 0  # uncounted: nonzero advantage, mask of zeros
    for line, r in read_records(path, min(vocab_size or enc.n_vocab, enc.n_vocab), numbered=True):
        G = len(r["rewards"]) // len(r["prompts"])
        for j, (toks, m) in enumerate(zip(r["completion_tokens"], r["completion_mask"])):
            n = sum(m)
            if r["advantages"][j] == 0 or n == 0:
                uncounted += n == 0 and r["advantages"][j] != 0
                continue
            if block_size:  # the whole rollout is one forward pass: it must fit the context
                prompt = encode_prompt(enc, r["prompts"][j // G])
                check_fits_block(path, line, r, prompt, n, block_size)
            samples.append({"iter": r["iter"], "prompt": r["prompts"][j // G], "answer": r["answers"][j // G],
                            "completion": enc.decode([t for t in toks[:n] if t not in stops]),
                            "reward": r["rewards"][j], "advantage": r["advantages"][j],
                            "completion_tokens": toks[:n], "completion_mask": m[:n],
                            **({"defective": r["defective"][j // G]} if "defective" in r else {}),  # planted
                            **({"selected": r["selected"][j]} if "selected" in r else {}),  # TracIn run: trained on
                            **({"skipped": True} if r.get("skipped") is True else {})})  # its step moved no weight
    if not samples and uncounted:  # the advantages are there; no completion token carries them
        raise UserError(f"{path}: none of its {uncounted} rollouts with a nonzero advantage counts a "
                        f"completion token (every such completion mask is zero): nothing to attribute")
    if not samples:
        raise UserError(f"{path} holds no rollout with a nonzero advantage: nothing to attribute")
    return samples


def check_fits_block(path, line, record, prompt, n, block_size):
    """A recorded rollout (prompt + its n completion tokens) the model's context cannot hold (its
    last token is only predicted, as in sampling: block_size + 1 tokens fit)."""
    if len(prompt) + n - 1 > block_size:
        where = f"{path} line {line}: a rollout of iter {record['iter']}"
        size = f"{len(prompt)} prompt + {n} completion tokens"
        raise UserError(f"{where} is {size}, beyond the model's context of {block_size}: a "
                        f"record edited by hand, or a base of a shorter context than the "
                        f"run's (--base_ckpt)")


def not_a_run(run):
    """Why a directory without ckpt_NNNNNN.pt cannot be attributed, and the command that makes one that can."""
    grpo = shlex.quote(unused_out_dir(os.path.join(os.path.dirname(os.path.normpath(run)), "grpo")))
    ckpt = os.path.join(run, "ckpt.pt")
    saved = load_checkpoint(ckpt) if os.path.isfile(ckpt) else {}
    if "model" in saved and "lora" not in saved:  # train_base.py's checkpoint
        return (f"{run} holds a base model (train_base.py), not a GRPO run: train a GRPO run on it with: python "
                f"train_grpo.py --base_ckpt={shlex.quote(ckpt)} --out_dir={grpo}, then attribute with --out_dir={grpo}")
    if "lora" in saved:
        return (f"{run} holds a GRPO run's ckpt.pt but no ckpt_NNNNNN.pt, the checkpoint history TracIn sums over "
                f"(deleted?): attribute a run that has it, or train a new one: python train_grpo.py --out_dir={grpo}")
    target = run if not run_files(run) else grpo  # a directory holding another run's files is refused
    return (f"no checkpoints ckpt_NNNNNN.pt in {run}: it is not a train_grpo.py run; make one with: python "
            f"train_grpo.py --out_dir={shlex.quote(target)}, then attribute with --out_dir={shlex.quote(target)}")


def read_questions(cfg):
    """The questions to attribute, each with where it came from ('--question', '<file> line N'): --question,
    or --questions_file's non-blank lines, or none (--audit alone: it picks its own); --audit may come with either."""
    if (cfg["question"] and cfg["questions_file"]) or not (cfg["question"] or cfg["questions_file"] or cfg["audit"]):
        raise UserError('give --question="Mia has 3 apples. ..." or --questions_file=PATH (one question per line), '
                        'or --audit=N (the first N wrong test answers), or --audit with one of the two questions '
                        'options: not both question options and not none')
    if cfg["completion"] and not cfg["question"]:
        raise UserError("--completion is the answer to --question: --audit and --questions_file attribute the "
                        "model's own greedy answers")
    if cfg["audit"] and cfg["out_json"] and (cfg["question"] or cfg["questions_file"]):
        raise UserError("--out_json names one file: with --audit and questions each goes to its default file "
                        "(<out_dir>/tracin_audit.json, <out_dir>/tracin_<hash>.json)")
    if not (cfg["question"] or cfg["questions_file"]):
        return []
    if not cfg["questions_file"]:
        return [("--question", cfg["question"])]
    if cfg["out_json"]:
        raise UserError("--out_json names one answer's file: with --questions_file each question's greedy answer "
                        "is attributed and written to <out_dir>/tracin_<hash>.json")
    path = cfg["questions_file"]
    if not os.path.isfile(path):
        raise UserError(f"questions_file {path} is not a file: give a text file with one question per line")
    try:
        with open(path, encoding="utf-8") as f:
            questions = [(f"questions_file {path} line {n}", line.strip()) for n, line in enumerate(f, 1)
                         if line.strip()]
    except UnicodeDecodeError as e:
        raise UserError(f"questions_file {path} is not UTF-8 text (byte {e.start}: {e.reason}): give a text file "
                        "with one question per line") from None
    if any("\x00" in q for _, q in questions):
        raise UserError(f"questions_file {path} holds NUL bytes (a binary file?): give a text file with one "
                        "question per line")
    if not questions:
        raise UserError(f"questions_file {path} holds no question (blank lines are skipped)")
    return questions


MARKS = (b"<title>TracIn attribution report", b"TracIn influence figure")  # report.py's page, plot.py's PNG


def written_here(path):
    """Whether the file at path is one analysis.attribute wrote (a report, a figure, an attribution or audit JSON)."""
    try:
        if has_mark(path, MARKS):
            return True
        with open(path, "rb") as f:
            saved = json.loads(f.read())
        return isinstance(saved, dict) and ("scores" in saved or "result" in saved)
    except (OSError, ValueError):
        return False


def check_output_path(cfg, key, suffix, named=True):
    """An output path: the right suffix (never a run's own file), a directory that exists and takes a file,
    and, where the path was named on the command line, no file there but one analysis.attribute wrote."""
    path = cfg[key]
    check(cfg, key, not path or path.endswith(suffix), f"must end in {suffix} (it is written, so never a run's "
          "own file)")
    # a default path (not named) is this run's own: replaced, as this command replaces what it wrote
    if path:
        check_new_file(path, key, written_here if named else lambda p: True, "analysis.attribute")


def check_fits(cfg, model, enc, questions):
    """Every question (and --completion) fits the context with at least one answer token and the end-of-text
    token the test loss adds, checked before anything is attributed or written; the first that does not is
    named by where it came from."""
    completion = len(encode_text(enc, cfg["completion"])) if cfg["completion"] else 1
    room = model.config.block_size - 1 - completion
    if room < 1:  # no question could fit: the answer is what is too long
        raise UserError(f"--completion is {completion} tokens: with end-of-text and a question of at least "
                        f"one token it must fit the model's context of {model.config.block_size}; shorten it")
    for where, question in questions:
        n = len(encode_prompt(enc, question))
        if n > room:
            raise UserError(f"{where}: the question is {n} tokens; the model's context of {model.config.block_size} "
                            f"holds at most {room} with {'--completion' if cfg['completion'] else 'an answer token'}"
                            " and end-of-text: shorten it (or split it over several lines)")


def attribute(cfg, model, enc, ckpts, iters, train, temperature, question):
    """One question's attribution: the answer (--completion, or the final model's greedy one) scored
    against every probed rollout; returns find_critical_samples' dict with the question and answer."""
    prompt = encode_prompt(enc, question)
    if cfg["completion"]:
        completion = encode_text(enc, cfg["completion"])
    else:  # the final model's own greedy answer
        room = model.config.block_size - len(prompt) - 1  # the end-of-text token the test loss adds takes one
        if room < 1:
            raise UserError(f"question of {len(prompt)} tokens does not fit the context of "
                            f"{model.config.block_size}")
        completion = greedy_answers(model, enc, [prompt], 64)[0]
    if len(prompt) + len(completion) + 1 > model.config.block_size:
        raise UserError(f"question + completion ({len(prompt) + len(completion) + 1} tokens) exceed the "
                        f"context of {model.config.block_size}")
    test = [nll_row(enc, question, completion)]  # A = +1: the test loss is the answer's NLL
    train = trained_rollouts(train)  # those that moved a weight, as the audit scores
    print(f"attributing {enc.decode(completion)!r} over {len(ckpts)} checkpoints (iters {iters[0]}-{iters[-1]})"
          f" and {min(len(train), cfg['n_probe'] or len(train))} of {len(train)} rollouts ({cfg['mode']}, "
          f"temperature {temperature})")
    res = find_critical_samples(model, ckpts, train, test, enc, mode=cfg["mode"],
                                layer_filter=cfg["layer_filter"] or None, n_probe=cfg["n_probe"] or None,
                                top_k=cfg["top_k"], temperature=temperature, normalize=cfg["normalize"],
                                self_influence=cfg["self_influence"], load=load_checkpoint)
    res.update(question=question, completion=enc.decode(completion))
    return res


def output_paths(cfg, run):
    """(json, html, figure) paths, checked before any work: the defaults live in the run directory, '' = none.
    The figure's default is written only where matplotlib is installed; a figure asked for by name needs it."""
    check_output_path(cfg, "out_json", ".json")
    for key, suffix in (("html", ".html"), ("figure", ".png")):
        check(cfg, key, cfg[key] is None or isinstance(cfg[key], str), f"must be a path ending in {suffix} ('': none)")
    html_path = os.path.join(run, "tracin_report.html") if cfg["html"] is None else cfg["html"]
    check_output_path({**cfg, "html": html_path}, "html", ".html", named=cfg["html"] is not None)
    fig_path = os.path.join(run, "tracin_influence.png") if cfg["figure"] is None else cfg["figure"]
    check_output_path({**cfg, "figure": fig_path}, "figure", ".png", named=cfg["figure"] is not None)
    if fig_path and not has_matplotlib():
        if cfg["figure"]:
            raise UserError(f"--figure={fig_path} needs matplotlib: pip install matplotlib (or --figure= for none)")
        print("note: matplotlib is not installed, so no figure (pip install matplotlib)")
        fig_path = ""
    return os.path.join(run, "tracin_audit.json") if cfg["audit"] and not cfg["out_json"] else cfg["out_json"], \
        html_path, fig_path


def print_top(res, score="TracIn score; positive = lowered this answer's loss", key="tracin_score",
              titles=("most helpful training rollouts", "most harmful training rollouts")):
    for title, side in zip(titles, (res["most_influential_positive"], res["most_influential_negative"])):
        print(f"--- {title} ({score})")
        for e in side:
            print(f"{e[key]:+.3e} | iter {e['iter']} | reward {e['reward']:.2f} | "
                  f"{e['prompt'][:60]}... -> {e['completion']!r}")


def audit(model, enc, checkpoints, iters, train, examples, n, task, max_new_tokens, loss="wrong", **kw):
    """The audit of a finished run (analysis/audit.py's docstring): the first n wrong greedy answers of the final model
    (loaded in `model`) among `examples`, every trained rollout's influence summed over them (one
    find_critical_samples call; kw: its knobs), and, where a defect was planted, how well that ranking and
    the self-influence find the defective-rewarded rollouts. Returns a JSON-ready dict."""
    wrong, answered = find_wrong(model, enc, examples, n, task, max_new_tokens)
    if not wrong:
        raise UserError(f"the final model answers all {answered} test problems right: nothing to audit")
    train = trained_rollouts(train)
    res = find_critical_samples(model, checkpoints, train, audit_tests(enc, wrong, loss), enc,
                                load=load_checkpoint, **kw)
    labels = defect_targets(res["scores"])  # each entry carries its rollout's flag and advantage
    lead, likelier, opposed = leading(res["scores"], kw.get("top_k", 5))
    return {"audit": n, "loss": loss, "iters": list(iters), "n_answered": answered, "n_scored": res["num_train_samples"],
            "wrong": [{k: w[k] for k in ("question", "answer", "completion")} for w in wrong],
            "targets": TARGETS if labels is not None else None, "detection": detection_table(res, labels),
            "lead": {"key": lead, "most_influential_positive": likelier, "most_influential_negative": opposed},
            "result": res}


def run_audit(cfg, model, enc, data_dir, run_cfg, ckpts, iters, train, temperature, json_path):
    """--audit=N (analysis/audit.py): the first N wrong greedy test answers, every trained rollout ranked by its summed
    influence on them, and where a defect was planted, how well that ranking finds the defective-rewarded ones."""
    task = run_cfg.get("task", "arith")
    print(f"audit: answering the {task} test split greedily until {cfg['audit']} answers are wrong")
    a = audit(model, enc, ckpts, iters, train, load_task_split(data_dir, "test"), cfg["audit"], task,
              run_cfg.get("max_new_tokens", 64), cfg["audit_loss"], mode=cfg["mode"],
              layer_filter=cfg["layer_filter"] or None, n_probe=cfg["n_probe"] or None, top_k=cfg["top_k"],
              temperature=temperature, normalize=cfg["normalize"], self_influence=True)
    lead = a["lead"]  # the cosine where it was computed (analysis/audit.RANKINGS)
    score = "summed cosine" if lead["key"] == "cosine_score" else "summed TracIn score"
    titles = ("training rollouts that made the wrong answers likelier most", "training rollouts that opposed them most")
    print_top(lead, f"{score}; positive = made the wrong answers likelier", lead["key"], titles)
    print("\n".join(summary_lines(a)))
    write_json(json_path, a, "it" if cfg["out_json"] else "an earlier audit")
    return a


def main(argv):
    cfg = configure(defaults, argv)
    check_choice(cfg, "mode", ("simple", "full", "memory_efficient"))
    check(cfg, "audit", cfg["audit"] >= 0, "must be >= 0 (N > 0: audit the first N wrong test answers; 0: off)")
    check_choice(cfg, "audit_loss", LOSSES)
    check(cfg, "n_probe", cfg["n_probe"] is None or (type(cfg["n_probe"]) is int and cfg["n_probe"] >= 0),
          "must be an integer >= 0 (0: every rollout)")
    cfg["n_probe"] = (0 if cfg["audit"] else 512) if cfg["n_probe"] is None else cfg["n_probe"]
    check(cfg, "top_k", cfg["top_k"] >= 1, "must be >= 1")
    check(cfg, "out_dir", cfg["out_dir"] != "", "give the run directory of a train_grpo.py run")
    questions = read_questions(cfg)
    check_device(cfg["device"])  # float32
    run = cfg["out_dir"]
    if not os.path.isdir(run):
        raise UserError(f"{run} is not a directory: give the --out_dir of a train_grpo.py run")
    json_path, html_path, fig_path = output_paths(cfg, run)
    ckpts = sorted((int(m.group(1)), p) for p in glob.glob(os.path.join(run, "ckpt_*.pt"))
                   if (m := re.fullmatch(r"ckpt_(\d+)\.pt", os.path.basename(p))))
    if not ckpts:
        raise UserError(not_a_run(run))
    sections, audited = [], None
    folder = lambda p: os.path.dirname(os.path.abspath(p))  # noqa: E731
    in_run = [p for p in (json_path, html_path, fig_path) if p and folder(p) == os.path.abspath(run)]
    writes_run = bool(in_run) or bool(questions and not cfg["out_json"])  # a question's JSON: there
    with reader_lock(run, writes_run):  # a training run (or another attribution) here is refused
        iters, ckpts = [s for s, _ in ckpts], [p for _, p in ckpts]
        model, enc, data_dir = load_policy(ckpts[-1], cfg["device"], base_ckpt=cfg["base_ckpt"])
        check_fits(cfg, model, enc, questions)  # before the audit's or any question's output is written
        run_cfg = load_checkpoint(ckpts[-1]).get("config", {})
        temperature = run_cfg.get("temperature", 1.0)
        temperature = temperature if temperature > 0 else 1.0  # greedy sampling: plain log-probs
        train = load_rollouts(os.path.join(run, "rollouts.jsonl"), enc, model.config.vocab_size,
                              model.config.block_size)
        if cfg["audit"]:
            audited = run_audit(cfg, model, enc, data_dir, run_cfg, ckpts, iters, train, temperature, json_path)
        for _, question in questions:
            res = attribute(cfg, model, enc, ckpts, iters, train, temperature, question)
            # one file per question and answer: attributing another question never overwrites this one
            digest = hashlib.sha256((res["question"] + res["completion"]).encode()).hexdigest()[:12]
            print_top(res)
            path = cfg["out_json"] or os.path.join(run, f"tracin_{digest}.json")
            write_json(path, res, "it" if cfg["out_json"] else "an earlier attribution of the same question and answer")
            # the answer's correctness is unknown here: a free-form question carries no reference answer
            sections.append({"question": question, "completion": res["completion"], "correct": None, "result": res})
        again = {p: os.path.exists(p) for p in (html_path, fig_path) if p}
        if html_path:
            write_report(html_path, sections, {"run": run, "mode": cfg["mode"], "n_probe": cfg["n_probe"],
                                               "layer_filter": cfg["layer_filter"], "top_k": cfg["top_k"],
                                               "checkpoints": [os.path.basename(c) for c in ckpts]},
                         audited, ours=written_here if cfg["html"] is not None else lambda p: True)
            print(f"HTML report{' of the audit and' if audited else ' of'} {len(sections)} question(s): {html_path}"
                  + (" (replacing the earlier one)" if again[html_path] else ""))
        if fig_path:
            results = [audited["result"]] if audited else [s["result"] for s in sections]
            title = (f"summed influence on the final model's {len(audited['wrong'])} wrong test answers" if audited
                     else f"influence on {questions[0][1]!r}" if len(questions) == 1 else
                     f"influence summed over {len(questions)} questions")
            # the default: the run's own
            ours = written_here if cfg["figure"] is not None else lambda p: True
            print(f"influence figure: {plot_influence(results, fig_path, title, ours=ours)}"
                  + (" (replacing the earlier one)" if again[fig_path] else ""))


if __name__ == "__main__":
    cli_main(main)

