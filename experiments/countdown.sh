#!/usr/bin/env bash
# The Countdown demo, end to end on a laptop CPU: the base model (config/countdown_base.py, trained
# first if out/countdown_base/ckpt.pt is missing), then GRPO and TracIn-GRPO from it, then the
# figure (reward, test accuracy, selection rate, and greedy completions of the same test problems
# before and after):
#
#   bash experiments/countdown.sh     # into out/countdown_demo (figure: countdown.png there)
#   OUT=out/cd2 SEED=1 bash experiments/countdown.sh
#
# Re-runnable: the same command again goes on where it stopped (experiments/common.sh); an OUT this
# script did not make is refused. The figure needs matplotlib (pip install matplotlib).
cd "$(dirname "$0")/.."
source experiments/common.sh
OUT=${OUT:-out/countdown_demo}
SEED=${SEED:-1337}
check_int SEED "$SEED"
own_out
train_run "$OUT/grpo" config/countdown_grpo.py --seed="$SEED"
train_run "$OUT/tracin" config/countdown_tracin.py --seed="$SEED"
summary python -m analysis.summarize "$OUT/grpo" "$OUT/tracin"
if python -c "import matplotlib" 2>/dev/null; then
  python -m analysis.countdown_demo "$OUT/grpo" "$OUT/tracin" --out="$OUT/countdown.png"
else
  echo "matplotlib not installed: no figure (pip install matplotlib)"
fi
