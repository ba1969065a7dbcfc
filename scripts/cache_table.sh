#!/usr/bin/env bash
# Cache codecs on the reference model at 8K: decode-faithful perplexity with BF16 sink/recent windows (64/256) and
# without (0/0), on held-out eval domains, with the effective bits each stores. Configurations run as parallel
# processes. SET=codecs (default, issue #4): bf16, int8, int4, int2, int2 + Hadamard, kivi2; SET=camps (issue #19):
# bf16, int2, the TurboQuant presets, NexusQuant, OScaR, Kitty, and int2 with vLLM's BF16 layers.
#   [SET=camps] scripts/cache_table.sh [OUTDIR] [WINDOWS_PER_DOMAIN] [PARALLEL] [THREADS_EACH]
set -euo pipefail
KVQ=${KVQ:-build/kvq}
OUT=${1:-build/cache-table}
NWIN=${2:-2}
PAR=${3:-1}
THREADS=${4:-0}
M=models/ref
DOMAINS=(python pgsql)
CTX=${CTX:-8192}
mkdir -p "$OUT"
run_one() {  # LABEL FLAGS... -> $OUT/rows/LABEL.tsv, one line per domain: label domain ppl bits
  local label=$1
  shift
  local file="$OUT/rows/${label//[ \/()+,]/_}.tsv"
  : > "$file"
  for d in "${DOMAINS[@]}"; do
    local line
    line=$("$KVQ" ppl -m $M -f data/eval/$d.txt -c $CTX --chunks "$NWIN" -t "$THREADS" "$@" 2>/dev/null)
    printf "%s\t%s\t%s\t%s\n" "$label" "$d" "$(awk '{print $2}' <<<"$line")" \
      "$(grep -o '[0-9.]* bits/element' <<<"$line" | cut -d' ' -f1)" >> "$file"
  done
}
mkdir -p "$OUT/rows"
jobs_list=()
for w in "64 256" "0 0"; do
  set -- $w
  win="--kv-sink $1 --kv-recent $2"
  tag="$1/$2"
  if [[ ${SET:-codecs} == camps ]]; then
    jobs_list+=("bf16 $tag|--kv-cache-dtype bf16 $win" "int2 $tag|--kv-cache-dtype int2 $win")
    for t in turboquant_k8v4 turboquant_4bit_nc turboquant_k3v4_nc turboquant_3bit_nc turboquant_2bit nexusquant e8_2 \
             oscar_int2 kitty_int2 kitty_int2_20; do
      jobs_list+=("$t $tag|--kv-cache-dtype $t $win")
    done
    jobs_list+=("int2+skip0,1,-2,-1 $tag|--kv-cache-dtype int2 $win --kv-skip-layers 0,1,-2,-1"
                "turboquant_3bit_nc+skip0,1,-2,-1 $tag|--kv-cache-dtype turboquant_3bit_nc $win --kv-skip-layers 0,1,-2,-1")
  else
    jobs_list+=("bf16 $tag|--kv-cache-dtype bf16 $win" "int8 $tag|--kv-cache-dtype int8 $win"
                "int4 $tag|--kv-cache-dtype int4 $win" "int2 $tag|--kv-cache-dtype int2 $win"
                "int2+hadamard $tag|--kv-cache-dtype int2 $win --rotation hadamard" "kivi2 $tag|--kv-cache-dtype kivi2 $win")
  fi
done
running=0
for j in "${jobs_list[@]}"; do
  label=${j%%|*}
  flags=${j#*|}
  # shellcheck disable=SC2086
  run_one "$label" $flags &
  running=$((running + 1))
  if (( running >= PAR )); then wait -n; running=$((running - 1)); fi
done
wait
: > "$OUT/results.tsv"
for j in "${jobs_list[@]}"; do
  label=${j%%|*}
  cat "$OUT/rows/${label//[ \/()+,]/_}.tsv" >> "$OUT/results.tsv"
done
cat "$OUT/results.tsv"
