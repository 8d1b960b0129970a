"""What the knobs of the two training scripts may be, checked before any work or any file is written:
one line naming the key, the value and what is allowed (a typo'd key or a wrong type is caught earlier,
by configurator.configure).

    grpo_knobs.py  train_grpo.py's knobs (validate), the reward functions it resolves, the questions'
                   lengths against the base's context
    base_knobs.py  train_base.py's resume (the saved shape and data), what its model and evaluation
                   cache may allocate, and a checkpoint that loads before it replaces ckpt.pt

Where it plugs in: train_grpo.main and train_base.main call them once, after the config is read.
"""
