# GRPO on 3-step problems with operands up to 20 (the base solves about 1 in 10), straight away:
# the no-curriculum baseline of config/hard_curriculum.py (same base, test problems, step budget).
# python train_grpo.py config/hard_grpo.py   (trains config/hard_base.py first if it is missing)
out_dir = "out/hard_grpo"
base_ckpt = "out/hard_base/ckpt.pt"
base_config = "config/hard_base.py"
curriculum = "3:20"          # one level: every training problem is a target problem
batch_size = 8
group_size = 8
micro_batch_size = 64
max_new_tokens = 48
max_iters = 400
learning_rate = 2e-3
beta = 0.0
eval_interval = 100
eval_n = 500
eval_k = 1
ckpt_interval = 100
# float32 on every machine: bf16 (dtype="auto" on a CPU with AMX / AVX512-BF16) is not yet measured
# on this demo (docs/experiments.md); try it with --dtype=bfloat16
dtype = "float32"
