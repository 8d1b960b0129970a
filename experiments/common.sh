# Sourced by experiments/*.sh: their arguments checked before any work, and runs that go on where
# they stopped. The same command again after Ctrl-C, a full disk or a crash: finished runs are kept
# (a resume of a finished run ends at once), a stopped one resumes from its last checkpoint
# (--init_from=resume), the others start. OUT holds a mark naming the script that made it; another
# directory is refused.
set -euo pipefail
SCRIPT="experiments/$(basename "$0")"

fail() {  # one line on stderr, exit status 2 (as the Python scripts' refusals)
  trap - EXIT  # a refusal says what to do itself
  echo "error: $*" >&2
  exit 2
}

# no arguments: every setting is a variable of the environment, checked below
[ $# -eq 0 ] || fail "$SCRIPT takes no arguments (given: $*): settings go in the environment," \
  "e.g. SEEDS=\"1 2\" OUT=out/x bash $SCRIPT"
command -v python > /dev/null \
  || fail "no python on PATH: activate the environment the requirements are installed in"

is_int() {  # is_int VALUE [MIN]: a whole number from MIN (0) to 999999999, as Python reads it
  [[ "$1" =~ ^(0|[1-9][0-9]{0,8})$ ]] && [ "$1" -ge "${2:-0}" ]
}

check_int() {  # check_int NAME VALUE [MIN]: a whole number (a seed; a thread count, MIN 1)
  is_int "$2" "${3:-0}" || fail "$1=\"$2\" is not allowed: give one whole number from ${3:-0} to" \
    "999999999 (no leading zeros), e.g. $1=1"
}

check_ints() {  # check_ints NAME VALUE: whole numbers separated by spaces (the seeds), at least one
  local words w seen=" "
  read -ra words <<< "$2"  # split on spaces only: no file name pattern is expanded
  [ "${#words[@]}" -gt 0 ] \
    || fail "$1 is empty: give whole numbers separated by spaces, e.g. $1=\"1 2 3\""
  for w in "${words[@]}"; do
    is_int "$w" || fail "$1=\"$2\" is not allowed: \"$w\" is not a whole number from 0 to" \
      "999999999; give whole numbers separated by spaces, e.g. $1=\"1 2 3\""
    [[ "$seen" != *" $w "* ]] || fail "$1=\"$2\" is not allowed: $w is given twice (its runs" \
      "would share a directory); give each seed once"
    seen+="$w "
  done
}

check_name() {  # check_name NAME VALUE: a path or name given in the environment, not empty
  [ -n "$2" ] || fail "$1 is empty: give a path, e.g. $1=out/x"
  [[ "$2" != -* ]] \
    || fail "$1=\"$2\" starts with '-', which a script would read as an option: give a path"
}

settings() {  # settings THREADS SEEDS OUT: the script's defaults, each unless given in the
  # environment; the thread count and the seeds checked, the seeds read into the array `seeds`
  THREADS=${THREADS:-$1} SEEDS=${SEEDS:-$2} OUT=${OUT:-$3}
  check_int THREADS "$THREADS" 1
  check_ints SEEDS "$SEEDS"
  read -ra seeds <<< "$SEEDS"
}

start() {  # after every check: OUT taken (own_out), every run's thread count fixed
  own_out
  export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
}

own_out() {  # OUT new (made now), or made by this script before (its runs go on); else refused
  check_name OUT "$OUT"
  local mark="$OUT/.made_by"
  if [ -e "$OUT" ] && [ ! -d "$OUT" ]; then
    fail "OUT=$OUT is a file: give a directory, e.g. OUT=out/x"
  fi
  if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then
    [ "$(cat "$mark" 2>/dev/null)" = "$SCRIPT" ] \
      || fail "OUT=$OUT exists and was not made by $SCRIPT: nothing there is overwritten;" \
        "give another OUT=..., or remove it"
    echo "going on in $OUT (made by $SCRIPT before): finished runs are kept, a stopped one resumes"
  fi
  mkdir -p "$OUT"
  echo "$SCRIPT" > "$mark"
  trap stopped EXIT
}

stopped() {  # on the way out after Ctrl-C or a crash: the command that goes on
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "$SCRIPT stopped (exit status $rc); to go on, run the same command again (OUT=$OUT):" \
      "finished runs are kept, a stopped one resumes from its last checkpoint" >&2
  fi
}

# train_run DIR ARGS...: python train_grpo.py ARGS --out_dir=DIR, resumed where DIR holds ckpt.pt
train_run() {
  local dir=$1
  shift
  if [ -f "$dir/ckpt.pt" ]; then
    echo "== $dir: resuming from its checkpoint (ends at once if it is finished)"
    python train_grpo.py "$@" --out_dir="$dir" --init_from=resume
  elif [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    fail "$dir holds a run stopped before its first checkpoint: remove it (rm -r '$dir')," \
      "then run the same command again"
  else
    python train_grpo.py "$@" --out_dir="$dir"
  fi
}

json_done() {  # json_done FILE: a JSON file written to its end (its last byte closes it)
  [ -s "$1" ] && [ "$(tail -c 1 "$1")" = "}" ]
}

summary() {  # summary CMD...: CMD's output becomes $OUT/summary.md, replaced only by a whole one
  local tmp="$OUT/.summary.md.tmp"
  if ! "$@" > "$tmp"; then
    rm -f "$tmp"
    fail "the summary of $OUT was not written ($1 failed: its error is above);" \
      "$OUT/summary.md is left as it was"
  fi
  mv "$tmp" "$OUT/summary.md"
  cat "$OUT/summary.md"
}

provenance() {  # the first lines of a summary: script, commit, date, threads, torch, CPU
  echo "$SCRIPT, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F)," \
    "$THREADS thread(s),"
  echo "torch $(python -c 'import torch; print(torch.__version__)')," \
    "CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
  echo
}
