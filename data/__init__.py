"""The tasks a run learns, their data and prompts.

    gsm_synth/prepare.py  the tiny GPT's synthetic arithmetic ('arith'), its tokenizer, the prompt format
    gsm8k/prepare.py      GSM8K from the official JSONL files you download
    countdown/prepare.py  Countdown, generated offline
    tasks.py              the task table: each task's data directory and default rewards
    datadir.py            which task a directory holds (its .task file): a run checks it, a prepare.py
                          writes only new, empty or its own task's directories
    curriculum.py         arith problems from easy to hard levels, advancing on training accuracy

Where it plugs in: train_base.py and train_grpo.py load a task's splits and tokenizer at start-up and draw
prompts from them; the step itself sees only token ids and answers.
"""
