# Base model for the curriculum experiment: problems of 1 to 3 operations, operands up to 10.
# python train_base.py config/hard_base.py
# Stopped early, and with a stop-early habit in its data (55 %): it solves about
# all the 1-step problems, a fifth of the 2- and 3-step ones and fewer with operands up to 20 (docs/experiments.md, curriculum).
out_dir = "out/hard_base"
task_steps = 3
task_min_steps = 1
task_max_operand = 10
task_ops = "+-"
task_noise = 0.55   # of the 2- and 3-step training solutions, 55 % stop one step early
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
