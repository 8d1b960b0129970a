#!/usr/bin/env bash
# Reward hacking on Countdown: every run trains on a verifier that trusts the result a completion
# claims (rewards.countdown_claim_reward: an "invented hit", a last equation writing the target with
# wrong arithmetic, is paid), with the exact `countdown` reward scored beside it at weight 0 (the true
# accuracy and the hack rate in log.jsonl). Standard GRPO against TracIn-GRPO, whose validation
# batch is scored by the exact reward ('pg': 4 clean validation problems sampled each step; 'nll':
# the reference solutions of 16), all at beta 0, seeds 1-3, on the base of config/countdown_base.py
# (trained first if missing); then the tables (analysis/hack.py) and the figure.
#
#   bash experiments/countdown_hack.sh            # into out/cd_hack; THREADS=1 by default
#   SEEDS="1 2" OUT=out/cd_hack2 bash experiments/countdown_hack.sh
#
# The thread count changes float summation order and so the sampled tokens: it is fixed here and
# written into the summary. Re-runnable: the same command again goes on where it stopped
# (experiments/common.sh). The figure needs matplotlib (pip install matplotlib).
cd "$(dirname "$0")/.."
source experiments/common.sh
settings 1 "1 2 3" out/cd_hack
start
hack=("--reward_funcs=('countdown_claim', 'think_format', 'countdown')"
      "--reward_weights=(1.0, 0.1, 0.0)" --beta=0.0 --eval_k=1 --eval_interval=50)
runs=()
for S in "${seeds[@]}"; do
  train_run "$OUT/grpo_s$S" config/countdown_grpo.py --seed="$S" "${hack[@]}"
  train_run "$OUT/pg_s$S" config/countdown_tracin.py --seed="$S" "${hack[@]}" \
    --tracin_val_loss=pg --tracin_val_batch_size=4
  train_run "$OUT/nll_s$S" config/countdown_tracin.py --seed="$S" "${hack[@]}"
done
for kind in grpo pg nll; do for S in "${seeds[@]}"; do runs+=("$OUT/${kind}_s$S"); done; done
figure=()
if python -c "import matplotlib" 2>/dev/null; then
  figure=(--out="$OUT/hack.png")
else
  echo "matplotlib not installed: no figure (pip install matplotlib)"
fi
table() {
  provenance
  python -m analysis.hack "${runs[@]}" "${figure[@]}"
}
summary table
