# Base model for the GPU TracIn demo (config/gpu_tracin.py): a 6-layer, 384-wide GPT (~10.7 M
# parameters) on a harder task, 3-step problems with operands up to 30, bf16 autocast on CUDA.
# python train_base.py config/gpu_base.py   (37 s on an H100: docs/experiments.md)
# It is deliberately stopped early (and trained on 55 % early-stopping solutions), so that RL has
# room to improve it.
out_dir = "out/gpu_base"
device = "cuda"
dtype = "bfloat16"
task_steps = 3
task_max_operand = 30
task_ops = "+-"
task_noise = 0.55
n_train = 50000
n_layer = 6
n_head = 6
n_embd = 384
block_size = 160
batch_size = 128
max_iters = 1500
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
eval_interval = 500
eval_n = 500
max_new_tokens = 64
