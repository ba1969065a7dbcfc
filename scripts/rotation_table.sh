#!/usr/bin/env bash
# Rotation methods on the reference model at 8K (issue figures): calibrates on data/calib/linux.txt and scores
# decode-faithful perplexity on eval domains NOT used for calibration, INT2 G=128, for two window settings.
#   scripts/rotation_table.sh [OUTDIR] [WINDOWS_PER_DOMAIN]
set -euo pipefail
KVQ=${KVQ:-build/kvq}
OUT=${1:-build/rotation-table}
NWIN=${2:-2}
M=models/ref
CALIB=data/calib/linux.txt
DOMAINS=(python pgsql)
CTX=8192
mkdir -p "$OUT"
ppl() {  # ppl LABEL FLAGS... -> one line per domain into $OUT/results.tsv
  local label=$1
  shift
  for d in "${DOMAINS[@]}"; do
    local line
    line=$("$KVQ" ppl -m $M -f data/eval/$d.txt -c $CTX --chunks "$NWIN" "$@" 2>/dev/null)
    printf "%s\t%s\t%s\t%s\n" "$label" "$d" "$(awk '{print $2}' <<<"$line")" \
      "$(grep -o '[0-9.]* bits/element' <<<"$line" | cut -d' ' -f1)" | tee -a "$OUT/results.tsv"
  done
}
: > "$OUT/results.tsv"
ppl "bf16" --kv-cache-dtype bf16
for w in "64 256" "16 64"; do
  set -- $w
  S=$1 R=$2
  win=(--kv-sink "$S" --kv-recent "$R")
  tag="$S/$R"
  for method in oscar "optr quarot post-wo" "optr oscar post-wo" "optr oscar joint"; do
    set -- $method
    file="$OUT/$1-${2:-}-${3:-}-$S-$R.safetensors"
    if [[ ! -f $file ]]; then
      if [[ $1 == optr ]]; then
        "$KVQ" calibrate -m $M --data $CALIB --method optr --base "$2" --objective "$3" "${win[@]}" -o "$file" 2>&1 | tail -2
      else
        "$KVQ" calibrate -m $M --data $CALIB --method "$1" "${win[@]}" -o "$file" 2>&1 | tail -1
      fi
    fi
  done
  ppl "int2 none $tag" --kv-cache-dtype int2 "${win[@]}"
  ppl "int2 hadamard $tag" --kv-cache-dtype int2 "${win[@]}" --rotation hadamard
  ppl "int2 oscar $tag" --kv-cache-dtype int2 "${win[@]}" --rotation "$OUT/oscar---$S-$R.safetensors"
  ppl "int2 optr(quarot) $tag" --kv-cache-dtype int2 "${win[@]}" --rotation "$OUT/optr-quarot-post-wo-$S-$R.safetensors"
  ppl "int2 optr(oscar) $tag" --kv-cache-dtype int2 "${win[@]}" --rotation "$OUT/optr-oscar-post-wo-$S-$R.safetensors"
  ppl "int2 optr-joint(oscar) $tag" --kv-cache-dtype int2 "${win[@]}" --rotation "$OUT/optr-oscar-joint-$S-$R.safetensors"
done
