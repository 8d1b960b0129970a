# Base model for the tiny GRPO / TracIn demos: under a minute on a 2-core laptop CPU (docs/experiments.md,
# "The first command in about a minute").
# python train_base.py config/tiny_base.py
# It has a habit for GRPO to unlearn: greedy decoding stops one step early on nearly every test
# problem (0-3 % right), while samples at temperature 1 go on, and are right, about a third of the
# time: the signal GRPO learns from.
out_dir = "out/base"
task_steps = 2
task_max_operand = 10
task_ops = "+-"
# 70 % of training solutions stop one step early. Not near 50 %: at 0.55 the base learned a
# 55/45 split between stopping and going on, greedy decoding sat on that knife edge, and its
# accuracy moved from 12 to 55 % with the thread count (the order of float sums). At 0.7 stopping
# leads by log(0.7/0.3) = 0.85 in the logits, which rounding does not overturn.
task_noise = 0.7
n_layer = 4
n_head = 4
# 48 wide, 1200 iterations: 38 ms an iteration at 2 threads (64 wide, 1600 iterations: 48 ms and a
# third more iterations). What TracIn-GRPO reaches follows the base's pass@4 (four samples, one right),
# which grows with the training rows seen: with 32 rows a batch, or 1000 iterations, or 32 wide,
# TracIn-GRPO ended at 74-88 %; at this size pass@4 is 66-69 % and TracIn-GRPO passes 90 % in 100
# steps at 1 and 2 threads (docs/experiments.md).
n_embd = 48
block_size = 96
batch_size = 64
max_iters = 1200
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 100
eval_interval = 400
eval_n = 500
# float32 on every machine: bf16 (dtype="auto" on a CPU with AMX / AVX512-BF16) is not yet measured
# on this demo (docs/experiments.md); try it with --dtype=bfloat16
dtype = "float32"
