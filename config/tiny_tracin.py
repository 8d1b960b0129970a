# TracIn-GRPO on the tiny task, on a 2-core CPU: each step also takes a validation batch (16 val
# prompts with their clean reference solutions), captures per-sample LoRA gradients with hooks,
# and trains only on rollouts whose gradient has a positive inner product with the summed
# validation gradient.
# python train_grpo.py config/tiny_tracin.py   (trains the base model first if out/base is missing)
out_dir = "out/tracin"
base_ckpt = "out/base/ckpt.pt"
base_config = "config/tiny_base.py"
tracin = True
tracin_val_loss = "nll"      # NLL of reference solutions: no validation sampling (docs/experiments.md compares 'pg')
tracin_val_batch_size = 16   # with 4 sampled val prompts the influence was mostly noise (docs/experiments.md, A)
tracin_selection = "positive"
batch_size = 8
group_size = 8
micro_batch_size = 64
max_new_tokens = 40
max_iters = 100
learning_rate = 2e-3
beta = 0.0          # no KL term: then a zero-advantage rollout has exactly zero gradient and influence
eval_interval = 50
eval_n = 500
ckpt_interval = 25
# float32 on every machine: bf16 (dtype="auto" on a CPU with AMX / AVX512-BF16) reaches the same accuracy
# on this demo but runs 1.44x slower per step at this size (docs/experiments.md, half precision)
dtype = "float32"
