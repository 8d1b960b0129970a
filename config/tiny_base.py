# Base model for the tiny GRPO / TracIn demos: trains in about a minute on a 2-core CPU.
# python train_base.py config/tiny_base.py
# Deliberately stopped early: greedy test accuracy lands well below 100 %, leaving room for RL.
out_dir = "out/base"
task_steps = 2
task_max_operand = 10
task_ops = "+-"
task_noise = 0.55   # 55 % of training solutions stop one step early: a habit GRPO must unlearn
n_layer = 4
n_head = 4
n_embd = 64
block_size = 96
batch_size = 64
max_iters = 800
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 100
eval_interval = 400
eval_n = 500
# float32 on every machine: bf16 (dtype="auto" on a CPU with AMX / AVX512-BF16) is not yet measured
# on this demo (docs/experiments.md); try it with --dtype=bfloat16
dtype = "float32"
