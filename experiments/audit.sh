#!/usr/bin/env bash
# The audit of experiment C's runs (tracin.py --audit, analysis/audit.py): for each run of experiments/defect.sh, the
# first 16 wrong greedy test answers, every trained rollout ranked by its summed TracIn influence on them, and
# how well that finds the planted defect's rewarded rollouts; the contrast test loss on the standard runs;
# variants on one run (more wrong answers, layer_filter); then the table (experiments/audit_table.py, which
# also re-weights the checkpoints).
#
#   bash experiments/audit.sh                  # reads out/cmpC, writes out/audit; THREADS=1 by default
#
# Nothing is overwritten: an existing OUT is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-1}
RUNS=${RUNS:-out/cmpC}
OUT=${OUT:-out/audit}
SEEDS=${SEEDS:-"1 2 3 4 5"}
VARIANT_RUN=${VARIANT_RUN:-grpo_s3}
if [ -e "$OUT" ]; then echo "error: $OUT exists: remove it, or give another OUT=..." >&2; exit 2; fi
mkdir -p "$OUT"
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
audit() {  # audit RUN NAME ARGS...: one audit, its JSON only
  local run=$1 name=$2; shift 2
  python tracin.py --out_dir="$RUNS/$run" --out_json="$OUT/${run}__$name.json" --html= --figure= "$@" | tail -4
}
for S in $SEEDS; do audit grpo_s$S audit16 --audit=16; done
for S in $SEEDS; do audit grpo_s$S contrast16 --audit=16 --audit_loss=contrast; done
audit "$VARIANT_RUN" audit64 --audit=64
audit "$VARIANT_RUN" audit_all --audit=100000
for layers in attn mlp h.3.; do audit "$VARIANT_RUN" "layers_$layers" --audit=16 --layer_filter=$layers; done
for kind in nll pg; do for S in $SEEDS; do audit ${kind}_s$S audit16 --audit=16; done; done
{
  echo "experiments/audit.sh, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F), $THREADS thread(s),"
  echo "torch $(python -c 'import torch; print(torch.__version__)'), CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
  echo
  python experiments/audit_table.py "$OUT"/*.json
} > "$OUT/summary.md"
cat "$OUT/summary.md"
