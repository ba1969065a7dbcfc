#!/usr/bin/env bash
# The referee over every camp under both protocols (docs/reports/referee-camps-8k.md) on one machine with a GPU and 16 cores:
# the rows the GPU runs (a compiled GPU instance, any prompt policy: `kvq referee --plan --device cuda` lists them) go
# to two processes with --device cuda, any others (none of this list since KV4-RL's int8 windows run on the GPU too) to
# CPU processes of 2 threads,
# all writing OUT/runs/ (a file per run). A last `--report-only` pools the records of both devices; report.md names
# the device of every run. Runs resume, so the script can be called again until every run has its record.
#   scripts/referee_camps.sh OUT [CTX] [CPU_PROCESSES]      (KVQ=path/to/kvq, default build/kvq)
# PART=gpu runs the GPU rows only, PART=cpu the CPU rows only (then the report): the two halves can run on different
# machines, carrying OUT/runs between them. WINDOWS is --cache-windows (default 64/256; e.g. 16/64,0/0) and PROTOCOLS
# the protocols run (default common,as-shipped). On the H200 machine 7 CPU processes at once took about 14 min a row
# (3-15 min one at a time on this project's 2-core AMD EPYC), so docs/reports/referee-camps-8k.md ran the GPU rows there and
# the CPU rows here; since KV4-RL's int8 windows run on the GPU no row is left to the CPU: CPU_PROCESSES defaults to 0.
set -uo pipefail
OUT=${1:?usage: scripts/referee_camps.sh OUT [CTX] [CPU_PROCESSES]}
CTX=${2:-8192}
NCPU=${3:-0}
PART=${PART:-all}
WINDOWS=${WINDOWS:-64/256}
PROTOCOLS=${PROTOCOLS:-common,as-shipped}
KVQ=${KVQ:-build/kvq}
S=(-m models/ref --calib-data data/calib/linux.txt --eval-data data/eval -o "$OUT" --ctx "$CTX" --windows 2
   --passkey-trials 1 --depths 0,0.5,1 --cache-windows "$WINDOWS" --no-leakage)

# Every row of the report, in its order; the two lists below split them between the devices.
METHODS="bf16,int2,evict(int2),turboquant_2bit,turboquant_3bit_nc,turboquant_k3v4_nc,turboquant_4bit_nc,turboquant_k8v4"
METHODS+=",nexusquant,e8_2,oscar_int2,kitty_int2,kitty_int2_20,q4_0,q8_0/q4_0,q8_0,kv4rl,kivi2,int2+quarot,pnmix"
METHODS+=",pnmix(1.5b)"
GPU_COMMON="bf16,int2,evict(int2),turboquant_2bit,turboquant_3bit_nc,turboquant_k3v4_nc,turboquant_4bit_nc"
GPU_COMMON+=,turboquant_k8v4,nexusquant,e8_2,oscar_int2,kitty_int2,kitty_int2_20,q4_0,q8_0/q4_0,q8_0,kivi2,int2+quarot
GPU_COMMON+=",pnmix,pnmix(1.5b),kv4rl"
GPU_SHIPPED="bf16,evict(int2),turboquant_2bit,turboquant_3bit_nc,turboquant_k3v4_nc,turboquant_4bit_nc"
GPU_SHIPPED+=,turboquant_k8v4,e8_2,nexusquant,oscar_int2,kitty_int2,kitty_int2_20,q4_0,q8_0/q4_0,q8_0
# CPU rows as protocol:method:seconds, longest first, dealt to the least loaded process (none: every row runs on the GPU;
# kv4rl took 110 s on the CPU at 4K when it was the last one).
CPU_ROWS=""

mkdir -p "$OUT/logs"
declare -a load jobs
for ((i = 0; i < NCPU; ++i)); do load[i]=0; jobs[i]=""; done
for row in $CPU_ROWS; do
  IFS=: read -r proto method secs <<< "$row"
  [[ ",$PROTOCOLS," == *",$proto,"* ]] || continue
  best=0
  for ((i = 1; i < NCPU; ++i)); do ((load[i] < load[best])) && best=$i; done
  load[best]=$((load[best] + secs))
  jobs[best]+="$proto:$method "
done

pids=()
run_jobs() {  # LOG DEVICE-FLAGS... -- PROTO:METHOD...: one referee process per job, one after the other
  local log=$1; shift
  local dev=()
  while [ "$1" != -- ]; do dev+=("$1"); shift; done
  shift
  for job in "$@"; do
    "$KVQ" referee "${S[@]}" "${dev[@]}" --protocols "${job%%:*}" --methods "${job#*:}" || return 1
  done > "$log" 2>&1
}
if [ "$PART" != cpu ]; then
  for proto in common as-shipped; do
    [[ ",$PROTOCOLS," == *",$proto,"* ]] || continue
    rows=$GPU_COMMON; [ $proto = common ] || rows=$GPU_SHIPPED
    run_jobs "$OUT/logs/gpu-$proto.log" --device cuda --gpu-gemm fp32 -t 1 -- "$proto:$rows" &
    pids+=($!)
  done
fi
if [ "$PART" != gpu ]; then
  for ((i = 0; i < NCPU; ++i)); do
    # shellcheck disable=SC2086  # the jobs are words
    run_jobs "$OUT/logs/cpu-$i.log" -t 2 -- ${jobs[i]} &
    pids+=($!)
  done
fi
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
"$KVQ" referee "${S[@]}" --protocols "$PROTOCOLS" --methods "$METHODS" --report-only > "$OUT/logs/report.log" 2>&1 ||
  rc=1
exit $rc
