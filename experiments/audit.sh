#!/usr/bin/env bash
# The audit of experiment C's runs (analysis.attribute --audit, analysis/audit.py): for each run of
# experiments/defect.sh, the first 16 wrong greedy test answers, every trained rollout ranked by its
# summed TracIn influence on them, and how well that finds the planted defect's rewarded rollouts;
# the contrast test loss on the standard runs; variants on one run (more wrong answers,
# layer_filter); then the table (experiments/audit_table.py, which also re-weights the checkpoints).
#
#   bash experiments/audit.sh         # reads out/cmpC, writes out/audit; THREADS=1 by default
#
# Re-runnable: the same command again skips the audits already written (experiments/common.sh); an
# OUT this script did not make is refused.
cd "$(dirname "$0")/.."
source experiments/common.sh
settings 1 "1 2 3 4 5" out/audit
RUNS=${RUNS:-out/cmpC}
VARIANT_RUN=${VARIANT_RUN:-grpo_s3}
check_name RUNS "$RUNS"
[ -d "$RUNS" ] || fail "RUNS=$RUNS is not a directory: give the OUT of experiments/defect.sh," \
  "e.g. RUNS=out/cmpC"
[[ "$VARIANT_RUN" =~ ^(grpo|nll|pg)_s[0-9]+$ ]] \
  || fail "VARIANT_RUN=\"$VARIANT_RUN\" is not allowed: give a run of experiments/defect.sh," \
    "e.g. VARIANT_RUN=grpo_s3"
start
for run in "$VARIANT_RUN" $(for S in "${seeds[@]}"; do echo "grpo_s$S nll_s$S pg_s$S"; done); do
  [ -d "$RUNS/$run" ] || fail "RUNS=$RUNS holds no run $run: give the OUT of" \
    "experiments/defect.sh run with these SEEDS, e.g. RUNS=out/cmpC"
done
audit() {  # audit RUN NAME ARGS...: one audit, its JSON only; one already written is kept
  local run=$1 name=$2
  shift 2
  local json="$OUT/${run}__$name.json"
  if json_done "$json"; then echo "== $json: written before, kept"; return; fi
  python -m analysis.attribute --out_dir="$RUNS/$run" --out_json="$json" --html= --figure= "$@" | tail -4
}
for S in "${seeds[@]}"; do audit "grpo_s$S" audit16 --audit=16; done
for S in "${seeds[@]}"; do audit "grpo_s$S" contrast16 --audit=16 --audit_loss=contrast; done
audit "$VARIANT_RUN" audit64 --audit=64
audit "$VARIANT_RUN" audit_all --audit=100000
for layers in attn mlp h.3.; do
  audit "$VARIANT_RUN" "layers_$layers" --audit=16 --layer_filter="$layers"
done
for kind in nll pg; do for S in "${seeds[@]}"; do audit "${kind}_s$S" audit16 --audit=16; done; done
table() {
  provenance
  python experiments/audit_table.py "$OUT"/*.json
}
summary table
