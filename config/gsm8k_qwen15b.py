# GRPO on GSM8K, Qwen2.5-1.5B-Instruct within 8 GB (the seed guide's target): gradient checkpointing (each
# block keeps only its input), micro-batches of 8 completions, LoRA r 16 on every projection, the frozen
# base in bf16. Standard GRPO: TracIn's per-sample hooks need each block's activations (no checkpointing).
# First, once: huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir models/qwen2.5-1.5b-instruct
#              and GSM8K's train.jsonl / test.jsonl into data/gsm8k/ (data/gsm8k/prepare.py says from where)
# python train_grpo.py config/gsm8k_qwen15b.py
# PREDICTION, not a measurement (no GPU has run this): `python -m bench.predict config/gsm8k_qwen15b.py`
# (prompts up to 200 tokens): see docs/performance.md, "Predicted memory of the Qwen configs".
out_dir = "out/gsm8k_qwen15b"
base_ckpt = "models/qwen2.5-1.5b-instruct"
task = "gsm8k"
device = "cuda"
dtype = "bfloat16"
grad_checkpoint = True
lora_r = 16
lora_alpha = 32
lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
batch_size = 2
group_size = 8
micro_batch_size = 8
max_new_tokens = 256
temperature = 0.7
learning_rate = 1e-5
min_lr = 1e-6
warmup_iters = 10
beta = 0.0
max_iters = 500
eval_interval = 100
eval_n = 200
eval_k = 1
ckpt_interval = 50
