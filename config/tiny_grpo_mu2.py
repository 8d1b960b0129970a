# Standard GRPO on the tiny task reusing each generation for two AdamW steps (num_iterations = 2,
# DeepSeekMath's mu; TRL's num_iterations): the old log-probs are taken once after sampling, so the
# second update sees ratios != 1 and the epsilon clip acts (clip_ratio/low, clip_ratio/high in log.jsonl).
# python train_grpo.py config/tiny_grpo_mu2.py   (trains the base model first if out/base is missing)
out_dir = "out/grpo_mu2"
base_ckpt = "out/base/ckpt.pt"
base_config = "config/tiny_base.py"
num_iterations = 2
loss_type = "dapo"          # TRL's default aggregation: per token of the whole batch
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
