# GRPO with TracIn selection on GSM8K, Qwen2.5-0.5B-Instruct on one GPU, with the GRPO tutorial's
# LoRA (r 16, alpha 32) on every projection and the memory guide's batch (2 prompts x 8 completions).
# First, once: huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir models/qwen2.5-0.5b-instruct
#              and GSM8K's train.jsonl / test.jsonl into data/gsm8k/ (data/gsm8k/prepare.py says from where)
# python train_grpo.py config/gsm8k_qwen05b.py
# PREDICTIONS, not measurements (no GPU has run this): `python -m bench.predict config/gsm8k_qwen05b.py`
# (prompts up to 200 tokens) gives a peak of 16.1 GB (1.0 GB of bf16 weights, 0.1 GB LoRA with AdamW, 14.9 GB
# for the policy pass at micro_batch_size 16), TracIn's captured activations not counted; a step about 2-4 s
# on an H100 (256 decode steps of 16 rows dominate). config/gsm8k_qwen15b.py fits the 1.5B model in 8 GB.
out_dir = "out/gsm8k_qwen05b"
base_ckpt = "models/qwen2.5-0.5b-instruct"
task = "gsm8k"
device = "cuda"
dtype = "bfloat16"
lora_r = 16
lora_alpha = 32
lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
batch_size = 2
group_size = 8
micro_batch_size = 16
max_new_tokens = 256
temperature = 0.7          # the tutorial's sampling temperature
learning_rate = 2e-5
min_lr = 2e-6
warmup_iters = 10
beta = 0.0                 # no KL term: a zero-advantage rollout has exactly zero gradient and influence
tracin = True
tracin_val_loss = "nll"    # the validation gradient of GSM8K's reference solutions
tracin_val_batch_size = 4
max_iters = 500
eval_interval = 100
eval_n = 200
eval_k = 1
ckpt_interval = 50
