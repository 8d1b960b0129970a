# GRPO with a curriculum by difficulty (data/curriculum.py): 1-, 2-, then 3-step problems with operands
# up to 10, then up to 20 (the target), moving up a level when the mean training accuracy of the
# last 10 steps reaches curriculum_threshold. Same base, test problems and step budget as config/hard_grpo.py,
# the no-curriculum baseline; the two are compared in docs/experiments.md.
# python train_grpo.py config/hard_curriculum.py   (trains config/hard_base.py first if it is missing)
out_dir = "out/hard_curriculum"
base_ckpt = "out/hard_base/ckpt.pt"
base_config = "config/hard_base.py"
curriculum = "1:10,2:10,3:10,3:20"
curriculum_threshold = 0.5
curriculum_window = 10
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
