# Base model for the Countdown demo, trained from scratch on reference solutions that show a search
# (data/countdown/solutions.py): 3 numbers from 1..10, targets up to 100. 29.8 % greedy after about 5 minutes
# on a 2-core CPU (docs/experiments.md, Countdown from scratch): GRPO has room to gain.
# python train_base.py config/countdown_base.py
# With --countdown_check=True --countdown_ordered=True --max_new_tokens=128 --block_size=160 (each try
# beside the target, tries walked in order): 39.6 %, and GRPO gains 5-11 points (docs/experiments.md).
# Adding --countdown_closest=True --max_iters=1600 (each try to its nearest last step): 44.6 % in
# 9.4 minutes, GRPO +2.2 to +3.4 points (docs/experiments.md).
out_dir = "out/countdown_base"
task = "countdown"
countdown_numbers = 3
countdown_max_number = 10
countdown_max_target = 100
countdown_max_misses = 3
countdown_variants = 8      # each training problem written 8 times, each with its own searched solution
n_train = 1800
n_layer = 4
n_head = 4
n_embd = 128
batch_size = 32
max_iters = 2000
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 50
log_interval = 50
eval_interval = 1000
eval_n = 500
max_new_tokens = 112
block_size = 144
dtype = "float32"
