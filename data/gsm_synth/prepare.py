"""
Synthetic GSM8K-style word problems and their tokenizer, built offline and deterministically.

    python data/gsm_synth/prepare.py --steps=2 --max_operand=20 --ops=+-

writes data/gsm_synth/<knobs>/{train,val,test}.jsonl, tokenizer.json and meta.json. Every
training script calls prepare() itself, so a fresh clone needs no manual step. Running it
twice gives byte-identical files (fixed seed, sorted/deterministic iteration, no timestamps).

An example (GSM8K form: a worked solution, then a final line `#### <integer>`):
    question: "Mia has 12 pears. She buys 5 more pears. Then she gives 3 pears to Sam.
               How many pears does Mia have now?"
    solution: "12+5=17\n17-3=14\n#### 14"

The tokenizer is a tiktoken.Encoding over bytes (so any text encodes) plus a small BPE
trained here on the training split: frequent words become one token, digits never merge
(the split pattern isolates every digit), and <|endoftext|> is a special token.
"""
import json
import os
import random
import sys
from collections import Counter

import tiktoken

ROOT = os.path.dirname(os.path.abspath(__file__))
EOT = "<|endoftext|>"
# GPT-2's split pattern, except that a digit is always a piece of its own: numbers are
# spelled digit by digit, so the model sees the same tokens for "14" in every context.
PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

NAMES = [("Mia", "she", "her"), ("Sam", "he", "him"), ("Ava", "she", "her"), ("Leo", "he", "him"),
         ("Zoe", "she", "her"), ("Max", "he", "him"), ("Ivy", "she", "her"), ("Tom", "he", "him"),
         ("Eva", "she", "her"), ("Ben", "he", "him"), ("Lily", "she", "her"), ("Noah", "he", "him")]
ITEMS = ["apples", "pears", "cards", "coins", "books", "shells", "stickers", "marbles",
         "pencils", "cookies", "stamps", "beads"]
# one template per operation; {n} is the operand, {f} another child's name
TEMPLATES = {
    "+": ["{P} buys {n} more {item}.", "{P} finds {n} more {item}.", "{f} gives {o} {n} {item}."],
    "-": ["{P} gives {n} {item} to {f}.", "{P} loses {n} {item}.", "{P} sells {n} {item}."],
    "*": ["Then the number of {item} {p} has is multiplied by {n}."],
    "/": ["{P} splits the {item} into {n} equal piles and keeps one pile."],
}


def make_problem(rng, steps, max_operand, ops):
    """One problem with `steps` operations drawn from `ops`; returns (question, solution, answer)."""
    (name, p, o), item = rng.choice(NAMES), rng.choice(ITEMS)
    friend = rng.choice([n for n, _, _ in NAMES if n != name])
    cur = rng.randint(1, max_operand)
    sentences, lines = [f"{name} has {cur} {item}."], []
    for _ in range(steps):
        op = rng.choice(ops)
        if op == "-" and cur == 0:
            op = "+"  # nothing left to take away
        if op == "*":
            n = rng.randint(2, 3)  # keep products small enough for a tiny model
        elif op == "/":
            divisors = [d for d in range(2, 6) if cur % d == 0]
            if not divisors:
                op, n = "+", rng.randint(1, max_operand)
            else:
                n = rng.choice(divisors)
        elif op == "-":
            n = rng.randint(1, min(cur, max_operand))
        else:
            n = rng.randint(1, max_operand)
        new = {"+": cur + n, "-": cur - n, "*": cur * n, "/": cur // max(n, 1)}[op]
        s = rng.choice(TEMPLATES[op]).format(P=p.capitalize(), p=p, o=o, n=n, item=item, f=friend)
        sentences.append(s)
        lines.append(f"{cur}{op}{n}={new}")
        cur = new
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), "\n".join(lines + [f"#### {cur}"]), cur


def stop_early(solution):
    """The slip planted by `noise`: the solution stops one step early and reports the
    intermediate result ("12+5=17\n#### 17" instead of going on to 17-3=14)."""
    eqs = solution.split("\n")[:-1]
    return "\n".join(eqs[:-1] + [f"#### {eqs[-2].split('=')[1]}"])


def prompt_text(question):
    """The prompt the model sees; the completion it must write is the solution."""
    return question + "\n"


def encode_text(enc, text):
    """Token ids of any text. A string that spells a special token ("<|endoftext|>") is encoded as the
    plain characters it is, never as the special token: a question cannot end its own prompt."""
    return enc.encode(text, disallowed_special=())


def encode_prompt(enc, question):
    return encode_text(enc, prompt_text(question))


def train_bpe(texts, num_merges):
    """Byte-level BPE merges learned from `texts` (deterministic: ties broken by the bytes)."""
    import regex  # tiktoken's own dependency; same pattern semantics as tiktoken
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


def build_encoding(merges, name="gsm_synth"):
    """A tiktoken.Encoding: 256 byte tokens, then the merges in rank order, then <|endoftext|>."""
    ranks = {bytes([i]): i for i in range(256)}
    for m in merges:
        ranks[m] = len(ranks)
    return tiktoken.Encoding(name=name, pat_str=PAT_STR, mergeable_ranks=ranks,
                             special_tokens={EOT: len(ranks)})


def load_tokenizer(data_dir):
    """The task's tokenizer, read from data_dir/tokenizer.json (no network, ever)."""
    path = os.path.join(data_dir, "tokenizer.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no tokenizer at {path}: run data/gsm_synth/prepare.py first")
    with open(path) as f:
        tok = json.load(f)
    return build_encoding([bytes.fromhex(h) for h in tok["merges"]], tok["name"])


def load_split(data_dir, split):
    """List of {"question", "solution", "answer"} dicts."""
    with open(os.path.join(data_dir, f"{split}.jsonl")) as f:
        return [json.loads(line) for line in f]


def data_dir_for(steps, max_operand, ops, noise=0.0, root=ROOT):
    safe_ops = ops.replace("+", "a").replace("-", "s").replace("*", "m").replace("/", "d")
    return os.path.join(root, f"s{steps}_m{max_operand}_{safe_ops}_n{round(noise * 100)}")


def prepare(steps=2, max_operand=20, ops="+-", noise=0.0, n_train=20000, n_val=500, n_test=500,
            num_merges=150, seed=1337, verbose=True, root=ROOT):
    """Build the data set for these knobs if it is missing; return its directory.

    noise: fraction of TRAINING solutions that stop one step early (stop_early) while their
    `answer` field stays correct. A base model trained on them has both habits; a correctness
    reward can teach it to finish. Validation and test solutions are always clean."""
    if steps < 1 or max_operand < 1 or not ops or set(ops) - set(TEMPLATES) or not 0 <= noise <= 1 \
            or (noise > 0 and steps < 2):
        raise ValueError(f"bad task knobs: steps={steps} max_operand={max_operand} ops={ops!r} noise={noise} "
                         f"(need steps>=1, max_operand>=1, ops from '+-*/', 0<=noise<=1, steps>=2 if noise)")
    data_dir = data_dir_for(steps, max_operand, ops, noise, root)
    if os.path.exists(os.path.join(data_dir, "meta.json")):
        return data_dir
    if verbose:
        print(f"preparing task data in {data_dir} ...")
    rng = random.Random(seed)
    n_total, seen, examples = n_train + n_val + n_test, set(), []
    for _ in range(50 * n_total):  # unique questions: the splits can then share none
        q, sol, ans = make_problem(rng, steps, max_operand, ops)
        if q not in seen:
            seen.add(q)
            examples.append({"question": q, "solution": sol, "answer": ans})
            if len(examples) == n_total:
                break
    if len(examples) < n_total:
        raise ValueError(f"only {len(examples)} distinct problems for these knobs; "
                         f"lower n_train or raise max_operand/steps")
    splits = {"test": examples[:n_test], "val": examples[n_test:n_test + n_val],
              "train": examples[n_test + n_val:]}
    noise_rng = random.Random(seed + 1)
    splits["train"] = [{**e, "solution": stop_early(e["solution"])} if noise_rng.random() < noise else e
                       for e in splits["train"]]
    merges = train_bpe([prompt_text(e["question"]) + e["solution"] for e in splits["train"][:5000]],
                       num_merges)
    enc = build_encoding(merges)
    os.makedirs(data_dir, exist_ok=True)
    for split, rows in splits.items():
        with open(os.path.join(data_dir, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(data_dir, "tokenizer.json"), "w") as f:
        json.dump({"name": "gsm_synth", "pat_str": PAT_STR, "merges": [m.hex() for m in merges]}, f)
    meta = {"steps": steps, "max_operand": max_operand, "ops": ops, "noise": noise, "seed": seed,
            "vocab_size": enc.n_vocab, "eot_token": enc.eot_token,
            "sizes": {k: len(v) for k, v in splits.items()}}
    with open(os.path.join(data_dir, "meta.json"), "w") as f:  # written last: marks completion
        json.dump(meta, f, indent=1)
    if verbose:
        print(f"  {meta['sizes']} problems, vocab {enc.n_vocab} tokens")
    return data_dir


if __name__ == "__main__":
    kw = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
    typed = {k: (v if k == "ops" else float(v) if k == "noise" else int(v)) for k, v in kw.items()}
    print(prepare(**typed))
