"""
Batched KV-cache sampling: GRPO's pass 1. Returns token ids and a completion mask, never logits.

    python sample.py --ckpt=out/base/ckpt.pt --question="Mia has 3 apples. ..." --num_samples=4
    python sample.py --ckpt=out/grpo/ckpt.pt          # a GRPO run: LoRA applied on its base model
    python sample.py --ckpt=models/qwen2.5-0.5b-instruct --temperature=0 \
        --start="The capital of France"               # a Hugging Face directory; --start: raw text

Layout of a batch (prompts of different lengths are left-padded, so every completion starts at
the same column P and the cache advances one column per step for all rows):

    row 0:  [pad pad q q q q | c c c EOT pad]
    row 1:  [q q q q q q     | c c c c   c  ]
             pad_left = (2, 0)      completion_mask = (1 1 1 1 0), (1 1 1 1 1)
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, check, check_finite, check_positive, configure, cli_main
import torch

from data.datadir import load_split
from data.tasks import task_data
from runs.loading import load_policy, nonfinite_weight
from scale.device import check_device


def encode_text(enc, text):
    """Token ids of any text. A string that spells a special token ("<|endoftext|>") is encoded as
    the plain characters it is, never as the special token: a question cannot end its own prompt."""
    return enc.encode(text, disallowed_special=())


# an instruct model's user turn asks for the format in words (the tiny GPT learned it from examples)
CHAT_INSTRUCTION = "\nWrite one equation per line, then the answer on a last line as '#### N'."


def encode_prompt(enc, question):
    """The prompt's ids; an instruct model's tokenizer (`chat` set) makes the question and
    CHAT_INSTRUCTION (or enc.instruction: data/tasks.py) the user turn, then the assistant's
    header."""
    if getattr(enc, "chat", None):
        return enc.encode_chat(question + getattr(enc, "instruction", CHAT_INSTRUCTION))
    return encode_text(enc, question + "\n")  # the tiny GPT's format (data/gsm_synth: prompt_text)


class NonFiniteLogits(FloatingPointError):
    """The model produced NaN/Inf logits while sampling: its weights have diverged."""


def pad_prompts(prompts, pad_id, device):
    """Left-pad token lists into one (B, P) tensor; returns (idx, pad_left)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("every prompt must have at least one token (got an empty prompt)")
    P = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        idx[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
    pad_left = torch.tensor([P - len(p) for p in prompts], dtype=torch.long)
    return idx.to(device), pad_left.to(device)


# the smallest temperature > 0 taken: logits / temperature, and the log-probs' gradients that
# carry 1 / temperature, must stay far inside float32 (3.4e38); below it sampling is greedy anyway
MIN_TEMPERATURE = 1e-4


def sample_next(logits, temperature, top_k, top_p, generator, u=None):
    """logits (N, V) of the last position only -> next token ids (N,), by inverse CDF from ONE
    uniform u_i per row (from `generator` unless given): the first token whose cumulative
    probability exceeds u_i. A row depends on its u_i only: processes sample as one process."""
    if temperature == 0:
        return logits.argmax(dim=-1)                      # greedy
    logits = logits.float() / temperature                 # float32 under bf16 (see scale/device.py)
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:                 # nucleus: smallest set with mass >= top_p
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p   # tokens entirely beyond the nucleus
        drop[:, 0] = False                                # the likeliest token stays, for any top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    cdf = logits.softmax(dim=-1).cumsum(-1)
    if u is None:
        u = torch.rand(cdf.size(0), generator=generator, device=cdf.device)
    nxt = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return nxt.clamp_(max=cdf.size(-1) - 1)  # right=True never lands on a zero-probability token


@torch.no_grad()  # pass 1 needs no graph: no activations are stored for backward
def generate(model, prompts, max_new_tokens, eot_id, num_samples=1, temperature=1.0,
             top_k=None, top_p=None, seed=None, generator=None, check_every=None, vocab_size=None,
             u=None, decode=None):
    """prompts: token-id lists, `num_samples` completions each; eot_id: the end id or a tuple (the
    first pads); ids >= vocab_size are never drawn. -> (idx (N, P + T), pad_left (N,), completion
    mask (N, T), 1 up to and including end-of-text), N = B * num_samples, laid out as the module
    docstring shows; only the last position's logits (N, V) ever exist, none are returned. u
    (max_new_tokens, N): a uniform per row and step (sample_next). decode: compile's one-column
    step (scale/compiled.CompiledDecode), None: the model's forward with the cache."""
    device = next(model.parameters()).device
    eot_ids = eot_id if isinstance(eot_id, (tuple, list)) else [eot_id]
    stops = torch.tensor(eot_ids, device=device, dtype=torch.long)
    eot_id = int(stops[0]) if len(stops) else 0  # the padding id; () = nothing stops a row
    check_every = check_every or (8 if device.type == "cuda" else 1)  # see "all rows done?" below
    idx, pad_left = pad_prompts(prompts, eot_id, device)
    (B, P), N = idx.shape, len(prompts) * num_samples
    L = P + max_new_tokens  # the cache's columns
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if L > model.config.block_size:
        raise UserError(f"prompt of {P} tokens + max_new_tokens={max_new_tokens} exceeds the "
                        f"context of {model.config.block_size} tokens; shorten either")
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    if u is None and temperature > 0:
        u = torch.rand(max_new_tokens, N, generator=generator, device=device)  # (S, N)
    if u is not None and tuple(u.shape) != (max_new_tokens, N):
        raise ValueError(f"u must be (max_new_tokens, rows) = ({max_new_tokens}, {N}), "
                         f"got {tuple(u.shape)}")
    was_training = model.training
    model.eval()
    cache = model.new_cache(B, decode.cache_len(L) if decode else L, pad_left)  # compiled: bucketed
    logits, _ = model(idx, cache=cache)                   # prefill once per prompt: (B, 1, V)
    cache.repeat_interleave(num_samples)                  # share the prefill among the samples
    logits = logits[:, -1].repeat_interleave(num_samples, dim=0)   # (N, V)
    out = torch.full((N, max_new_tokens), eot_id, dtype=torch.long, device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    nonfinite = torch.zeros(N, dtype=torch.bool, device=device)
    for t in range(max_new_tokens):
        nonfinite |= ~torch.isfinite(logits).all(-1)  # NaN/Inf: no host sync; raised at the end
        u_t = None if u is None else u[t]
        nxt = sample_next(logits[:, :vocab_size], temperature, top_k, top_p, generator, u_t)
        del logits                                        # the only logits alive, kept by nothing
        nxt = nxt.masked_fill(done, eot_id)               # finished rows only emit padding
        out[:, t] = nxt
        done |= torch.isin(nxt, stops)
        # all rows done? bool() waits for the device: on a GPU, asking every step would stall the
        # kernel queue once per token, so there we ask every 8 steps (at most 7 wasted at the end)
        if t + 1 == max_new_tokens or (t % check_every == check_every - 1 and bool(done.all())):
            break
        # one new column for every row: the model's forward, or the compiled step (same arithmetic)
        logits = decode(nxt[:, None], cache) if decode else model(nxt[:, None], cache=cache)[0]
        logits = logits[:, -1]
    model.train(was_training)
    if bool(nonfinite.any()):
        raise NonFiniteLogits(f"NaN/Inf logits in {int(nonfinite.sum())} of {N} sampled rows")
    # mask: 1 up to and including the first end-of-text of each row
    is_eot = torch.isin(out[:, :t + 1], stops).long()
    mask = ((is_eot.cumsum(1) - is_eot) == 0).long()      # 0 strictly after the first EOT
    T = int(mask.sum(0).nonzero().max()) + 1              # drop columns no row reached, all padding
    return torch.cat([idx.repeat_interleave(num_samples, dim=0), out[:, :T]], dim=1), \
        pad_left.repeat_interleave(num_samples), mask[:, :T]


def stop_tokens(enc):
    """The ids that end a completion: a Hugging Face tokenizer's end-of-sequence ids (maybe none,
    see pretrained/tokenizer.py), else end-of-text."""
    return tuple(getattr(enc, "stop_tokens", (enc.eot_token,)))


def decode_completions(enc, idx, mask):
    """Text of each completion, end-of-text and padding removed. idx: (N, P+T), mask: (N, T)."""
    T, stops = mask.size(1), stop_tokens(enc)
    texts = []
    for row, m in zip(idx[:, -T:].tolist(), mask.tolist()):
        toks = [t for t, keep in zip(row, m) if keep and t not in stops]
        texts.append(enc.decode(toks))
    return texts


# -----------------------------------------------------------------------------
# CLI: sample from a base checkpoint or a GRPO run (LoRA weights applied on their base model)
defaults = dict(
    ckpt="out/base/ckpt.pt",  # base checkpoint, a GRPO checkpoint (holds lora + base_ckpt), or a
                              # Hugging Face model directory (config.json, *.safetensors, tokenizer)
    question="",              # empty: use the first questions of the test split
    start="",                 # raw text to continue (nanoGPT's knob): no chat or task formatting
    num_questions=3,
    num_samples=2,
    max_new_tokens=48,
    temperature=0.8,
    top_k=0,                  # 0 = off
    top_p=1.0,
    seed=1337,
    device="cpu",
    base_ckpt="",             # a GRPO checkpoint's base where it is now, if it moved
                              # ('' = where the run found it)
)


def main(argv):
    cfg = configure(defaults, argv)
    check(cfg, "ckpt", cfg["ckpt"] != "", "give a checkpoint, e.g. --ckpt=out/grpo/ckpt.pt")
    check_finite(cfg)  # no NaN / Inf temperature, a seed torch.manual_seed takes
    check_positive(cfg, "num_questions", "num_samples", "max_new_tokens")
    check(cfg, "temperature", cfg["temperature"] == 0 or cfg["temperature"] >= MIN_TEMPERATURE,
          f"must be 0 (greedy) or >= {MIN_TEMPERATURE}: logits / temperature overflows below it")
    check(cfg, "top_k", cfg["top_k"] >= 0, "must be >= 0 (0 = off)")
    check(cfg, "top_p", 0 < cfg["top_p"] <= 1, "must be in (0, 1] (1 = off)")
    check_device(cfg["device"])  # float32
    check(cfg, "start", not (cfg["start"] and cfg["question"]),
          "give --start (raw text) or --question, not both")
    model, enc, data_dir = load_policy(cfg["ckpt"], cfg["device"], merge=True,
                                       base_ckpt=cfg["base_ckpt"])
    bad = nonfinite_weight(model)
    if bad is not None:  # every logit would be NaN: say which weight, not a traceback from sampling
        raise UserError(f"{cfg['ckpt']}: weight {bad} holds NaN/Inf, "
                        "so the model cannot be sampled: "
                        "use a copy of the model whose weights are finite "
                        "(for a GRPO run: an earlier ckpt_NNNNNN.pt)")
    if cfg["start"]:  # raw text, special tokens written in it included, continued as it is
        prompts, questions = [enc.encode(cfg["start"], allowed_special="all")], [cfg["start"]]
    else:
        if cfg["question"]:
            questions = [cfg["question"]]
        else:
            test = load_split(task_data("arith", data_dir), "test")
            questions = [e["question"] for e in test[:cfg["num_questions"]]]
        prompts = [encode_prompt(enc, q) for q in questions]
    try:
        idx, _, mask = generate(model, prompts, cfg["max_new_tokens"], stop_tokens(enc),
                                cfg["num_samples"], cfg["temperature"], cfg["top_k"] or None,
                                cfg["top_p"], seed=cfg["seed"], vocab_size=enc.n_vocab)
    except NonFiniteLogits as e:  # finite weights whose activations overflow
        raise UserError(f"{cfg['ckpt']}: {e}, from finite weights (activations that overflow): "
                        "use a model whose weights have not diverged") from None
    if cfg["start"]:  # nanoGPT's output: the text and its continuation, decoded together
        stops = stop_tokens(enc)
        for i in range(cfg["num_samples"]):
            completion = zip(idx[i, -mask.size(1):].tolist(), mask[i].tolist())
            print(enc.decode(prompts[0] + [t for t, m in completion if m and t not in stops]))
            print("---------------")
        return
    texts = decode_completions(enc, idx, mask)
    for i, q in enumerate(questions):
        print(f"--- {q}")
        for s in range(cfg["num_samples"]):
            print(texts[i * cfg["num_samples"] + s].replace("\n", " | "))


if __name__ == "__main__":
    cli_main(main)
