#!/usr/bin/env bash
# The GPU figures of the README on a CUDA machine: builds with the CUDA backend, runs the GPU tests, the attention
# grid (kvq and PyTorch SDPA), end-to-end decode at 512, 8K and 32K (with and without CUDA graphs) and GPU-vs-CPU
# perplexity; logs and JSON in OUTDIR.
#   scripts/gpu_run.sh [OUTDIR]
# A machine without Debian's -dev packages for PCRE2 / ICU can point KVQ_DEPS_PREFIX at a prefix holding their
# headers (include/) and libraries (lib/, lib/pkgconfig/); it is added to PKG_CONFIG_PATH and LD_LIBRARY_PATH.
set -uo pipefail
OUT=${1:-build-cuda/gpu-run}
if [[ -n ${KVQ_DEPS_PREFIX:-} ]]; then
  export PKG_CONFIG_PATH=$KVQ_DEPS_PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$KVQ_DEPS_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
mkdir -p "$OUT"
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DKVQ_CUDA=ON > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
cmake --build build-cuda -j "$(nproc)" > "$OUT/build.log" 2>&1 || { grep -A3 error "$OUT/build.log" | head -40; exit 1; }
K=build-cuda/kvq
build-cuda/kvq_tests --gtest_filter='Gpu*:*Gpu*' > "$OUT/gpu_tests.log" 2>&1
grep -E '^\[  (PASSED|FAILED)' "$OUT/gpu_tests.log"
$K bench attention --device cuda -ctk int2 -ctv int2 | tee "$OUT/bench_attention_int2.txt"
$K bench attention --device cuda -ctk int2 -ctv int2 --json > "$OUT/bench_attention_int2.json"
python3 scripts/bench_sdpa.py --json "$OUT/sdpa.json" | tee "$OUT/sdpa.txt"
for c in bf16 int2; do
  $K bench decode -m models/ref --device cuda -c 8000 -n 128 --seqs 64 -ctk $c -ctv $c --json
  for s in 16 32; do
    $K bench decode -m models/ref --device cuda -c 32768 -n 128 --seqs $s --beyond-trained-ctx -ctk $c -ctv $c --json
  done
  $K bench decode -m models/ref --device cuda -c 512 -n 128 --seqs 16 -ctk $c -ctv $c --json
done > "$OUT/bench_decode.jsonl"
# CUDA graphs against direct launches (int2, same run)
for g in on off; do
  $K bench decode -m models/ref --device cuda -c 512 -n 128 --seqs 16 -ctk int2 -ctv int2 --cuda-graphs $g --json
done > "$OUT/bench_decode_graphs.jsonl"
for c in bf16 int2; do
  for dev in cuda cpu; do
    $K ppl -m models/ref -f data/eval/python.txt -c 8192 --chunks 2 -ctk $c -ctv $c --device $dev 2>/dev/null
  done
done | tee "$OUT/ppl.txt"
