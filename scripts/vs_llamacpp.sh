#!/usr/bin/env bash
# kvq against llama.cpp on the CPU, both engines in one run (issue #23 part 4): decode tok/s at a 4K and an 8K
# context and prefill tok/s at 4K, per cache type, on the same model (models/ref; for llama.cpp its GGUF with F16
# weights, converted as tests/golden/llamacpp_ppl.README.md says) and the same thread count.
#
#   scripts/vs_llamacpp.sh LLAMA_BENCH GGUF [THREADS] [KVQ] [REPEATS] [SIMD]
#
# SIMD: kvq's --simd level (default: the best this CPU has); build llama.cpp for the same level (GGML_NATIVE=OFF with
# GGML_AVX2=ON for avx2). The GGUF: scripts/ref_to_gguf.py.
#
# llama-bench: -fa on (flash attention: what quantized V caches need), decode = tg64 at depth d, prefill = pp4096.
# kvq: bench decode at ctx d (one sequence, 64 timed steps), prefill = its 4096-token prefill.
# The 16-bit rows are measured REPEATS times (default 5), the engines interleaved within each repeat so that a change
# of load hits both; each cell prints the mean and its 95% confidence half-width (Student t over the repeats; ± 0.0
# for a row measured once). The load average is printed before and after: timings on a loaded machine are not figures.
set -euo pipefail
LB=${1:?llama-bench path}; GGUF=${2:?GGUF path}; T=${3:-2}; KVQ=${4:-build/kvq}; R=${5:-5}; SIMD=${6:-}
simd=()
[[ -n $SIMD ]] && simd=(--simd "$SIMD")
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); kvq --simd ${SIMD:-best}"
llama() {  # type -> "engine type tg4 tg8 pp"
  local args=(-m "$GGUF" -t "$T" -fa on -ctk "$1" -ctv "$1" -r 1 -o jsonl)
  echo "llama.cpp $1 $("$LB" "${args[@]}" -p 0 -n 64 -d 4096 | jq -s '.[-1].avg_ts')" \
    "$("$LB" "${args[@]}" -p 0 -n 64 -d 8000 | jq -s '.[-1].avg_ts')" \
    "$("$LB" "${args[@]}" -p 4096 -n 0 | jq -s '.[-1].avg_ts')"
}
kvq() {  # type -> "engine type tg4 tg8 pp"
  local out
  out=$("$KVQ" bench decode "${simd[@]}" -m models/ref -t "$T" -c 4096,8000 -n 64 --kv-cache-dtype "$1" 2>/dev/null)
  echo "kvq $1 $(grep -m1 "at ctx 4096" <<<"$out" | sed -E 's/.*decode [^:]*: ([0-9.]+) tok\/s.*/\1/')" \
    "$(grep -m1 "at ctx 8000" <<<"$out" | sed -E 's/.*decode [^:]*: ([0-9.]+) tok\/s.*/\1/')" \
    "$(grep -m1 "at ctx 4096" <<<"$out" | sed -E 's/.*prefill [^:]*: ([0-9.]+) tok\/s.*/\1/')"
}
# The 16-bit rows (the baseline both engines' speedups are stated against) every repeat; the quantized rows, whose
# llama.cpp prefill alone takes minutes at 8000, in the first repeat only.
for ((rep = 0; rep < R; ++rep)); do
  llama f16 >>"$raw"; kvq bf16 >>"$raw"; kvq f16 >>"$raw"
  if ((rep == 0)); then
    llama q8_0 >>"$raw"; kvq q8_0 >>"$raw"
    llama q4_0 >>"$raw"; kvq q4_0 >>"$raw"
    kvq int2 >>"$raw"
  fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "16-bit rows: $R repeats, the others once; mean ± 95% CI half-width (t over repeats), tok/s"
# t quantiles (0.975) for 1..9 degrees of freedom; more repeats use the normal 1.96
awk -v R="$R" '
  BEGIN { split("12.71 4.30 3.18 2.78 2.57 2.45 2.36 2.31 2.26", tq, " "); printf "| engine | cache | decode at 4096 | decode at 8000 | prefill at 4096 |\n|---|---|---|---|---|\n" }
  { k = $1 " " $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    for (c = 3; c <= 5; ++c) { s[k, c] += $c; ss[k, c] += $c * $c } cnt[k]++ }
  END {
    for (i = 1; i <= n; ++i) {
      k = order[i]; split(k, e, " "); m = cnt[k]; t = (m - 1 >= 1 && m - 1 <= 9) ? tq[m - 1] : 1.96
      printf "| %s | %s |", e[1], e[2]
      for (c = 3; c <= 5; ++c) {
        mu = s[k, c] / m; v = m > 1 ? (ss[k, c] - m * mu * mu) / (m - 1) : 0; if (v < 0) v = 0
        printf " %.1f ± %.1f |", mu, (m > 1 ? t * sqrt(v / m) : 0)
      }
      printf "\n"
    }
  }' "$raw"
echo "raw:"; cat "$raw"
