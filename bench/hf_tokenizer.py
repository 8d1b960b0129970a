"""
A small byte-level BPE tokenizer as a family ships it (GPT-2's regex, or Qwen2's with ChatML), trained in
memory by tokenizers on a made-up corpus and saved by transformers: for the 1.5B-shaped bench directory
(bench/qwen_dir.py) and the tests' tiny Hugging Face directories. transformers and tokenizers are
references here, never imported by the project's code; nothing is downloaded.
"""
import torch

QWEN_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = "Mia Sam Ava Leo has had gets gives buys apples pears cards coins books How many now does left total".split()


def corpus(n=400):
    g = torch.Generator().manual_seed(0)
    lines = []
    for i in range(n):
        w = [WORDS[int(j)] for j in torch.randint(len(WORDS), (6,), generator=g)]
        a, b = (int(x) for x in torch.randint(1, 99, (2,), generator=g))
        lines.append(f"{w[0]} {w[2]} {a} {w[5]}. {w[1]} {w[3]} {b} more? {a}+{b}={a + b}\n#### {a + b}")
    return lines


def make_tokenizer(path, family, vocab=400):
    """A byte-level BPE as the family ships it: GPT-2's regex, or Qwen2's Split regex + NFC with
    <|im_start|> / <|im_end|> and a ChatML template. Returns the PreTrainedTokenizerFast."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    chat = family != "gpt2"
    if chat:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if chat else ["<|endoftext|>"]
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    if chat:
        fast.chat_template = CHATML
    fast.save_pretrained(path)
    return fast
