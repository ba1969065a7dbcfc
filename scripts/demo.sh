#!/usr/bin/env bash
# `make demo`: the main job on the bundled reference model — what a 2-bit cache stores, text generated through it,
# and the quick referee: the KV-cache methods side by side on the same eval data, seeds and windows
# (ppl, KL and top-1 against BF16, passkey, per-layer errors, effective bits), ending with its summary table.
# Calibration uses data/calib/linux.txt; the eval texts are data/eval/*.txt. data/calib/<domain>.txt and
# data/eval/<domain>.txt come from different positions of the same source text (disjoint parts of one domain);
# the referee checks disjointness by file identity (path and sha256) and records both hashes.
set -euo pipefail
KVQ=${1:-build/kvq}
M=models/ref
OUT=${KVQ_DEMO_OUT:-$(dirname "$KVQ")/referee-demo}

echo "== kvq info: the reference model and a 2-bit cache at 8K context"
"$KVQ" info -m $M -ctk int2 -ctv int2 -c 8192
echo
echo "== kvq run: greedy continuation through a BF16 cache and through an INT2 cache (64 sink + 256 recent in BF16)"
for t in bf16 int2; do
  printf -- "-- %s: " "$t"
  "$KVQ" run -m $M -p "The kernel maps physical memory pages" -n 32 --temp 0 --kv-cache-dtype $t 2>/dev/null
done
echo
echo "== kvq referee --quick: 12 methods x windows {64/256, 0/0} (common protocol) and the camps' rows as shipped"
echo "   (TurboQuant 2-bit, e8_2, Kitty, llama.cpp q4_0, eviction at int2's bytes, against bf16 on the same tokens),"
echo "   at ctx 1024 on linux + python, passkey at depths 0, 0.5, 1; equal-bit bands, Pareto charts, the eviction"
echo "   rows beside int2 and the camps' claims in the reports"
echo "   (in $OUT; finished runs there are reused on a rerun: rm -rf $OUT to start over)"
"$KVQ" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$OUT" --quick
