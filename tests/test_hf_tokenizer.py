# Tests for pretrained/tokenizer.py (a Hugging Face directory's byte-level BPE as a tiktoken.Encoding).
# Run with: python -m pytest -q tests/test_hf_tokenizer.py
# Reference: the `tokenizers` / `transformers` libraries themselves. Tiny BPEs are trained here in the
# three styles the module supports (GPT-2, Qwen2, SmolLM2; plus Llama 3's chat tokens), saved with
# save_pretrained into tmp_path, and every text must get the same ids from HF and from the loaded
# tiktoken encoding. Nothing is downloaded.
import json
import os
import pickle
import random
import shutil
import unicodedata

import pytest

pytest.importorskip("tokenizers", reason="the reference tokenizers are built with Hugging Face tokenizers")
pytest.importorskip("transformers", reason="the reference directories are written by transformers' save_pretrained")
import tiktoken  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from configurator import UserError  # noqa: E402
from pretrained.tokenizer import HFEncoding, load_hf_tokenizer  # noqa: E402

QWEN2_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_PAT = QWEN2_PAT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3_CHAT = ("<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
               "{{ m['content'] }}<|eot_id|>{% endfor %}"
               "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
WORDS = ["the", "cat", "sat", "on", "mat", "Sam", "has", "apples", "pears", "how", "many", "now", "café", "naïve",
         "über", "Ærø", "日本語", "中文", "東京", "😀", "🚀", "–", "—", "…", "«", "»", "ß", "İstanbul", "Ωmega"]
# the hand-picked cases: digits and long numbers, composed and decomposed accents, CJK, emoji, whitespace
# runs, tabs, CRLF, contractions, trailing spaces, spaces before digits, special tokens inside text
TEXTS = ["Sam has 12345678901234 apples.", "x=3.14159, y=-2e10, 1,000,000 and 007", "x²+y³=z½ ٣٤ Ⅻ",
         "café vs cafe\u0301 (NFC matters)", "naïve Ærø über İstanbul ΣΊΣΥΦΟΣ", "日本語のテキスト、中文。東京123",
         "emoji 😀🚀👍🏽 and 👨‍👩‍👧 family", "a  b   c    d", "tab\tand\t\ttabs", "line\r\nCRLF\r\n\r\nend",
         "\n\n\nnewlines\n \n", "\u00a0nbsp\u2003em\u3000ideo\u0085nel\u2028ls", "I'M HERE, he's, we'LL",
         "they're 've 'd 'm 'T", "a'b'c", "trailing spaces   ", "   leading", "count: 1 22  333   4444", "  7", "\t9",
         "<|endoftext|>after", "before<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n", "<|im_end|>\u0301",
         "", " ", "####  4\n8-7=1", "$$$ !!! ??? ..."]


def corpus(n=400, seed=0):
    """A few hundred lines of mixed text (words, numbers, unicode, whitespace) to train on."""
    rng = random.Random(seed)
    seps = [" ", " ", " ", "  ", "\t", "\n", "\r\n", ", ", ". ", "'s ", "'ll ", "! ", "? "]
    lines = []
    for _ in range(n):
        parts = [rng.choice(WORDS) if rng.random() < 0.7 else str(rng.randint(0, 10 ** rng.randint(1, 8)))
                 for _ in range(rng.randint(3, 12))]
        lines.append("".join(p + rng.choice(seps) for p in parts))
    return lines + TEXTS


def save_hf(tmp_path, name, normalizer, pre_tokenizer, specials, template=None, vocab_size=500):
    """Train a byte-level BPE, add `specials` after the vocabulary (as real models do), save_pretrained it."""
    tok = Tokenizer(models.BPE())
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre_tokenizer, decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens(list(specials))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=specials[0])
    if template:
        hf.chat_template = template
    path = tmp_path / name
    hf.save_pretrained(path)
    return str(path), hf


def make_gpt2(tmp_path):
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return save_hf(tmp_path, "gpt2", None, pre, ["<|endoftext|>"])


def make_qwen2(tmp_path):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return save_hf(tmp_path, "qwen2", normalizers.NFC(), pre, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], CHATML)


def make_smollm2(tmp_path):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return save_hf(tmp_path, "smollm2", None, pre, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])


def make_llama3(tmp_path):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    specials = ["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    return save_hf(tmp_path, "llama3", None, pre, specials, LLAMA3_CHAT)


STYLES = {"gpt2": make_gpt2, "qwen2": make_qwen2, "smollm2": make_smollm2}


def read_json(path):
    with open(path) as f:
        return json.load(f)


def hf_ids(hf, text):
    return hf(text, add_special_tokens=False)["input_ids"]


def random_texts(n, seed):
    """Random strings over a mixed alphabet: the cases above, cut into pieces and shuffled together."""
    rng = random.Random(seed)
    alphabet = "".join(TEXTS) + "0123456789      \t\n\r'sltdmvrLSE\u0301\u0308"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("style", sorted(STYLES))
def test_same_ids_as_hf(tmp_path, style):
    path, hf = STYLES[style](tmp_path)
    enc = load_hf_tokenizer(path)
    assert isinstance(enc, tiktoken.Encoding) and isinstance(enc, HFEncoding)
    assert enc.n_vocab == len(hf)
    for text in TEXTS + corpus(50, seed=1) + random_texts(300, seed=2):
        ids = enc.encode(text, allowed_special="all")
        assert ids == hf_ids(hf, text), text
        plain = unicodedata.normalize("NFC", text) if style == "qwen2" else text
        assert enc.decode(ids) == plain                         # byte-level BPE round-trips any text
        assert enc.encode_ordinary(text) == enc.encode(text, disallowed_special=())


def test_nfc_is_applied_between_special_tokens(tmp_path):
    path, hf = make_qwen2(tmp_path)
    enc = load_hf_tokenizer(path)
    assert enc.encode("cafe\u0301") == enc.encode("café") == hf_ids(hf, "cafe\u0301")
    # ">" + U+0338 composes to "≯" under NFC; HF matches <|im_end|> first, and so must we
    text = "<|im_end|>\u0338x"
    assert enc.encode(text, allowed_special="all") == hf_ids(hf, text)
    assert enc.encode_batch(["cafe\u0301"]) == [enc.encode("café")]   # the batch calls go through encode


def test_vocab_json_and_merges_txt(tmp_path):
    """GPT-2's older files: vocab.json (holding <|endoftext|>) + merges.txt, no tokenizer.json."""
    path, hf = make_gpt2(tmp_path)
    tok = read_json(os.path.join(path, "tokenizer.json"))
    old = tmp_path / "gpt2_old"
    old.mkdir()
    vocab = dict(tok["model"]["vocab"], **{"<|endoftext|>": len(hf) - 1})
    (old / "vocab.json").write_text(json.dumps(vocab))
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    (old / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    enc, ref = load_hf_tokenizer(str(old)), load_hf_tokenizer(path)
    assert enc.eot_token == ref.eot_token == len(hf) - 1 and enc.n_vocab == ref.n_vocab
    for text in TEXTS + random_texts(100, seed=3):
        assert enc.encode(text, allowed_special="all") == ref.encode(text, allowed_special="all") == hf_ids(hf, text)
    # tokenizer_config.json's added_tokens_decoder adds special tokens beyond the vocabulary
    (old / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {
        str(len(hf)): {"content": "<|pad|>", "special": True}}}))
    enc = load_hf_tokenizer(str(old))
    assert enc.encode("a<|pad|>", allowed_special="all") == hf_ids(hf, "a") + [len(hf)] and enc.n_vocab == len(hf) + 1


def test_merges_listing_every_split(tmp_path):
    """Llama 3's merges, converted from tiktoken, list every split of every token (so one token id
    repeats along the merges) and set ignore_merges: still HF's ids."""
    path, _ = make_llama3(tmp_path)
    file = os.path.join(path, "tokenizer.json")
    tok = read_json(file)
    vocab = tok["model"]["vocab"]
    merges = sorted(((t[:i], t[i:]) for t in vocab for i in range(1, len(t)) if t[:i] in vocab and t[i:] in vocab),
                    key=lambda m: (vocab[m[0] + m[1]], vocab[m[0]], vocab[m[1]]))
    assert len(merges) > len(tok["model"]["merges"])
    tok["model"].update(merges=[list(m) for m in merges], ignore_merges=True)
    with open(file, "w") as f:
        json.dump(tok, f)
    hf, enc = PreTrainedTokenizerFast(tokenizer_file=file), load_hf_tokenizer(path)
    for text in TEXTS + random_texts(300, seed=4):
        assert enc.encode(text, allowed_special="all") == hf_ids(hf, text), text


def test_eos_and_stop_tokens(tmp_path):
    path, hf = make_qwen2(tmp_path)
    eot, im_end = hf.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    enc = load_hf_tokenizer(path)  # no eos id anywhere: tokenizer_config.json's eos_token, nothing stops
    assert (enc.eot_token, enc.stop_tokens) == (eot, ())
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"eos_token_id": eot}, f)
    assert load_hf_tokenizer(path).stop_tokens == (eot,)
    with open(os.path.join(path, "generation_config.json"), "w") as f:  # it wins, as in transformers' generate
        json.dump({"eos_token_id": [im_end]}, f)
    assert load_hf_tokenizer(path).stop_tokens == (im_end,)
    with open(os.path.join(path, "generation_config.json"), "w") as f:  # ids the tokenizer lacks never stop
        json.dump({"eos_token_id": [im_end, 99999, eot, im_end]}, f)
    enc = load_hf_tokenizer(path)
    assert enc.eot_token == im_end and enc.stop_tokens == (im_end, eot)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 99999}, f)  # a random config's default eos beyond a small vocabulary
    assert (load_hf_tokenizer(path).eot_token, load_hf_tokenizer(path).stop_tokens) == (eot, ())
    enc2 = pickle.loads(pickle.dumps(enc))                       # e.g. into a DataLoader worker
    assert (enc2.eot_token, enc2.stop_tokens, enc2.chat) == (im_end, (im_end, eot), "chatml")
    assert enc2.encode("cafe\u0301") == enc.encode("café")


@pytest.mark.parametrize("make", [make_qwen2, make_llama3])
def test_encode_chat_matches_apply_chat_template(tmp_path, make):
    path, hf = make(tmp_path)
    enc = load_hf_tokenizer(path)
    assert enc.chat == ("chatml" if make is make_qwen2 else "llama3")
    for text in ["What is 12+5?", "", " two  spaces \n", "cafe\u0301 日本 😀", "Sam has 8 shells.\r\n"]:
        ref = hf.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        ref = ref["input_ids"] if isinstance(ref, dict) or hasattr(ref, "keys") else ref
        assert enc.encode_chat(text) == list(ref), text
    trick = "<|im_end|>" if make is make_qwen2 else "<|eot_id|>"   # typed by the user: plain characters
    special = enc.encode_single_token(trick)
    assert enc.encode_chat(trick).count(special) == enc.encode_chat("").count(special) == 1


def test_no_chat_format(tmp_path):
    enc = load_hf_tokenizer(make_smollm2(tmp_path)[0])   # ChatML tokens but no chat template
    assert enc.chat is None
    with pytest.raises(ValueError, match="no chat format"):
        enc.encode_chat("hi")


def edit_tokenizer_json(path, change):
    file = os.path.join(path, "tokenizer.json")
    tok = read_json(file)
    change(tok)
    with open(file, "w") as f:
        json.dump(tok, f)


def test_refused_tokenizers(tmp_path):
    gpt2, _ = make_gpt2(tmp_path)

    def refused(path, *words):
        with pytest.raises(UserError) as e:
            load_hf_tokenizer(str(path))
        msg = str(e.value)
        assert "\n" not in msg and all(w in msg for w in words), msg

    sp = tmp_path / "sentencepiece"
    sp.mkdir()
    (sp / "tokenizer.model").write_bytes(b"\x0a\x0b not really protobuf")
    refused(sp, "tokenizer.model", "SentencePiece", "only byte-level BPE")
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.train_from_iterator(corpus(50), trainers.WordPieceTrainer(vocab_size=100, special_tokens=["[UNK]"],
                                                                  show_progress=False))
    (tmp_path / "wordpiece").mkdir()
    wp.save(str(tmp_path / "wordpiece" / "tokenizer.json"))
    refused(tmp_path / "wordpiece", "WordPiece", "only byte-level BPE")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(empty, "tokenizer.json", "vocab.json", "merges.txt")
    refused(tmp_path / "nowhere", "not found")

    for name, change, words in [
            ("nfkc", lambda t: t.update(normalizer={"type": "NFKC"}), ["NFKC"]),
            ("fallback", lambda t: t["model"].update(byte_fallback=True), ["SentencePiece", "byte_fallback"]),
            ("metaspace", lambda t: t.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁"}), ["Metaspace"]),
            ("prefix", lambda t: t["pre_tokenizer"].update(add_prefix_space=True), ["add_prefix_space"]),
            ("lstrip", lambda t: t["added_tokens"][0].update(lstrip=True), ["lstrip"]),
            ("nobyte", lambda t: t["model"]["vocab"].pop("Ā"), ["1 bytes have no token (first: 0)"]),
            ("order", lambda t: t["model"]["merges"].reverse(), ["merge 1", "merge order"])]:
        bad = tmp_path / name
        shutil.copytree(gpt2, bad)
        edit_tokenizer_json(str(bad), change)
        refused(bad, "tokenizer.json", *words)

    damaged = tmp_path / "damaged"
    shutil.copytree(gpt2, damaged)
    with open(damaged / "tokenizer.json", "r+") as f:
        f.truncate(100)
    refused(damaged, "tokenizer.json")
    shutil.copytree(gpt2, tmp_path / "badcfg")  # no usable eos id, and no end-of-text token either
    (tmp_path / "badcfg" / "generation_config.json").write_text('{"eos_token_id": [99999]}')
    tok_json = json.load(open(tmp_path / "badcfg" / "tokenizer.json"))
    tok_json["added_tokens"] = []
    json.dump(tok_json, open(tmp_path / "badcfg" / "tokenizer.json", "w"))
    os.remove(tmp_path / "badcfg" / "tokenizer_config.json")
    refused(tmp_path / "badcfg", "no end-of-sequence token")
