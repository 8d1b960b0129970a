#!/usr/bin/env bash
# The GPU measurements in one command, short enough to run twice on a machine held for 15 minutes
# (each part has a time limit of its own: one that hangs costs its limit, not the rest):
#   1. tests/test_cuda.py                    the CUDA tests (the captured decode step: the eager tokens, no
#                                            cudagraph skipped, one graph for the prompt lengths of a bucket)
#   2. python -m bench --rows=vs_generate --compile=reduce-overhead
#                                            sampling against transformers' generate (float32, bf16): eager, and
#                                            the decode step captured in CUDA graphs (what compile=auto chooses
#                                            for a long run on a GPU), its capture seconds beside the saving
#   3. python -m bench --rows=limits         a standard step's passes against their matmul limit
#   4. three steps of config/gsm8k_qwen15b.py on a Qwen2.5-1.5B-shaped directory with random weights
#      (bench/qwen_dir.py: nothing downloaded), Countdown prompts built offline, the decode step captured
#      (--compile=True: a 3-step run alone is one compile=auto keeps eager, and says so); then
#      bench/step_limit.py: per step its seconds, ms a decode step against reading the weights once,
#      the policy pass against its matmul limit, peak memory (the 1.5B row of docs/performance.md)
# usage: bash bench/gpu.sh [OUT]   (OUT: where the model directory and the run go; default /tmp/gpu_bench)
#   PYTHON: the interpreter every part runs with (default: the `python` on PATH)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/gpu_bench}
PYTHON=${PYTHON:-python}
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'bench/gpu.sh needs a CUDA GPU')" || exit 1
"$PYTHON" -c "import transformers, tokenizers" 2>/dev/null || "$PYTHON" -m pip install -q transformers tokenizers
mkdir -p "$OUT"
echo "== $("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(), "torch", torch.__version__)'); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
part() {  # part SECONDS TITLE COMMAND...: the command's last lines and its seconds, killed past SECONDS
  local limit=$1 title=$2 t0=$SECONDS
  shift 2
  echo "== $title"
  timeout "$limit" "$@" 2>&1 | tail -30
  echo "   ($((SECONDS - t0)) s, exit ${PIPESTATUS[0]})"
}
part 120 "CUDA tests" "$PYTHON" -m pytest -q tests/test_cuda.py
part 180 "sampling vs transformers' generate, eager and captured" \
  "$PYTHON" -m bench --device=cuda --rows=vs_generate --compile=reduce-overhead
part 60 "a standard step against its matmul limit" "$PYTHON" -m bench --device=cuda --rows=limits
"$PYTHON" -m bench.qwen_dir "$OUT/qwen15b"
rm -rf "$OUT/run"
"$PYTHON" -c "from scale.compiled import choose; print('config/gsm8k_qwen15b.py as it is:', choose(None, 'cuda', 500, 256, 28)[1])"
part 240 "three 1.5B-shaped steps, decode step captured" \
  "$PYTHON" train_grpo.py config/gsm8k_qwen15b.py --base_ckpt="$OUT/qwen15b" --task=countdown --compile=True \
  --max_iters=3 --eval_n=8 --eval_interval=100 --ckpt_interval=3 --out_dir="$OUT/run"
part 60 "the 1.5B-shaped steps against their limits" "$PYTHON" -m bench.step_limit "$OUT/run" --device=cuda
