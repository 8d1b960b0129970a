"""A run directory and what is written into it, for train_base.py, train_grpo.py and analysis/.

    base.py     a run's base: what an adapter is bound to, where the base is now (every script's resolver)
    loading.py  what a run stands on: load_base, load_policy (every script); base_to_train and
                load_frozen_base / frozen_base (train_grpo.py); check_lora, lora.apply_lora's inputs refused
                by name
    state.py    a GRPO run's state (Run), its checkpoints (save_run) and resuming it (load_resume, restore)
    evaluate.py evaluate (greedy accuracy, pass@k) and get_lr, for both training scripts
    rundir.py   the out_dir lock, refusal of an old run's files, crash-tolerant JSONL, a resume's rewind
    metrics.py  what a GRPO step logs: the log.jsonl line (TRL's metric names), the rollouts.jsonl
                line post-hoc TracIn reads, the console line, the no-learning-signal warning, the skipped steps

The file primitives (atomic writes, output directories, JSON, live PIDs) are fileio.py's, below
this folder, data/ and pretrained/.
Where it plugs in: train_grpo.py's loop evaluates, writes a step's line after grpo_step returns and saves
the run (state.py); nothing here runs inside a step.
"""
