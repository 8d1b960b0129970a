#!/usr/bin/env bash
# A planted defect on Countdown: 20 % of the training problems carry target + 1 as their reference,
# which the reward trusts (it accepts an equation that misses the target by one and refuses the
# right one; data/defect.planted_answer). Standard GRPO (beta 0, as TracIn-GRPO) against TracIn-GRPO
# ('nll' on 16 clean validation problems), seeds 1-3, on the base of config/countdown_base.py
# (trained first if missing); then the table (analysis/summarize.py: accuracy, selection precision
# against the clean base rate).
#
#   bash experiments/countdown_defect.sh            # into out/cd_defect; THREADS=1 by default
#   SEEDS="1 2" OUT=out/cd_defect2 bash experiments/countdown_defect.sh
#
# The thread count changes float summation order and so the sampled tokens: it is fixed here and
# written into the summary. Re-runnable: the same command again goes on where it stopped
# (experiments/common.sh).
cd "$(dirname "$0")/.."
source experiments/common.sh
settings 1 "1 2 3" out/cd_defect
start
common=(--defect_frac=0.2 --beta=0.0 --eval_k=1)
runs=()
for S in "${seeds[@]}"; do
  train_run "$OUT/grpo_s$S" config/countdown_grpo.py --seed="$S" "${common[@]}"
  train_run "$OUT/nll_s$S" config/countdown_tracin.py --seed="$S" "${common[@]}"
done
for kind in grpo nll; do for S in "${seeds[@]}"; do runs+=("$OUT/${kind}_s$S"); done; done
table() {
  provenance
  python -m analysis.summarize "${runs[@]}"
}
summary table
