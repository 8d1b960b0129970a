"""Tiny random Hugging Face model directories for the tests, written by the independent references
themselves (transformers' save_pretrained, a BPE trained by tokenizers) into a temporary directory:
nothing is downloaded. make_dir(path, family, ...) -> the transformers model (eval, float32)."""
import json

import torch

from bench.hf_tokenizer import make_tokenizer  # the bench's 1.5B-shaped directory uses it too


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
