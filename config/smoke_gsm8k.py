# CPU smoke run of the gsm8k task end to end on a tiny model directory: prepare, sample, reward, GRPO with
# TracIn, then analysis.attribute and export.py on the run (tests/test_smoke.py makes the directory and runs it all).
# python train_grpo.py config/smoke_gsm8k.py --base_ckpt=DIR   (rewards may be all zero on a random model)
out_dir = "out/smoke_gsm8k"
task = "gsm8k"
device = "cpu"
dtype = "float32"
lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
batch_size = 2
group_size = 4
max_new_tokens = 24
micro_batch_size = 8
tracin = True
tracin_val_loss = "nll"
tracin_val_batch_size = 2
max_iters = 3
eval_interval = 3
eval_n = 4
eval_k = 2
ckpt_interval = 1
