"""
A Hugging Face model directory's tokenizer as a tiktoken.Encoding, read offline from its own files:

    enc = load_hf_tokenizer("path/to/Qwen2.5-0.5B-Instruct")
    enc.encode(text, disallowed_special=()), enc.decode(ids), enc.eot_token, enc.encode_chat(question)

Only byte-level BPE is supported (GPT-2, Qwen2, SmolLM2, Llama 3): tokenizer.json, or GPT-2's
vocab.json + merges.txt. Anything else is refused with a one-line UserError, never approximated.

Why ranks = ids gives HF's tokens: inside each piece of the split pattern, tiktoken repeatedly merges
the adjacent pair whose concatenation has the lowest rank; HF repeatedly applies the merge that comes
first in its merges list. A BPE trainer gives each merge's result the next free id, so a merge listed
earlier makes a token with a lower id: with ranks = ids, both pick the same pair at every step. Load
checks that the ids never decrease along the merges list (they may repeat: Llama 3's merges, converted
from tiktoken, list every split of a token) and that all 256 bytes are tokens (tiktoken starts from
bytes). tiktoken also takes a whole piece that is in the vocabulary as one token, as HF does with
`ignore_merges` and as a trained BPE's merges do anyway. The split pattern is the pre-tokenizer's
regex; added tokens (HF matches them all in text) are tiktoken's special tokens.
"""
import os
import threading
import unicodedata

import regex  # tiktoken's own dependency, for the special-token split below
import tiktoken

from configurator import UserError
from pretrained.hfconfig import read_object, shown

SUPPORTED = "only byte-level BPE (GPT-2, Qwen2, SmolLM2, Llama 3) is supported"
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# SmolLM2: Digits(individual_digits) isolates every \p{N} character (Rust's char::is_numeric), then
# GPT-2's pattern runs on each piece. As one pattern: a digit is a piece alone (no space joins it), and
# a piece may end just before a digit, where GPT-2's `(?!\S)` (end of piece) held, so "  7" is "  ", "7".
DIGITS_GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""
# a chat format is the special tokens it needs (plus a chat template in the directory)
CHAT_TOKENS = {"chatml": {"<|im_start|>", "<|im_end|>"},
               "llama3": {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}}


def _bytes_to_unicode():
    """GPT-2's table: every byte as a printable character (printable bytes keep their own character)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in bs]  # unprintable bytes: characters 256, 257, ... in byte order
    return dict(zip(bs + rest, map(chr, bs + [256 + n for n in range(len(rest))])))


BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


def _json(path):
    """The JSON object in path, or None if there is no such file."""
    return read_object(path) if os.path.isfile(path) else None


def _read_text(path):
    """A text file's contents, or None if there is no such file."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path} ({type(e).__name__}: {str(e)[:100]})") from None


def _split_pattern(pre, path):
    """The regex of a supported pre-tokenizer (see the module docstring), else UserError."""
    steps = (pre.get("pretokenizers") if pre and pre.get("type") == "Sequence" else [pre]) or [None]
    steps = [s or {} for s in steps]
    first, last = steps[0], steps[-1]
    if last.get("type") == "ByteLevel" and not last.get("add_prefix_space", True):
        regex_on = last.get("use_regex", True)
        if len(steps) == 1 and regex_on:
            return GPT2_PAT
        if len(steps) == 2 and first.get("type") == "Split" and "Regex" in first.get("pattern", {}) \
                and first.get("behavior") == "Isolated" and not first.get("invert") and not regex_on:
            return first["pattern"]["Regex"]
        if len(steps) == 2 and first.get("type") == "Digits" and first.get("individual_digits") and regex_on:
            return DIGITS_GPT2_PAT
    found = "+".join(str(s.get("type")) + ("(add_prefix_space)" if s.get("add_prefix_space") else "") for s in steps)
    if "Metaspace" in found:
        raise UserError(f"{path} is a SentencePiece-style tokenizer (Metaspace); {SUPPORTED}")
    raise UserError(f"{path}: pre-tokenizer {found} is not GPT-2's, Qwen2's, SmolLM2's or Llama 3's; {SUPPORTED}")


def _to_bytes(token, path):
    """A vocabulary string's bytes (its characters are GPT-2's stand-ins for bytes)."""
    try:
        return bytes(BYTE_OF_CHAR[c] for c in token)
    except KeyError:
        raise UserError(f"{path}: token {token!r} is not byte-level BPE; {SUPPORTED}") from None


MAX_ID = 2 ** 31 - 1  # tiktoken's ranks are 32-bit; torch embeds ids as int64


def _check_ids(vocab, merges, specials, path):
    """Refuse, by name, an id that is not an integer (a string, a float, JSON's true) or out of range,
    and a merge that is not two tokens: tiktoken would fail inside its Rust core, or compute other ids."""
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise UserError(f"{path}: the vocabulary must be a JSON object (token -> id) and the merges a list")
    for table, what in ((vocab, "token"), (specials, "added token")):
        for token, i in table.items():
            if not isinstance(token, str) or not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= MAX_ID:
                raise UserError(f"{path}: {what} {shown(token)} has id {shown(i)}; ids must be integers from 0 to "
                                f"{MAX_ID}: the file is damaged")
    for k, m in enumerate(merges):
        pair = m.split(" ") if isinstance(m, str) else m
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(t, str) for t in pair):
            raise UserError(f"{path}: merge {k} is {shown(m)}; a merge is two tokens ('a b' or ['a', 'b'])")


def _check_merges(vocab, merges, path):
    """Refuse a BPE whose merges tiktoken would apply in another order (see the module docstring)."""
    last = -1
    for k, m in enumerate(merges):
        a, b = m.split(" ") if isinstance(m, str) else m
        i = vocab.get(a + b, -1)
        if i < last:
            raise UserError(f"{path}: merge {k} ({a!r} {b!r}) makes token id {i} after id {last} (-1: no such "
                            f"token); tiktoken needs ids that follow the merge order")
        last = i


def _read_tokenizer_json(path):
    """(vocab, merges, special tokens, split pattern, NFC?) from a tokenizer.json."""
    tok = _json(path)
    model = tok.get("model") or {}
    norm, decoder = (tok.get("normalizer") or {}).get("type"), (tok.get("decoder") or {}).get("type")
    if model.get("type") != "BPE":
        kind = {"Unigram": "SentencePiece (Unigram)"}.get(model.get("type"), model.get("type"))
        raise UserError(f"{path} is a {kind} tokenizer; {SUPPORTED}")
    if model.get("byte_fallback"):
        raise UserError(f"{path} is a SentencePiece-style BPE (byte_fallback); {SUPPORTED}")
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise UserError(f"{path}: BPE dropout or subword prefix/suffix is set; {SUPPORTED}")
    if norm not in (None, "NFC"):
        raise UserError(f"{path}: normalizer {norm} is not supported (only none or NFC)")
    if decoder != "ByteLevel":
        raise UserError(f"{path}: decoder {decoder} is not ByteLevel; {SUPPORTED}")
    pat = _split_pattern(tok.get("pre_tokenizer"), path)
    specials = {}
    for t in tok.get("added_tokens", []):
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):  # whitespace tiktoken cannot strip
            raise UserError(f"{path}: added token {t['content']!r} has lstrip/rstrip/single_word set")
        specials[t["content"]] = t["id"]
    return model["vocab"], model.get("merges", []), specials, pat, norm == "NFC"


def _read_vocab_merges(folder, tok_config):
    """The same from GPT-2's vocab.json + merges.txt (+ tokenizer_config.json's added tokens)."""
    path = os.path.join(folder, "merges.txt")
    vocab = _json(os.path.join(folder, "vocab.json"))
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = [m for k, m in enumerate(lines) if m.strip() and not (k == 0 and m.startswith("#version"))]
    if tok_config.get("add_prefix_space"):
        raise UserError(f"{os.path.join(folder, 'tokenizer_config.json')}: add_prefix_space is set; {SUPPORTED}")
    specials = {"<|endoftext|>": vocab["<|endoftext|>"]} if "<|endoftext|>" in vocab else {}
    specials.update({t["content"]: int(i) for i, t in tok_config.get("added_tokens_decoder", {}).items()})
    return vocab, merges, specials, GPT2_PAT, False


def _eos_ids(folder, tok_config, token_ids):
    """(end-of-text id, the ids that stop generation). The stop ids are those transformers' generate
    stops on: generation_config.json's eos_token_id (int or list) if it says one, else config.json's.
    An id the tokenizer lacks is left out (sampling never draws beyond the tokenizer's vocabulary);
    if none is left, nothing stops generation, as in transformers. The end-of-text id (padding, the
    end of a reference solution) is the first stop id, else tokenizer_config's eos_token or <|endoftext|>."""
    stops = []
    for name in ("generation_config.json", "config.json"):
        eos = (_json(os.path.join(folder, name)) or {}).get("eos_token_id")
        if eos is not None:
            stops = [i for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)
                     and not isinstance(i, bool) and i in token_ids.values()]
            break
    stops = list(dict.fromkeys(stops))  # no duplicates, primary first
    if stops:
        return stops[0], tuple(stops)
    eos = tok_config.get("eos_token") or "<|endoftext|>"
    eos = eos.get("content") if isinstance(eos, dict) else eos  # older files: an AddedToken dict
    if eos not in token_ids:
        raise UserError(f"{folder}: no end-of-sequence token (no eos_token_id of the tokenizer in "
                        f"generation_config.json or config.json, and {eos!r} is not a token)")
    return token_ids[eos], ()


class _no_panic:
    """A text on which the split pattern still exceeds fancy-regex's backtracking limit (the load-time probe
    below tries fixed strings only): one line, not pyo3's PanicException (a BaseException) and a traceback."""

    def __init__(self, enc):
        self.enc = enc

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        # encode_ordinary panics; encode (special tokens allowed) returns fancy-regex's error as a ValueError
        if kind is not None and (kind.__name__ == "PanicException" or kind is ValueError and "Regex error" in str(e)):
            raise UserError(f"tokenizer {self.enc.name}: its split pattern exceeded the regex engine's backtracking "
                            f"limit on this text ({(str(e).splitlines() or [''])[0][:80]})") from None
        return False


class HFEncoding(tiktoken.Encoding):
    """A tiktoken.Encoding plus what a model directory says: NFC normalisation, eos ids, chat format."""

    def __init__(self, name, *, pat_str, mergeable_ranks, special_tokens, nfc=False, eot_token=None,
                 stop_tokens=(), chat=None, chat_template=None):
        super().__init__(name, pat_str=pat_str, mergeable_ranks=mergeable_ranks, special_tokens=special_tokens)
        self.nfc, self._eot, self.stop_tokens, self.chat = nfc, eot_token, tuple(stop_tokens), chat
        self.chat_template = chat_template  # the directory's own text: part of what an adapter is bound to
        # HF matches added tokens in the raw text and normalises only the text between them
        specials = sorted(special_tokens, key=len, reverse=True)
        self._special_split = regex.compile("(" + "|".join(map(regex.escape, specials)) + ")") if specials else None

    @property
    def eot_token(self):
        return self._eot

    def _normalize(self, text):
        if not self.nfc:
            return text
        parts = self._special_split.split(text) if self._special_split else [text]
        return "".join(p if k % 2 else unicodedata.normalize("NFC", p) for k, p in enumerate(parts))

    def encode_ordinary(self, text):
        with _no_panic(self):
            return super().encode_ordinary(self._normalize(text))

    def encode(self, text, **kwargs):
        with _no_panic(self):
            return super().encode(self._normalize(text), **kwargs)

    def encode_chat(self, user_text):
        """Ids of a one-turn chat prompt that ends in the assistant's header. The user's text is ordinary
        text: a "<|im_end|>" typed in it stays characters (HF's chat template would make it a token)."""
        s = self._special_tokens
        if self.chat == "chatml":
            parts = [s["<|im_start|>"], "user\n" + user_text, s["<|im_end|>"], "\n", s["<|im_start|>"], "assistant\n"]
        elif self.chat == "llama3":
            head, end = s["<|start_header_id|>"], s["<|end_header_id|>"]
            parts = [s["<|begin_of_text|>"]] if "<|begin_of_text|>" in s else []
            parts += [head, "user", end, "\n\n" + user_text, s["<|eot_id|>"], head, "assistant", end, "\n\n"]
        else:
            raise ValueError(f"tokenizer {self.name} has no chat format (ChatML or Llama 3 tokens and a chat template)")
        return [t for p in parts for t in ([p] if isinstance(p, int) else self.encode_ordinary(p))]

    def __getstate__(self):  # pickles with its own fields; tiktoken's __setstate__ calls __init__(**state)
        return {**super().__getstate__(), "nfc": self.nfc, "eot_token": self._eot, "stop_tokens": self.stop_tokens,
                "chat": self.chat, "chat_template": self.chat_template}


def load_hf_tokenizer(path):
    """The HFEncoding of a Hugging Face model directory (UserError, one line, if it cannot be reproduced)."""
    if not os.path.isdir(path):
        raise UserError(f"tokenizer directory not found: {path}")
    f = lambda name: os.path.join(path, name)  # noqa: E731
    tok_config = _json(f("tokenizer_config.json")) or {}
    if os.path.isfile(f("tokenizer.json")):
        source = f("tokenizer.json")
    elif os.path.isfile(f("vocab.json")) and os.path.isfile(f("merges.txt")):
        source = f("merges.txt")
    elif os.path.isfile(f("tokenizer.model")):
        raise UserError(f"{f('tokenizer.model')} is a SentencePiece tokenizer; {SUPPORTED}")
    else:
        raise UserError(f"no tokenizer in {path}: looked for tokenizer.json, or vocab.json and merges.txt")
    try:
        vocab, merges, specials, pat, nfc = _read_tokenizer_json(source) if source.endswith(".json") \
            else _read_vocab_merges(path, tok_config)
        _check_ids(vocab, merges, specials, source)
        _check_merges(vocab, merges, source)
        ranks = {_to_bytes(s, source): i for s, i in vocab.items() if s not in specials}  # added tokens: specials
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OSError) as e:  # valid JSON, wrong contents
        raise UserError(f"{source} is damaged ({type(e).__name__}: {e})") from None
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise UserError(f"{source}: {len(missing)} bytes have no token (first: {missing[0]}); tiktoken needs all 256")
    if len(set(ranks.values())) < len(ranks) or set(ranks.values()) & set(specials.values()):
        raise UserError(f"{source}: two tokens share an id")  # tiktoken's Rust core would panic
    eot, stops = _eos_ids(path, tok_config, {**vocab, **specials})
    template = tok_config.get("chat_template") or _read_text(f("chat_template.jinja"))
    has_template = bool(tok_config.get("chat_template")) or os.path.isfile(f("chat_template.jinja"))
    chat = next((k for k, need in CHAT_TOKENS.items() if has_template and need <= specials.keys()), None)
    if not isinstance(pat, str):
        raise UserError(f"{source}: the split pattern is {shown(pat)}, not a regular expression (a string)")
    try:  # tiktoken compiles the split pattern here (fancy-regex): a pattern it cannot parse is a ValueError
        enc = HFEncoding(os.path.basename(os.path.normpath(path)), pat_str=pat, mergeable_ranks=ranks,
                         special_tokens=specials, nfc=nfc, eot_token=eot, stop_tokens=stops, chat=chat,
                         chat_template=template)
    except ValueError as e:
        raise UserError(f"{source}: the split pattern {shown(pat)} does not compile "
                        f"({(str(e).splitlines() or [''])[0][:100]})") from None
    _probe_pattern(enc, source)
    return enc


# The split pattern is tried, not trusted. tiktoken runs it with fancy-regex: a pattern without lookaround
# or backreferences goes to a linear-time engine, but lookaround (GPT-2's own `\s+(?!\S)`) makes it
# backtrack, and an ambiguous quantified group such as `(a|aa)+(?=c)` then backtracks exponentially, up
# to fancy-regex's step limit, where tiktoken panics. Which patterns do so cannot be read off their text
# reliably (nested quantifiers are neither necessary nor sufficient), so each is run on fixed strings of
# every character class, long runs included (backtracking grows with run length), within a time bound,
# and must give back every character: tiktoken silently drops text its pattern does not match.
PROBE_TEXTS = [c * 2000 for c in ("a", "A", "7", " ", "\n", "\t", "!", "é", "日", "\U0001F600", "'")] + [
    "Mia has 3 apples.\nShe buys 12 more: how many now?  \n\n #### 15 " * 40,
    " a1!" * 500 + "\r\n" * 200 + "don't I'll we've " * 50 + "\u00a0\u2003x\u200b" * 100]
PROBE_SECONDS = 10.0  # each probe takes milliseconds with a real tokenizer's pattern


def _probe_pattern(enc, source):
    """UserError unless enc's split pattern encodes PROBE_TEXTS back to themselves, in time, without panic."""
    outcome = []

    def run():
        try:
            for text in PROBE_TEXTS:
                got = tiktoken.Encoding.decode(enc, tiktoken.Encoding.encode_ordinary(enc, text))
                if got != text:
                    outcome.append(f"drops or changes characters of {shown(text[:20])}... (it must match all text)")
                    return
            outcome.append(None)
        except BaseException as e:  # pyo3's PanicException derives from BaseException only
            outcome.append(f"exceeds the regex engine's backtracking limit ({type(e).__name__})")
    with _quiet_stderr():  # a panic prints Rust's backtrace to the process's stderr
        worker = threading.Thread(target=run, daemon=True)  # tiktoken releases the GIL while it encodes
        worker.start()
        worker.join(PROBE_SECONDS)
    why = outcome[0] if outcome else f"takes over {PROBE_SECONDS:.0f} s on {len(PROBE_TEXTS)} test strings " \
                                     f"(catastrophic backtracking)"
    if why:
        raise UserError(f"{source}: the split pattern {shown(enc._pat_str)} {why}; {SUPPORTED}")


class _quiet_stderr:
    """File descriptor 2 to /dev/null for a moment (Rust writes there directly, below sys.stderr)."""

    def __enter__(self):
        try:
            self.saved = os.dup(2)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        except OSError:
            self.saved = None

    def __exit__(self, *exc):
        if self.saved is not None:
            os.dup2(self.saved, 2)
            os.close(self.saved)
