#!/usr/bin/env bash
# Runs scripts/referee_full.sh as several processes at once, one per method group, all writing OUT/runs/ (each run
# has its own file, so they never collide). On a GPU the model is small and each process leaves the device idle
# while its CPU threads score logits, so processes overlap well. The leakage row runs in the group named
# "leakage" (optr(oscar) at 64/256 plus its same-text twin); every other group passes --no-leakage.
#   KVQ_DEVICE=cuda scripts/referee_parallel.sh OUT THREADS_PER_PROCESS "int8,int4" "int2,kivi2" leakage ... \
#     [-- FLAGS...]      (FLAGS go to every process, e.g. -- --clip-grid 0.88,0.92,0.96,1)
# Then one more scripts/referee_full.sh OUT (every run resumed) writes results.json and the reports.
# REFEREE_SCRIPT=scripts/referee_allwin.sh runs that plan instead of referee_full.sh's.
set -uo pipefail
OUT=${1:?usage: referee_parallel.sh OUT THREADS GROUP...}
THREADS=${2:?threads per process}
shift 2
groups=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do groups+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the --
mkdir -p "$OUT/logs"
pids=()
for group in "${groups[@]}"; do
  if [ "$group" = leakage ]; then
    args=(--methods "optr(oscar)" --cache-windows 64/256)
  else
    args=(--methods "$group" --no-leakage)
  fi
  log="$OUT/logs/$(echo "$group" | tr -c 'a-zA-Z0-9\n' '_').log"
  "${REFEREE_SCRIPT:-$(dirname "$0")/referee_full.sh}" "$OUT" -t "$THREADS" "${args[@]}" "$@" > "$log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
