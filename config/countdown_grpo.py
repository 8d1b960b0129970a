# GRPO with LoRA on the Countdown base (config/countdown_base.py), on a 2-core CPU: reward 1 for an
# <answer> that makes the target from every number once, 0.1 for the <think>...</think><answer>...</answer>
# format (data/tasks.py: countdown + think_format).
# python train_grpo.py config/countdown_grpo.py   (trains the base model first if out/countdown_base is missing)
# Measured (docs/experiments.md, Countdown from scratch): greedy test accuracy 29.8 % -> 37.0-39.0 % in 150
# steps (three seeds), about 1 s a step on a free 2-core CPU; the +25 points aimed at are not reached.
out_dir = "out/countdown_grpo"
base_ckpt = "out/countdown_base/ckpt.pt"
base_config = "config/countdown_base.py"
task = "countdown"
batch_size = 8
group_size = 8
micro_batch_size = 64
max_new_tokens = 112
max_iters = 150
learning_rate = 2e-3
beta = 0.04
eval_interval = 75
eval_n = 500
eval_k = 4
ckpt_interval = 25
dtype = "float32"
