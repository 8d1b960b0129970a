"""
Sample from a model on the command line, as nanoGPT's sample.py:
a base checkpoint, a GRPO run (its adapter on its base, folded in)
or a Hugging Face directory. The sampling itself is model.generate
(GRPO's pass 1); the prompt format is data/prompts.py.

    python sample.py --ckpt=out/base/ckpt.pt --num_samples=4 \
        --question="Mia has 3 apples. ..."
    # a GRPO run: LoRA applied on its base model
    python sample.py --ckpt=out/grpo/ckpt.pt
    # a Hugging Face directory; --start: raw text
    python sample.py --ckpt=models/qwen2.5-0.5b-instruct --temperature=0 \
        --start="The capital of France"
"""
# configurator first: a Ctrl-C during the slow imports below (torch)
# is one line, not a traceback
from configurator import (UserError, check, check_finite, check_positive,
                          configure, cli_main, quiet_start)
quiet_start(__name__)

from data.datadir import load_split
from data.prompts import encode_prompt, decode_completions, stop_tokens
from data.tasks import task_data
from model import MIN_TEMPERATURE, NonFiniteLogits, Sampling, generate, uniforms
from runs.loading import load_policy, nonfinite_weight
from scale.device import check_device


# -----------------------------------------------------------------------------
# CLI: sample from a base checkpoint or a GRPO run
# (LoRA weights applied on their base model)
defaults = dict(
    # a base checkpoint, a GRPO checkpoint (holds lora + base_ckpt), or a
    # Hugging Face model directory (config.json, *.safetensors, tokenizer)
    ckpt="out/base/ckpt.pt",
    question="",  # empty: use the first questions of the test split
    # raw text to continue (nanoGPT's knob): no chat or task formatting
    start="",
    num_questions=3,
    num_samples=2,
    max_new_tokens=48,
    temperature=0.8,
    top_k=0,  # 0 = off
    top_p=1.0,
    seed=1337,
    device="cpu",
    # a GRPO checkpoint's base where it is now, if it moved
    # ('' = where the run found it)
    base_ckpt="",
)


def main(argv):
    cfg = configure(defaults, argv)
    check(cfg, "ckpt", cfg["ckpt"] != "",
          "give a checkpoint, e.g. --ckpt=out/grpo/ckpt.pt")
    # no NaN / Inf temperature, a seed torch.manual_seed takes
    check_finite(cfg)
    check_positive(cfg, "num_questions", "num_samples", "max_new_tokens")
    temperature = cfg["temperature"]
    check(cfg, "temperature", temperature == 0 or temperature >= MIN_TEMPERATURE,
          f"must be 0 (greedy) or >= {MIN_TEMPERATURE}: "
          "logits / temperature overflows below it")
    check(cfg, "top_k", cfg["top_k"] >= 0, "must be >= 0 (0 = off)")
    check(cfg, "top_p", 0 < cfg["top_p"] <= 1, "must be in (0, 1] (1 = off)")
    check_device(cfg["device"])  # float32
    check(cfg, "start", not (cfg["start"] and cfg["question"]),
          "give --start (raw text) or --question, not both")
    model, enc, data_dir = load_policy(cfg["ckpt"], cfg["device"],
                                       merge=True,
                                       base_ckpt=cfg["base_ckpt"])
    bad = nonfinite_weight(model)
    # every logit would be NaN: say which weight,
    # not a traceback from sampling
    if bad is not None:
        raise UserError(f"{cfg['ckpt']}: weight {bad} holds NaN/Inf, "
                        "so the model cannot be sampled: "
                        "use a copy of the model whose weights are finite "
                        "(for a GRPO run: an earlier ckpt_NNNNNN.pt)")
    # raw text, special tokens written in it included, continued as it is
    if cfg["start"]:
        prompts = [enc.encode(cfg["start"], allowed_special="all")]
        questions = [cfg["start"]]
    else:
        if cfg["question"]:
            questions = [cfg["question"]]
        else:
            test = load_split(task_data("arith", data_dir), "test")
            questions = [e["question"] for e in test[:cfg["num_questions"]]]
        prompts = [encode_prompt(enc, q) for q in questions]
    # the prompt and its completion share the context (the KV cache's columns)
    longest, block = max(len(p) for p in prompts), model.config.block_size
    if longest + cfg["max_new_tokens"] > block:
        raise UserError(f"prompt of {longest} tokens + max_new_tokens={cfg['max_new_tokens']} "
                        f"exceeds the context of {block} tokens; shorten either")
    try:
        sampling = Sampling(temperature=cfg["temperature"], top_k=cfg["top_k"] or None,
                            top_p=cfg["top_p"], vocab_size=enc.n_vocab)
        rows = len(prompts) * cfg["num_samples"]
        u = uniforms(cfg["max_new_tokens"], rows, cfg["seed"], cfg["device"])
        idx, _, mask = generate(model, prompts, cfg["max_new_tokens"], stop_tokens(enc),
                                num_samples=cfg["num_samples"], sampling=sampling, u=u)
    except NonFiniteLogits as e:  # finite weights whose activations overflow
        raise UserError(f"{cfg['ckpt']}: {e}, from finite weights "
                        "(activations that overflow): "
                        "use a model whose weights have not diverged") from None
    # nanoGPT's output: the text and its continuation, decoded together
    if cfg["start"]:
        stops = stop_tokens(enc)
        T = mask.size(1)
        for i in range(cfg["num_samples"]):
            completion = zip(idx[i, -T:].tolist(), mask[i].tolist())
            kept = [t for t, m in completion if m and t not in stops]
            print(enc.decode(prompts[0] + kept))
            print("---------------")
        return
    texts = decode_completions(enc, idx, mask)
    for i, q in enumerate(questions):
        print(f"--- {q}")
        for s in range(cfg["num_samples"]):
            print(texts[i * cfg["num_samples"] + s].replace("\n", " | "))


if __name__ == "__main__":
    cli_main(main)
