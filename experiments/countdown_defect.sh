#!/usr/bin/env bash
# A planted defect on Countdown: 20 % of the training problems carry target + 1 as their reference, which
# the reward trusts (it accepts an equation that misses the target by one and refuses the right one;
# data/tasks.planted_answer). Standard GRPO (beta 0, as TracIn-GRPO) against TracIn-GRPO ('nll' on 16
# clean validation problems), seeds 1-3, on the base of config/countdown_base.py (trained first if missing);
# then the table (analysis/summarize.py: accuracy, selection precision against the clean base rate).
#
#   bash experiments/countdown_defect.sh            # into out/cd_defect; THREADS=1 by default
#
# The thread count changes float summation order and so the sampled tokens: it is fixed here and written
# into the summary. Nothing is overwritten: an existing OUT is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-1}
OUT=${OUT:-out/cd_defect}
SEEDS=${SEEDS:-"1 2 3"}
if [ -e "$OUT" ]; then echo "error: $OUT exists: remove it, or give another OUT=..." >&2; exit 2; fi
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
common="--defect_frac=0.2 --beta=0.0 --eval_k=1"
for S in $SEEDS; do
  python train_grpo.py config/countdown_grpo.py --seed=$S $common --out_dir=$OUT/grpo_s$S
  python train_grpo.py config/countdown_tracin.py --seed=$S $common --out_dir=$OUT/nll_s$S
done
runs=$(for kind in grpo nll; do for S in $SEEDS; do printf '%s ' "$OUT/${kind}_s$S"; done; done)
{
  echo "experiments/countdown_defect.sh, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F), $THREADS threads,"
  echo "torch $(python -c 'import torch; print(torch.__version__)'), CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
  echo
  python -m analysis.summarize $runs
} > "$OUT/summary.md"
cat "$OUT/summary.md"
