#!/usr/bin/env bash
# The full referee on models/ref behind docs/reports/referee-ref.md: every method x windows {64/256, 16/64, 0/0} at 8K and
# 4K, 4 windows of each eval domain per context, 10 passkey prompts per (ctx, depth), plus the leakage row.
#   scripts/referee_full.sh OUT [extra kvq referee flags]
# With KVQ_DEVICE=cuda the evaluation passes run on the GPU (fp32 GEMMs); calibration always runs on the CPU.
# Calibrating and evaluating on different machines: run with --calibrate-only where the CPU time is, carry
# OUT/rotations (and OUT/runs of earlier invocations) to the GPU machine and run again there; finished runs resume.
set -euo pipefail
OUT=${1:?usage: scripts/referee_full.sh OUT [kvq referee flags]}
shift
KVQ=${KVQ:-build/kvq}
DEVICE=${KVQ_DEVICE:-cpu}
"$KVQ" referee -m models/ref --calib-data data/calib/linux.txt --eval-data data/eval -o "$OUT" \
  --ctx 8192,4096 --windows 4 --passkey-trials 10 --device "$DEVICE" --gpu-gemm fp32 "$@"
