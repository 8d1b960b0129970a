#!/usr/bin/env bash
# The Countdown demo, end to end on a laptop CPU: the base model (config/countdown_base.py, trained first if
# out/countdown_base/ckpt.pt is missing), then GRPO and TracIn-GRPO from it, then the figure (reward, test
# accuracy, selection rate, and greedy completions of the same test problems before and after):
#
#   bash experiments/countdown.sh                 # into out/countdown_demo, figure out/countdown_demo/countdown.png
#   OUT=out/cd2 SEED=1 bash experiments/countdown.sh
#
# Nothing is overwritten: an existing OUT is refused. The figure needs matplotlib (pip install matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/countdown_demo}
SEED=${SEED:-1337}
if [ -e "$OUT" ]; then echo "error: $OUT exists: remove it, or give another OUT=..." >&2; exit 2; fi
python train_grpo.py config/countdown_grpo.py --seed=$SEED --out_dir=$OUT/grpo
python train_grpo.py config/countdown_tracin.py --seed=$SEED --out_dir=$OUT/tracin
python -m analysis.summarize $OUT/grpo $OUT/tracin | tee $OUT/summary.md
if python -c "import matplotlib" 2>/dev/null; then
  python -m analysis.countdown_demo $OUT/grpo $OUT/tracin --out=$OUT/countdown.png
else
  echo "matplotlib not installed: no figure (pip install matplotlib)"
fi
