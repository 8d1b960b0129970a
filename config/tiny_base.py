# Base model for the tiny GRPO / TracIn demos: about a minute on a laptop CPU (71 s at 2 threads,
# 187 s at 1 on a shared 2-core Xeon: docs/experiments.md, "The same demo at 1 and 2 threads").
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
n_embd = 64
block_size = 96
batch_size = 64
# 1600, not 800: only 30 % of the solutions show the second step. At 800 iterations four samples
# held a right answer for 15 % of the test problems (pass@4) and TracIn-GRPO reached 20 %; at 1600
# for 75 %, and TracIn-GRPO ends at 97 % within a point at 1 and 2 threads (1200: 5 points apart).
max_iters = 1600
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 100
eval_interval = 400
eval_n = 500
# float32 on every machine: bf16 (dtype="auto" on a CPU with AMX / AVX512-BF16) is not yet measured
# on this demo (docs/experiments.md); try it with --dtype=bfloat16
dtype = "float32"
