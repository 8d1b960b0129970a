"""
What a Countdown model's greedy answers get wrong: the first N test problems answered greedily by a
base (train_base.py's ckpt.pt) or a GRPO run's adapter on its base, each answer put in one kind:

    correct                             the exact verifier (rewards.countdown_reward) accepts it
    invented hit                        refused, but its last equation claims the target (what
                                        rewards.countdown_claim_reward pays: a hack)
    a wrong equation                    refused, some `a op b=c` of its <think> is false
    every equation right, answer wrong  refused with right arithmetic: the search stopped at a miss,
                                        or the answer does not copy the try

    python -m analysis.answers CKPT [--n=200]

Also the share of all the <think>'s equations that are false (rewards.think_steps).
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, cli_main, quiet_start
quiet_start(__name__)

import torch

from analysis.plot import split_args
from data.tasks import load_task_split
from runs.checkpoint import load_checkpoint
from rewards import countdown_claim_reward, countdown_reward, think_steps
from runs.loading import load_base, load_policy
from data.prompts import decode_completions, encode_prompt, stop_tokens
from model import Sampling, generate

KINDS = ("correct", "invented hit", "a wrong equation", "every equation right, answer wrong")


def kind(text, answer):
    """(the answer's kind, equations in its <think>, of which false)."""
    found = think_steps(text)  # True / False per equation
    false = found.count(False)
    if countdown_reward(text, answer) == 1.0:
        return KINDS[0], len(found), false
    if countdown_claim_reward(text, answer) == 1.0:
        return KINDS[1], len(found), false
    return KINDS[2] if false else KINDS[3], len(found), false


def main(argv):
    paths, opts = split_args(argv, {"n": "200"}, "analysis.answers takes CKPT and --n=N")
    if len(paths) != 1 or not opts["n"].isdecimal() or int(opts["n"]) < 1:
        raise UserError("usage: python -m analysis.answers CKPT [--n=200] (a Countdown base's "
                        "ckpt.pt or a GRPO run's; N >= 1 test problems)")
    ckpt = load_checkpoint(paths[0])
    if "lora" in ckpt:  # a GRPO run: its adapter on its base
        model, enc, data_dir = load_policy(paths[0])
    else:
        model, enc, data_dir = load_base(paths[0], ckpt=ckpt)
    if ckpt.get("config", {}).get("task") != "countdown":
        raise UserError(f"{paths[0]} was not trained on task='countdown'")
    model.eval()
    rows = load_task_split(data_dir, "test")[:int(opts["n"])]
    counts, equations, false = dict.fromkeys(KINDS, 0), 0, 0
    for i in range(0, len(rows), 50):
        chunk = rows[i:i + 50]
        with torch.no_grad():
            idx, _, mask = generate(model, [encode_prompt(enc, r["question"]) for r in chunk],
                                    ckpt.get("config", {}).get("max_new_tokens", 112),
                                    stop_tokens(enc), sampling=Sampling(temperature=0, vocab_size=enc.n_vocab))
        for text, r in zip(decode_completions(enc, idx, mask), chunk):
            k, n_eq, n_false = kind(text, r["answer"])
            counts[k], equations, false = counts[k] + 1, equations + n_eq, false + n_false
    print(f"{paths[0]}: {len(rows)} test problems, greedy")
    for k, c in counts.items():
        print(f"  {k:36s} {100 * c / len(rows):5.1f} %")
    print(f"  false equations: {false} of {equations} ({100 * false / max(equations, 1):.1f} %)")


if __name__ == "__main__":
    cli_main(main)
