#!/usr/bin/env bash
# Experiment C, the README's headline: standard GRPO against TracIn-GRPO (validation loss nll and pg)
# with a planted defect (20 % of training prompts carry a wrong reference answer the reward trusts),
# seeds 1-5, then the table (analysis/summarize.py) and the figure (analysis/plot.py, if matplotlib is installed).
#
#   bash experiments/defect.sh                  # into out/cmpC; THREADS=2 by default
#   THREADS=1 OUT=out/cmpC_t1 bash experiments/defect.sh
#
# The thread count changes float summation order and so every sampled token after the first
# difference: it is fixed here and written into the summary. The base model is trained first if
# out/base/ckpt.pt is missing (config/tiny_base.py). Nothing is overwritten: an existing OUT is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
OUT=${OUT:-out/cmpC}
SEEDS=${SEEDS:-"1 2 3 4 5"}
if [ -e "$OUT" ]; then echo "error: $OUT exists: remove it, or give another OUT=..." >&2; exit 2; fi
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
common="--defect_frac=0.2 --eval_interval=25 --eval_k=1"
for S in $SEEDS; do
  python train_grpo.py config/tiny_grpo.py --seed=$S --beta=0.0 $common --out_dir=$OUT/grpo_s$S
  python train_grpo.py config/tiny_tracin.py --seed=$S $common --tracin_val_batch_size=16 --tracin_val_loss=nll --out_dir=$OUT/nll_s$S
  python train_grpo.py config/tiny_tracin.py --seed=$S $common --tracin_val_batch_size=16 --tracin_val_loss=pg --out_dir=$OUT/pg_s$S
done
runs=$(for kind in grpo nll pg; do for S in $SEEDS; do printf '%s ' "$OUT/${kind}_s$S"; done; done)
{
  echo "experiments/defect.sh, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F), $THREADS threads,"
  echo "torch $(python -c 'import torch; print(torch.__version__)'), CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
  echo
  python -m analysis.summarize $runs
} > "$OUT/summary.md"
cat "$OUT/summary.md"
if python -c "import matplotlib" 2>/dev/null; then
  python -m analysis.plot $OUT/grpo_s1 $OUT/grpo_s2 $OUT/grpo_s3 $OUT/nll_s1 $OUT/nll_s2 $OUT/nll_s3 \
    --labels=grpo_s1,grpo_s2,grpo_s3,tracin_nll_s1,tracin_nll_s2,tracin_nll_s3 --out=assets/tracin_vs_grpo.png
else
  echo "matplotlib not installed: no figure (pip install matplotlib)"
fi
