#!/usr/bin/env bash
# The 8K referee over EVERY eval window (5 domains, 108 windows of 8192 tokens) for the INT2 rotation methods at
# windows 64/256 and 16/64, behind docs/reports/referee-ref-allwin.md. scripts/referee_full.sh takes 4 windows per domain,
# which cannot resolve the OptR-versus-OSCAR gap; this takes all of them (passkey reduced to one prompt at depth 0.5).
#   scripts/referee_allwin.sh OUT [extra kvq referee flags]
# Same calibration settings as referee_full.sh, so its rotations and clips (OUT/rotations, OUT/clips) are reused when
# copied over. With KVQ_DEVICE=cuda the evaluation runs on the GPU (fp32 GEMMs); calibration always runs on the CPU.
# On a GPU, REFEREE_SCRIPT=scripts/referee_allwin.sh scripts/referee_parallel.sh OUT 2 "optr(oscar)" ... runs the
# methods as parallel processes.
set -euo pipefail
OUT=${1:?usage: scripts/referee_allwin.sh OUT [kvq referee flags]}
shift
KVQ=${KVQ:-build/kvq}
DEVICE=${KVQ_DEVICE:-cpu}
"$KVQ" referee -m models/ref --calib-data data/calib/linux.txt --eval-data data/eval -o "$OUT" \
  --ctx 8192 --windows 0 --passkey-trials 1 --depths 0.5 --clip-grid 0.88,0.92,0.96,1 \
  --methods "bf16,int2,int2+quarot,int2+oscar,optr(quarot),optr(oscar),optr-joint(oscar)" \
  --cache-windows 64/256,16/64 --no-leakage --device "$DEVICE" --gpu-gemm fp32 "$@"
