#!/usr/bin/env bash
# The defect curve: standard GRPO and TracIn-GRPO (validation loss nll and pg) against the share of
# the training problems planted (defect_frac: a wrong reference answer the reward trusts, as in
# experiment C), seeds paired across methods and shares, one thread a run (JOBS runs at a time);
# then the audit of every standard run with a defect (analysis.attribute --audit=16: does post-hoc
# TracIn find the defect's rewarded rollouts?), the tables (experiments/curve_table.py) into
# OUT/summary.md and the figure OUT/defect_curve.png (copy it to assets/ for the README).
#
#   bash experiments/defect_curve.sh          # into out/curve: shares 0 0.2 0.4 0.6 0.8, seeds 1-3
#   SHARES="0 0.5" SEEDS=1 EXTRA="--max_iters=10" OUT=out/c bash experiments/defect_curve.sh
#   KINDS="topk_dot topk_cos" bash experiments/defect_curve.sh   # 'topk' ranked by dot or cosine
#
# KINDS: the methods, of grpo, nll, pg (default: the three) and topk_dot, topk_cos (nll with
# tracin_selection='topk', the top quarter, ranked by <g_i, G> or by the cosine).
# EXTRA: more train_grpo.py arguments for every run (the base, fewer steps). The thread count
# changes float summation order and so every sampled token after the first difference: it is fixed
# here and written into the summary. Re-runnable: the same command again goes on where it stopped
# (experiments/common.sh); an OUT this script did not make is refused.
cd "$(dirname "$0")/.."
source experiments/common.sh
settings 1 "1 2 3" out/curve
SHARES=${SHARES:-"0 0.2 0.4 0.6 0.8"}
JOBS=${JOBS:-2}
KINDS=${KINDS:-"grpo nll pg"}
check_int JOBS "$JOBS" 1
read -ra kinds <<< "$KINDS"
for k in "${kinds[@]}"; do
  [[ "$k" =~ ^(grpo|nll|pg|topk_dot|topk_cos)$ ]] || fail "KINDS=\"$KINDS\" is not allowed: \"$k\"" \
    "is none of grpo, nll, pg, topk_dot, topk_cos"
done
read -ra shares <<< "$SHARES"
[ "${#shares[@]}" -gt 0 ] || fail "SHARES is empty: give shares from 0 to 1, e.g. SHARES=\"0 0.5\""
for f in "${shares[@]}"; do
  [[ "$f" =~ ^(0|1|0\.[0-9]+|1\.0+)$ ]] || fail "SHARES=\"$SHARES\" is not allowed: \"$f\" is not a" \
    "share from 0 to 1 written as 0, 1 or 0.x, e.g. SHARES=\"0 0.5\""
done
read -ra extra <<< "${EXTRA:-}"
start
common=(--eval_interval=25 --eval_k=1)
one() {  # one KIND SEED SHARE: a run, its console into its .txt
  local kind=$1 S=$2 f=$3 dir="$OUT/${1}_f${3}_s$2"
  case $kind in
    grpo) train_run "$dir" config/tiny_grpo.py --seed="$S" --beta=0.0 --defect_frac="$f" "${common[@]}" \
      "${extra[@]}" ;;
    nll|pg) train_run "$dir" config/tiny_tracin.py --seed="$S" --defect_frac="$f" "${common[@]}" \
      --tracin_val_batch_size=16 --tracin_val_loss="$kind" "${extra[@]}" ;;
    topk_*) local ranking=${kind#topk_}
      train_run "$dir" config/tiny_tracin.py --seed="$S" --defect_frac="$f" "${common[@]}" \
      --tracin_val_batch_size=16 --tracin_val_loss=nll --tracin_selection=topk \
      --tracin_topk_frac=0.25 --tracin_ranking="${ranking/cos/cosine}" "${extra[@]}" ;;
  esac > "$dir.txt" 2>&1
}
audit() {  # audit RUN: its audit JSON; one written before is kept
  local json="$OUT/$1__audit16.json"
  json_done "$json" && return
  python -m analysis.attribute --out_dir="$OUT/$1" --out_json="$json" --html= --figure= --audit=16 \
    > "$OUT/$1__audit16.txt" 2>&1
}
pool() {  # pool CMD...: CMD in the background, at most JOBS at a time; a failure stops the script
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || fail "a run failed: its .txt in $OUT says why"; done
  "$@" &
}
drain() {
  while [ -n "$(jobs -rp)" ]; do wait -n || fail "a run failed: its .txt in $OUT says why"; done
}
first=1
for S in "${seeds[@]}"; do for f in "${shares[@]}"; do for kind in "${kinds[@]}"; do
  echo "== ${kind}_f${f}_s$S"
  if [ -n "$first" ]; then  # alone: it trains the base if it is missing, before any other run reads it
    one "$kind" "$S" "$f" || fail "a run failed: $OUT/${kind}_f${f}_s$S.txt says why"
    first=""
  else
    pool one "$kind" "$S" "$f"
  fi
done; done; done
drain
[[ " ${kinds[*]} " == *" grpo "* ]] && for S in "${seeds[@]}"; do for f in "${shares[@]}"; do
  [ "$f" = 0 ] || { echo "== audit grpo_f${f}_s$S"; pool audit "grpo_f${f}_s$S"; }
done; done
drain
table() {
  provenance
  python experiments/curve_table.py "$OUT"
}
summary table
