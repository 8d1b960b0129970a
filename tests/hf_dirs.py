"""Tiny random Hugging Face model directories for the tests, written by the independent references
themselves (transformers' save_pretrained, a BPE trained by tokenizers) into a temporary directory:
nothing is downloaded. make_dir(path, family, ...) -> the transformers model (eval, float32)."""
import json

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


def make_dir(path, family, tied=True, pad_rows=16, kv_heads=2, rope_theta=10000.0, shard=False, scale=0.1,
             positions=1024):
    """A random 2-layer, 64-wide model of `family` ('gpt2', 'qwen2', 'llama') with its tokenizer,
    embedding rows padded beyond the tokenizer's vocabulary; weights perturbed by `scale` (biases
    nonzero, logits far from uniform). Returns (transformers model, tokenizer)."""
    from transformers import (GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)
    tok = make_tokenizer(path, family)
    V = len(tok) + pad_rows
    torch.manual_seed(0)  # the constructor's random init too: the same model whatever ran before
    eot, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    if family == "gpt2":  # GPT2Config's own eos id (50256) lies beyond this vocabulary: nothing stops generate
        model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=128))
        eos = model.config.eos_token_id
    else:
        kw = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=kv_heads, max_position_embeddings=positions, rope_theta=rope_theta,
                  tie_word_embeddings=tied, eos_token_id=eot, bos_token_id=None)
        model = (Qwen2ForCausalLM(Qwen2Config(**kw)) if family == "qwen2" else LlamaForCausalLM(LlamaConfig(**kw)))
        eos = [im_end, eot]
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    model.generation_config = GenerationConfig(eos_token_id=eos, bos_token_id=None, pad_token_id=eot)
    model.eval().save_pretrained(path, max_shard_size="60KB" if shard else "1GB")
    return model, tok


def write_config(path, **changes):
    """Edit config.json in place (None deletes a key)."""
    file = f"{path}/config.json"
    config = json.load(open(file))
    for k, v in changes.items():
        config.pop(k) if v is None else config.__setitem__(k, v)
    json.dump(config, open(file, "w"))
