"""Pretrained models and their files: what lets the lecture's GPT load a Hugging Face directory (GPT-2, Qwen2,
Llama-family) and hand its adapter back.

    hf.py         config.json -> GPTConfig switches, the tensor-name table, safetensors in and out
    hfconfig.py   config.json checked field by field (type, range, what this GPT implements)
    tokenizer.py  the directory's byte-level BPE tokenizer as a tiktoken.Encoding, its chat format, stop ids

Where it plugs in: hf.from_pretrained builds model.py's GPT from a directory; runs/loading.load_base
loads its tokenizer through pretrained/tokenizer.py; the command export.py writes a run's peft adapter
and merged model with hf.py. Nothing here runs inside a GRPO or TracIn step.
"""
