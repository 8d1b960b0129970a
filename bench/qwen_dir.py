"""
A Qwen2.5-1.5B-shaped Hugging Face directory with random weights, for measuring the 1.5B configs on a
GPU without downloading anything: the published config.json's dimensions (28 layers, 1536 wide, 12
query and 2 key/value heads, MLP 8960, vocabulary 151,936, tied head, rope_theta 1e6), the weights
drawn by transformers' own initialisation and saved in bf16 (3.1 GB), and a small byte-level BPE
tokenizer with the ChatML template (its ids are the first rows of the embedding). transformers and
tokenizers are bench references here, never imported by the project's code.

    python -m bench.qwen_dir /tmp/qwen15b      # then: train_grpo.py ... --base_ckpt=/tmp/qwen15b
"""
import os
import sys

import torch

QWEN15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
               num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
               rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def main(argv):
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.exit("usage: python -m bench.qwen_dir OUT_DIR (a new or empty directory)")
    out = argv[0]
    if os.path.isdir(out) and os.listdir(out):
        if os.path.isfile(os.path.join(out, "config.json")):
            print(f"{out} holds a model directory already: kept")
            return
        sys.exit(f"{out} is not empty: give a new or empty directory")
    try:
        from transformers import Qwen2Config, Qwen2ForCausalLM
    except ImportError:
        sys.exit("bench.qwen_dir needs transformers and tokenizers: pip install transformers tokenizers")
    from bench.hf_tokenizer import make_tokenizer  # a byte-level BPE with ChatML, trained in memory
    os.makedirs(out, exist_ok=True)
    tok = make_tokenizer(out, "qwen2")
    config = Qwen2Config(**QWEN15B, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                         torch_dtype="bfloat16")
    torch.manual_seed(0)
    print(f"building a random {QWEN15B['num_hidden_layers']}-layer Qwen2 (1.5B parameters) ...")
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"{out}: {n / 1e9:.2f}B parameters in bf16, tokenizer of {len(tok)} tokens")


if __name__ == "__main__":
    main(sys.argv[1:])
