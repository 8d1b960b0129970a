# GRPO with LoRA on the tiny base model, on a 2-core CPU.
# python train_grpo.py config/tiny_grpo.py   (trains the base model first if out/base is missing)
out_dir = "out/grpo"
base_ckpt = "out/base/ckpt.pt"
base_config = "config/tiny_base.py"
batch_size = 8
group_size = 8
micro_batch_size = 64
max_new_tokens = 40
max_iters = 100
learning_rate = 2e-3
beta = 0.04
eval_interval = 50
eval_n = 500
ckpt_interval = 25
# float32 on every machine: bf16 (dtype="auto" on a CPU with AMX / AVX512-BF16) is not yet measured
# on this demo (docs/experiments.md); try it with --dtype=bfloat16
dtype = "float32"
