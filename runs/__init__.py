"""A run directory and what is written into it, for train_base.py, train_grpo.py and analysis/.

    base.py     a run's base: what an adapter is bound to, where the base is now (every script's resolver)
    loading.py  what a run stands on: load_base, load_policy (every script); base_to_train and
                load_frozen_base (train_grpo.py); check_lora, lora.apply_lora's inputs refused by name
    rundir.py   the out_dir lock, refusal of an old run's files, crash-tolerant JSONL, write_atomic
                (the project's atomic text write: task data, a resumed run's JSONL)
    metrics.py  what a GRPO step logs: the log.jsonl line (TRL's metric names), the rollouts.jsonl
                line post-hoc TracIn reads, the console line, the no-learning-signal warning

Where it plugs in: train_grpo.Run writes a step's line after grpo_step returns; nothing here runs inside it.
"""
