# TracIn-GRPO on the Countdown base (config/countdown_base.py), on a 2-core CPU: each step also takes 16
# validation problems with their searched reference solutions ('nll') and trains only on rollouts whose
# LoRA gradient has a positive inner product with theirs.
# python train_grpo.py config/countdown_tracin.py   (trains the base model first if out/countdown_base is missing)
# Measured (docs/experiments.md, Countdown from scratch): 29.8 % -> 36.8-39.4 % greedy in 150 steps (three seeds).
out_dir = "out/countdown_tracin"
base_ckpt = "out/countdown_base/ckpt.pt"
base_config = "config/countdown_base.py"
task = "countdown"
tracin = True
tracin_val_loss = "nll"
tracin_val_batch_size = 16
tracin_selection = "positive"
batch_size = 8
group_size = 8
micro_batch_size = 64
max_new_tokens = 112
max_iters = 150
learning_rate = 2e-3
beta = 0.0          # no KL term: a zero-advantage rollout has exactly zero gradient and influence
eval_interval = 75
eval_n = 500
eval_k = 4
ckpt_interval = 25
dtype = "float32"
