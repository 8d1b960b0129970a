"""The tasks a run learns, their data and prompts.

    gsm_synth/prepare.py  the tiny GPT's synthetic arithmetic ('arith'), the prompt format
    gsm8k/prepare.py      GSM8K from the official JSONL files you download
    countdown/prepare.py  Countdown, generated offline (searched.py: solutions that search, for a base)
    */names.py            where each prepare.py puts a directory, and the command that builds it again
    tokenizer.py          the byte-level BPE tokenizer the arith and Countdown bases use
    tasks.py              the task table: each task's data directory and default rewards; train_base's
                          data knobs (checked before any work, named as typed)
    datadir.py            a task's directory: which task it holds (.task), writing it (new, empty or its
                          own), reading it back (load_split, load_tokenizer), what a checkpoint binds
    curriculum.py         arith problems from easy to hard levels, advancing on training accuracy
    defect.py             the planted defect: wrong answers the reward trusts, drawn, handed out, logged

Where it plugs in: train_base.py and train_grpo.py load a task's splits and tokenizer at start-up and draw
prompts from them; the step itself sees only token ids and answers.
"""
