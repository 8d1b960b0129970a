# GRPO on Countdown (TinyZero, nano-aha-moment), Qwen2.5-1.5B-Instruct on one GPU: reward 1 for an
# <answer> equation that makes the target from every given number once, 0.1 for the <think>/<answer>
# format; LoRA r 16, alpha 32 on every projection.
# First, once: huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir models/qwen2.5-1.5b-instruct
# python train_grpo.py config/countdown_qwen15b.py        (the problems are generated offline)
# PREDICTIONS, not measurements (no GPU has run this): `python -m bench.predict config/countdown_qwen15b.py`
# (prompts up to 200 tokens) gives a peak of 25.4 GB (3.1 GB of bf16 weights, 0.3 GB LoRA with AdamW, 22.0 GB
# for the policy pass at micro_batch_size 8; --grad_checkpoint=True: 8.3 GB); a step about 4-8 s on an H100
# (512 decode steps dominate).
out_dir = "out/countdown_qwen15b"
base_ckpt = "models/qwen2.5-1.5b-instruct"
task = "countdown"
device = "cuda"
dtype = "bfloat16"
lora_r = 16
lora_alpha = 32
lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
batch_size = 2
group_size = 8
micro_batch_size = 8
max_new_tokens = 512
temperature = 1.0
learning_rate = 2e-5
min_lr = 2e-6
warmup_iters = 10
beta = 0.001
mask_truncated_completions = True   # an unfinished <think> earns no format credit: learn nothing from it
max_iters = 500
eval_interval = 100
eval_n = 200
eval_k = 1
ckpt_interval = 50
