#!/usr/bin/env bash
# Experiment C, the README's headline: standard GRPO against TracIn-GRPO (validation loss nll and
# pg) with a planted defect (half the training problems carry a wrong reference answer that the
# reward trusts: the result of the base's own habit, stopping a step early), seeds 1-5, then the
# table (analysis/summarize.py) and the figure (analysis/plot.py, if matplotlib is installed) of the
# first three seeds, into OUT (copy it to assets/tracin_vs_grpo.png for the README).
#
#   bash experiments/defect.sh                  # into out/cmpC; THREADS=2 by default
#   THREADS=1 OUT=out/cmpC_t1 bash experiments/defect.sh
#
# The thread count changes float summation order and so every sampled token after the first
# difference: it is fixed here and written into the summary. The base model is trained first if
# out/base/ckpt.pt is missing (config/tiny_base.py). Re-runnable: the same command again goes on
# where it stopped (experiments/common.sh); an OUT this script did not make is refused.
cd "$(dirname "$0")/.."
source experiments/common.sh
settings 2 "1 2 3 4 5" out/cmpC
start
common=(--defect_frac=0.5 --eval_interval=25 --eval_k=1)
nll=(--tracin_val_batch_size=16 --tracin_val_loss=nll)
pg=(--tracin_val_batch_size=16 --tracin_val_loss=pg)
for S in "${seeds[@]}"; do
  train_run "$OUT/grpo_s$S" config/tiny_grpo.py --seed="$S" --beta=0.0 "${common[@]}"
  train_run "$OUT/nll_s$S" config/tiny_tracin.py --seed="$S" "${common[@]}" "${nll[@]}"
  train_run "$OUT/pg_s$S" config/tiny_tracin.py --seed="$S" "${common[@]}" "${pg[@]}"
done
runs=()
for kind in grpo nll pg; do for S in "${seeds[@]}"; do runs+=("$OUT/${kind}_s$S"); done; done
table() {
  provenance
  python -m analysis.summarize "${runs[@]}"
}
summary table
if python -c "import matplotlib" 2>/dev/null; then
  shown=("${seeds[@]:0:3}")
  dirs=() labels=()
  for S in "${shown[@]}"; do dirs+=("$OUT/grpo_s$S"); labels+=("grpo_s$S"); done
  for S in "${shown[@]}"; do dirs+=("$OUT/nll_s$S"); labels+=("tracin_nll_s$S"); done
  python -m analysis.plot "${dirs[@]}" --labels="$(IFS=,; echo "${labels[*]}")" \
    --out="$OUT/tracin_vs_grpo.png"
else
  echo "matplotlib not installed: no figure (pip install matplotlib)"
fi
