"""
The task tokenizers: a tiktoken.Encoding over bytes plus a small BPE trained on a task's training
split (frequent words become one token, digits never merge: the split pattern isolates every digit),
and <|endoftext|> as a special token. data/gsm_synth and data/countdown/searched.py build one with
these functions; data/datadir.load_tokenizer reads it back from a directory's tokenizer.json.
"""
import json
from collections import Counter

import regex  # tiktoken's own dependency: the same pattern semantics as tiktoken
import tiktoken

EOT = "<|endoftext|>"
# GPT-2's split pattern, except that a digit is always a piece of its own: numbers are
# spelled digit by digit, so the model sees the same tokens for "14" in every context.
PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def train_bpe(texts, num_merges):
    """Byte-level BPE merges learned from `texts` (deterministic: ties broken by the bytes)."""
    words = Counter(w for t in texts for w in regex.findall(PAT_STR, t))
    words = {tuple(bytes([b]) for b in w.encode()): c for w, c in sorted(words.items())}
    merges = []
    for _ in range(num_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < 2:
            break
        merges.append(a + b)
        new_words = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return merges


def tokenizer_json(name, merges):
    """tokenizer.json as load_tokenizer reads it: the split pattern and the merges (hex bytes)."""
    return json.dumps({"name": name, "pat_str": PAT_STR, "merges": [m.hex() for m in merges]})


def build_encoding(merges, name="gsm_synth"):
    """A tiktoken.Encoding: 256 byte tokens, then the merges in rank order, then <|endoftext|>."""
    ranks = {bytes([i]): i for i in range(256)}
    for m in merges:
        ranks[m] = len(ranks)
    return tiktoken.Encoding(name=name, pat_str=PAT_STR, mergeable_ranks=ranks,
                             special_tokens={EOT: len(ranks)})
