#!/usr/bin/env bash
# `make demo`: the main job on the bundled reference model — what the cache stores, text from it, and how much
# each KV-cache type costs in perplexity (decode-faithful, data/eval held-out text) at equal context.
set -euo pipefail
KVQ=${1:-build/kvq}
M=models/ref
EVAL=data/eval/linux.txt
CTX=${KVQ_DEMO_CTX:-2048}
WINDOWS=${KVQ_DEMO_WINDOWS:-2}

echo "== kvq info: the reference model and a 2-bit cache at 8K context"
"$KVQ" info -m $M -ctk int2 -ctv int2 -c 8192
echo
echo "== kvq run: greedy continuation through a BF16 cache and through an INT2 cache (64 sink + 256 recent in BF16)"
for t in bf16 int2; do
  printf -- "-- %s: " "$t"
  "$KVQ" run -m $M -p "The kernel maps physical memory pages" -n 48 --temp 0 --kv-cache-dtype $t 2>/dev/null
done
echo
echo "== kvq ppl: $EVAL, $WINDOWS windows of $CTX tokens, every query reading the cache as decode would"
printf "%-34s %10s %12s\n" "cache" "ppl" "bits/elem"
row() {  # row LABEL FLAGS...
  local label=$1
  shift
  local line
  line=$("$KVQ" ppl -m $M -f $EVAL -c "$CTX" --chunks "$WINDOWS" "$@" 2>/dev/null)
  printf "%-34s %10s %12s\n" "$label" "$(awk '{print $2}' <<<"$line")" "$(grep -o '[0-9.]* bits/element' <<<"$line" | cut -d' ' -f1)"
}
row "bf16" --kv-cache-dtype bf16
row "int8" --kv-cache-dtype int8
row "int4" --kv-cache-dtype int4
row "int2, no windows" --kv-cache-dtype int2 --kv-sink 0 --kv-recent 0
row "int2, 64 sink + 256 recent" --kv-cache-dtype int2
row "kivi2 (G=32), no windows" --kv-cache-dtype kivi2 --kv-group 32 --kv-sink 0 --kv-recent 0
