#!/usr/bin/env bash
# The GPU measurements in one command, short enough to run twice on a machine held for 15 minutes
#   1. tests/test_cuda.py                       the CUDA tests
#   2. python -m bench --rows=vs_generate,limits  sampling against transformers' generate (float32, bf16),
#                                               and a standard step against its matmul limit
#   3. three steps of config/gsm8k_qwen15b.py on a Qwen2.5-1.5B-shaped directory with random weights
#      (bench/qwen_dir.py: nothing downloaded), Countdown prompts built offline; its log's times and
#      peak memory (mem_max_alloc_mb) are the 1.5B row of docs/performance.md
# usage: bash bench/gpu.sh [OUT]   (OUT: where the model directory and the run go; default /tmp/gpu_bench)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/gpu_bench}
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'bench/gpu.sh needs a CUDA GPU')"
python -c "import transformers, tokenizers" 2>/dev/null || python -m pip install -q transformers tokenizers
mkdir -p "$OUT"
echo "== $(python -c 'import torch; print(torch.cuda.get_device_name(), "torch", torch.__version__)'); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
python -m pytest -q tests/test_cuda.py 2>&1 | tail -3
python -m bench --device=cuda --rows=vs_generate,limits 2>&1 | tail -25
python -m bench.qwen_dir "$OUT/qwen15b"
rm -rf "$OUT/run"
python train_grpo.py config/gsm8k_qwen15b.py --base_ckpt="$OUT/qwen15b" --task=countdown \
  --max_iters=3 --eval_n=8 --eval_interval=100 --out_dir="$OUT/run" 2>&1 | tail -8
python - "$OUT/run/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if '"loss"' in line]
print("step | total s | generation s | policy s | peak MB")
for r in rows:
    print(f"{r['iter']:4d} | {r['step_seconds']:7.2f} | {r['time/generation']:12.2f} | "
          f"{r['time/policy']:8.2f} | {r['mem_max_alloc_mb']:7.0f}")
PY
