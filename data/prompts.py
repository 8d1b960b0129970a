"""
The prompt format, shared by sampling, the step, the loaders and the tools: a question's token ids
(encode_prompt; an instruct model's chat turn), the ids that end a completion (stop_tokens), a
completion's text (decode_completions). The data itself lives in the task directories (tasks.py).
"""


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
