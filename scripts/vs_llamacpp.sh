#!/usr/bin/env bash
# kvq against llama.cpp on the CPU, both engines in one run (issue #23 part 4): decode tok/s at a 4K and an 8K
# context and prefill tok/s at 4K, per cache type, on the same model (models/ref; for llama.cpp its GGUF with F16
# weights, converted as tests/golden/llamacpp_ppl/README.md says) and the same thread count.
#
#   scripts/vs_llamacpp.sh LLAMA_BENCH GGUF [THREADS] [KVQ]
#
# llama-bench: -fa on (flash attention: what quantized V caches need), decode = tg64 at depth d, prefill = pp4096.
# kvq: bench decode at ctx d (one sequence, 64 timed steps), prefill = its 4096-token prefill. The load average is
# printed before and after: timings on a loaded machine are not figures.
set -euo pipefail
LB=${1:?llama-bench path}; GGUF=${2:?GGUF path}; T=${3:-2}; KVQ=${4:-build/kvq}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-6s %12s %12s %12s\n' engine type "tg@4096" "tg@8000" "pp4096"
llama() {  # type
  local tg4 tg8 pp
  tg4=$("$LB" -m "$GGUF" -t "$T" -fa on -ctk "$1" -ctv "$1" -p 0 -n 64 -d 4096 -r 2 -o jsonl | jq -s '.[-1].avg_ts')
  tg8=$("$LB" -m "$GGUF" -t "$T" -fa on -ctk "$1" -ctv "$1" -p 0 -n 64 -d 8000 -r 2 -o jsonl | jq -s '.[-1].avg_ts')
  pp=$("$LB" -m "$GGUF" -t "$T" -fa on -ctk "$1" -ctv "$1" -p 4096 -n 0 -r 2 -o jsonl | jq -s '.[-1].avg_ts')
  printf '%-8s %-6s %12.1f %12.1f %12.1f\n' llama.cpp "$1" "$tg4" "$tg8" "$pp"
}
kvq() {  # type
  local out
  out=$("$KVQ" bench decode -m models/ref -t "$T" -c 4096,8000 -n 64 --kv-cache-dtype "$1" 2>/dev/null)
  local tg4 tg8 pp
  tg4=$(grep -m1 "at ctx 4096" <<<"$out" | sed -E 's/.*decode [^:]*: ([0-9.]+) tok\/s.*/\1/')
  tg8=$(grep -m1 "at ctx 8000" <<<"$out" | sed -E 's/.*decode [^:]*: ([0-9.]+) tok\/s.*/\1/')
  pp=$(grep -m1 "at ctx 4096" <<<"$out" | sed -E 's/.*prefill [^:]*: ([0-9.]+) tok\/s.*/\1/')
  printf '%-8s %-6s %12.1f %12.1f %12.1f\n' kvq "$1" "$tg4" "$tg8" "$pp"
}
for t in f16 q8_0 q4_0; do llama "$t"; done
for t in bf16 f16 q8_0 q4_0 int2; do kvq "$t"; done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
