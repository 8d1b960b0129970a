#!/usr/bin/env bash
# The README's first command at several thread counts: the base (config/tiny_base.py) trained at
# each, then TracIn-GRPO (config/tiny_tracin.py) on that base, as `python train_grpo.py
# config/tiny_tracin.py` does from a fresh clone; then a table of both accuracies and times.
#
#   bash experiments/threads.sh                 # into out/threads; THREADS="1 2" by default
#   THREADS="1 2 4" OUT=out/threads4 bash experiments/threads.sh
#
# The thread count changes the order of float sums, so each count trains its own base and draws
# its own rollouts: the table shows how far the demo's accuracies move with it (docs/experiments.md,
# "The same demo at 1 and 2 threads"). Runs go one after another (timing them side by side would
# share the cores). Re-runnable: the same command again goes on where it stopped
# (experiments/common.sh); an OUT this script did not make is refused.
cd "$(dirname "$0")/.."
source experiments/common.sh
THREADS=${THREADS:-1 2} OUT=${OUT:-out/threads}
read -ra counts <<< "$THREADS"  # split on spaces only: no file name pattern is expanded
[ "${#counts[@]}" -gt 0 ] || fail "THREADS=\"$THREADS\" is not allowed: give thread counts" \
  "separated by spaces, e.g. THREADS=\"1 2\""
seen=" "
for n in "${counts[@]}"; do
  is_int "$n" 1 || fail "THREADS=\"$THREADS\" is not allowed: \"$n\" is not a whole number from" \
    "1 to 999999999; give thread counts separated by spaces, e.g. THREADS=\"1 2\""
  [[ "$seen" != *" $n "* ]] || fail "THREADS=\"$THREADS\" is not allowed: $n is given twice" \
    "(its runs would share a directory); give each thread count once"
  seen+="$n "
done
own_out

# base_run DIR: config/tiny_base.py into DIR (resumed where DIR holds ckpt.pt: a finished run ends
# at once and prints its line again); its output also into DIR.log, for the table
base_run() {
  local dir=$1 resume=()
  [ ! -f "$dir/ckpt.pt" ] || resume=(--init_from=resume)
  PYTHONUNBUFFERED=1 python train_base.py config/tiny_base.py --out_dir="$dir" "${resume[@]}" \
    | tee "$dir.log"
}

for n in "${counts[@]}"; do
  export OMP_NUM_THREADS=$n MKL_NUM_THREADS=$n
  echo "== $n thread(s)"
  base_run "$OUT/base_t$n"
  train_run "$OUT/tracin_t$n" config/tiny_tracin.py --base_ckpt="$OUT/base_t$n/ckpt.pt"
done

table() {
  THREADS=$(IFS=,; echo "${counts[*]}")  # for provenance's line
  provenance
  echo "Base (config/tiny_base.py), last line of each run:"
  echo
  for n in "${counts[@]}"; do
    echo "- $n thread(s): $(grep -h '^done:' "$OUT/base_t$n.log" 2>/dev/null | tail -1)"
  done
  echo
  echo "TracIn-GRPO (config/tiny_tracin.py) on each base; test acc start is the base's:"
  echo
  local runs=()
  for n in "${counts[@]}"; do runs+=("$OUT/tracin_t$n"); done
  python -m analysis.summarize "${runs[@]}"
}
summary table
