#!/usr/bin/env bash
# Bad command-line input: each case must print exactly one line on stderr starting "kvq: error:" and exit
# non-zero. Usage: tests/cli_errors.sh path/to/kvq
set -u
KVQ=$1
fail=0
n=0
expect_error() {  # expect_error "description" args...
  local what=$1
  shift
  n=$((n + 1))
  local err rc lines
  err=$("$KVQ" "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $rc -eq 0 || $lines -ne 1 || $err != "kvq: error:"* ]]; then
    echo "FAIL: $what: rc=$rc, stderr ($lines lines): $err"
    fail=$((fail + 1))
  else
    echo "ok:   $what -> $err"
  fi
}
expect_error "no subcommand"
expect_error "unknown subcommand" frobnicate
expect_error "unknown flag" --no-such-flag
M=models/ref
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
printf 'short text' > "$T/short.txt"
expect_error "run: unknown flag" run -m $M -p hi --frobnicate 3
expect_error "run: missing model dir" run -m /nonexistent/model -p hi
expect_error "run: missing prompt" run -m $M
expect_error "run: unknown cache type" run -m $M -p hi -n 1 -ctk int3
expect_error "run: group not dividing head_dim" run -m $M -p hi -n 1 -ctk int2 --kv-group 48
expect_error "run: context larger than the model's" run -m $M -p hi -n 1 -c 100000
expect_error "run: prompt + tokens overflow the context" run -m $M -p "hello world" -n 100 -c 16
expect_error "run: bad temperature" run -m $M -p hi -n 1 --temp -1
expect_error "run: unknown --simd level" run -m $M -p hi -n 1 --simd avx9
expect_error "bench attention: unknown --simd level" bench attention --ctx 64 -ctk int2 -ctv int2 --simd neon
if ! "$KVQ" run -m $M -p hi -n 1 --simd avx2 >/dev/null 2>&1; then  # a build or CPU without AVX2
  expect_error "run: a --simd level this CPU or build lacks" run -m $M -p hi -n 1 --simd avx2
fi
expect_error "run: bad clip" run -m $M -p hi -n 1 --kv-clip-k 1.5
expect_error "run: a clip for keys that take none (KIVI)" run -m $M -p hi -n 1 -ctk kivi2 --kv-clip-k 0.9
expect_error "run: a clip for bf16 values" run -m $M -p hi -n 1 -ctk int2 --kv-clip-v 0.9
expect_error "run: keys without RoPE under a key rotation" run -m $M -p hi -n 1 -ctk e8_2 --rotation hadamard
expect_error "run: a clip for nexusquant" run -m $M -p hi -n 1 --kv-cache-dtype nexusquant --kv-clip-k 0.9
expect_error "run: a TurboQuant preset with --rotation" run -m $M -p hi -n 1 --kv-cache-dtype turboquant_3bit_nc --rotation hadamard
expect_error "run: a preset as a key type" run -m $M -p hi -n 1 -ctk turboquant_2bit
expect_error "run: TurboQuant codebook keys as values" run -m $M -p hi -n 1 -ctv tq3nc
expect_error "run: an unknown --kv-cache-dtype" run -m $M -p hi -n 1 --kv-cache-dtype turboquant_1bit
expect_error "run: a clip for TurboQuant keys" run -m $M -p hi -n 1 -ctk tq2nc -ctv tqv2 --kv-clip-k 0.9
expect_error "run: an unknown --kv-window-type" run -m $M -p hi -n 1 -ctk int4 -ctv int4 --kv-window-type int4
expect_error "run: kv4rl with bf16 windows (the preset keeps int8 ones)" run -m $M -p hi -n 1 --kv-cache-dtype kv4rl \
  --kv-window-type bf16
expect_error "run: int8 windows with per-channel KIVI keys" run -m $M -p hi -n 1 --kv-cache-dtype kivi2 \
  --kv-window-type int8
expect_error "run: kv4rl on the GPU (int8 windows are CPU-only)" run -m $M -p hi -n 1 --kv-cache-dtype kv4rl \
  --device cuda
expect_error "calibrate: int8 windows (not modelled by its loss)" calibrate -m $M --data data/calib/linux.txt \
  -o "$T/r.safetensors" --kv-window-type int8
expect_error "run: a group with no grouped cache type" run -m $M -p hi -n 1 --kv-group 64
expect_error "run: a group for OScaR (its groups are 32)" run -m $M -p hi -n 1 --kv-cache-dtype oscar_int2 --kv-group 64
expect_error "run: a rotation with OScaR (it implies its Hadamard)" run -m $M -p hi -n 1 --kv-cache-dtype oscar_int2 \
  --rotation tests/golden/golden.safetensors
expect_error "run: not a number" run -m $M -p hi -n many
expect_error "run: --kv-skip-layers past the model's 8 layers" run -m $M -p hi -n 1 -ctk int2 --kv-skip-layers 0,8
expect_error "run: --kv-skip-layers naming a layer twice" run -m $M -p hi -n 1 -ctk int2 --kv-skip-layers 1,1
expect_error "run: --kv-skip-layers items naming one layer" run -m $M -p hi -n 1 -ctk int2 --kv-skip-layers 1,-7
expect_error "run: --kv-skip-layers not a list of integers" run -m $M -p hi -n 1 -ctk int2 --kv-skip-layers 0,x
expect_error "ppl: kitty on pages that are not a multiple of 128" ppl -m $M -f data/eval/linux.txt --kv-cache-dtype kitty_int2 --kv-page 64
expect_error "ppl: --kv-demote-block not a multiple of oscar_int2's 32-token key block" ppl -m $M -f data/eval/linux.txt --kv-cache-dtype oscar_int2 --kv-demote-block 48
expect_error "ppl: --kv-demote-block 0" ppl -m $M -f data/eval/linux.txt -ctk int2 -ctv int2 --kv-demote-block 0
expect_error "run: kitty with a group" run -m $M -p hi -n 1 --kv-cache-dtype kitty_int2 --kv-group 64
expect_error "ppl: missing file" ppl -m $M -f /nonexistent.txt
expect_error "ppl: file shorter than one window" ppl -m $M -f "$T/short.txt" -c 512
expect_error "ppl: ctx beyond the model" ppl -m $M -f data/eval/linux.txt -c 9000
expect_error "ppl: unknown --prompt-policy" ppl -m $M -f data/eval/linux.txt --prompt-policy exact
expect_error "ppl: --evict-bits without evict" ppl -m $M -f data/eval/linux.txt --prompt-policy exact-prompt --evict-bits 3
expect_error "ppl: evict without --evict-bits" ppl -m $M -f data/eval/linux.txt --prompt-policy evict
expect_error "ppl: --evict-ctx without evict" ppl -m $M -f data/eval/linux.txt -c 256 --prompt-tokens 128 --evict-ctx 256
expect_error "ppl: evict budget at a context too small for the tokens after the prompt" ppl -m $M -f data/eval/linux.txt -c 256 --prompt-policy evict --evict-bits 3 --evict-ctx 256 --prompt-tokens 128
expect_error "ppl: evict over a quantized cache" ppl -m $M -f data/eval/linux.txt -c 256 -ctk int2 --prompt-policy evict --evict-bits 3 --prompt-tokens 128
expect_error "ppl: a prompt as long as the window" ppl -m $M -f data/eval/linux.txt -c 256 --prompt-tokens 256
expect_error "ppl: --prompt-tokens and --prompt-fraction" ppl -m $M -f data/eval/linux.txt -c 256 --prompt-tokens 10 --prompt-fraction 0.5
expect_error "info: unknown cache type" info -m $M -ctv fp6
expect_error "info: no model and no --codecs" info
expect_error "info: --codecs with a model" info --codecs -m $M
expect_error "info: --codecs with a cache flag" info --codecs -ctk int2
expect_error "bench: unknown bench" bench nothing -m $M
mkdir -p "$T/badmodel" && cp $M/config.json "$T/badmodel/"
expect_error "model dir without weights" run -m "$T/badmodel" -p hi
cp $M/config.json $M/model.safetensors.index.json "$T/badmodel/" && head -c 1000 $M/model-00001-of-00003.safetensors > "$T/badmodel/model-00001-of-00003.safetensors"
expect_error "truncated shard" run -m "$T/badmodel" -p hi
mkdir -p "$T/badcfg" && echo '{"model_type": "gpt_neox"}' > "$T/badcfg/config.json"
expect_error "unknown architecture" info -m "$T/badcfg"
mkdir -p "$T/badtok" && cp $M/config.json $M/*.safetensors* "$T/badtok/" && echo '{"model": {"type": "Unigram"}}' > "$T/badtok/tokenizer.json"
expect_error "unsupported tokenizer" run -m "$T/badtok" -p hi
expect_error "rotation file missing" ppl -m $M -f data/eval/linux.txt --rotation /nonexistent.safetensors
expect_error "rotation file of the wrong kind" ppl -m $M -f data/eval/linux.txt --rotation tests/golden/golden.safetensors
expect_error "ppl: --rotation with a type that implies llama.cpp's attn_rot" ppl -m $M -f data/eval/linux.txt -ctk q4_0 --rotation hadamard
LLAMA_ATTN_ROT_DISABLE=1 expect_error "ppl: --attn-rot auto against LLAMA_ATTN_ROT_DISABLE" ppl -m $M -f data/eval/linux.txt -ctk q4_0 --attn-rot auto
expect_error "ppl: bad --attn-rot" ppl -m $M -f data/eval/linux.txt -ctk q4_0 --attn-rot on
expect_error "run: a clip for a llama.cpp type" run -m $M -p hi -n 1 -ctk q4_0 --kv-clip-k 0.9
expect_error "run: a group for llama.cpp types" run -m $M -p hi -n 1 -ctk q8_0 -ctv iq4_nl --kv-group 64
head -c 100 tests/golden/golden.safetensors > "$T/trunc.safetensors"
expect_error "truncated rotation file" ppl -m $M -f data/eval/linux.txt --rotation "$T/trunc.safetensors"
expect_error "calibrate: unknown method" calibrate -m $M --data data/calib/linux.txt --method spinquant -o "$T/r.safetensors"
expect_error "calibrate: budget below one chunk" calibrate -m $M --data data/calib/linux.txt --tokens 100 -o "$T/r.safetensors"
expect_error "calibrate: more chunks per layer than the budget holds" calibrate -m $M --data data/calib/linux.txt --method optr --calib-chunks 15 --heldout-chunks 2 -o "$T/r.safetensors"
expect_error "calibrate: zero calibration chunks" calibrate -m $M --data data/calib/linux.txt --method optr --calib-chunks 0 -o "$T/r.safetensors"
expect_error "calibrate: --kv-skip-layers" calibrate -m $M --data data/calib/linux.txt --kv-skip-layers 0 -o "$T/r.safetensors"
expect_error "calibrate: pnmix budget above 4 bits" calibrate -m $M --data data/calib/linux.txt --method pnmix --key-bits 5 -o "$T/p.safetensors"
expect_error "calibrate: pnmix budget not reachable" calibrate -m $M --data data/calib/linux.txt --method pnmix --key-bits 2.3 -o "$T/p.safetensors"
expect_error "calibrate: unknown pnmix score" calibrate -m $M --data data/calib/linux.txt --method pnmix --pnmix-score l2 -o "$T/p.safetensors"
expect_error "ppl: pnmix keys without --pnmix" ppl -m $M -f data/eval/linux.txt -ctk pnmix
expect_error "ppl: --pnmix without pnmix keys" ppl -m $M -f data/eval/linux.txt -ctk int2 --pnmix "$T/p.safetensors"
expect_error "ppl: pnmix values" ppl -m $M -f data/eval/linux.txt -ctk int2 -ctv pnmix
expect_error "ppl: a rotation file as --pnmix" ppl -m $M -f data/eval/linux.txt -ctk pnmix --pnmix tests/golden/golden.safetensors
"$KVQ" calibrate -m $M --data data/calib/linux.txt --method pnmix --tokens 256 --chunk 128 -o "$T/p.safetensors" >/dev/null 2>&1
head -c 300 "$T/p.safetensors" > "$T/ptrunc.safetensors"
expect_error "truncated pnmix file" ppl -m $M -f data/eval/linux.txt -ctk pnmix --pnmix "$T/ptrunc.safetensors"
expect_error "pnmix keys with a key rotation" ppl -m $M -f data/eval/linux.txt -ctk pnmix --pnmix "$T/p.safetensors" --rotation hadamard
"$KVQ" calibrate -m $M --data data/calib/linux.txt --method fp8-scales --tokens 256 --chunk 128 -o "$T/s.safetensors" >/dev/null 2>&1
expect_error "--kv-scales: a missing file" ppl -m $M -f data/eval/linux.txt -ctk fp8 -ctv fp8 --kv-scales "$T/none.safetensors"
expect_error "--kv-scales with int2" ppl -m $M -f data/eval/linux.txt -ctk int2 -ctv int2 --kv-scales "$T/s.safetensors"
expect_error "--kv-scales: e4m3 scales, e5m2 cache" ppl -m $M -f data/eval/linux.txt -ctk fp8_e5m2 -ctv fp8_e5m2 --kv-scales "$T/s.safetensors"
expect_error "--kv-scales with a rotation" ppl -m $M -f data/eval/linux.txt -ctk fp8 -ctv fp8 --kv-scales "$T/s.safetensors" --rotation hadamard
expect_error "--kv-scales: a rotation file" ppl -m $M -f data/eval/linux.txt -ctk fp8 -ctv fp8 --kv-scales tests/golden/golden.safetensors
head -c 200 "$T/s.safetensors" > "$T/strunc.safetensors"
expect_error "--kv-scales: a truncated file" ppl -m $M -f data/eval/linux.txt -ctk fp8 -ctv fp8 --kv-scales "$T/strunc.safetensors"
expect_error "--kv-cache-dtype of a keys-only type" ppl -m $M -f data/eval/linux.txt --kv-cache-dtype pnmix
expect_error "bench attention: --caches of a keys-only type" bench attention --ctx 64 --caches pnmix
expect_error "bench attention: --kv-scales" bench attention --ctx 64 -ctk fp8 -ctv fp8 --kv-scales "$T/s.safetensors"
expect_error "calibrate fp8-scales with a rotation" calibrate -m $M --data data/calib/linux.txt --method fp8-scales --rotation hadamard -o "$T/s2.safetensors"
expect_error "pnmix keys with bf16 values on the GPU" ppl -m $M -f data/eval/linux.txt -ctk pnmix --pnmix "$T/p.safetensors" --device cuda
expect_error "calibrate: missing data file" calibrate -m $M --data /nonexistent.txt -o "$T/r.safetensors"
expect_error "eval: unknown task" eval -m $M --tasks ppl,bleu
expect_error "eval: bad ctx list" eval -m $M --ctx 2048,abc
expect_error "eval: ctx beyond the model" eval -m $M --tasks ppl --ctx 16384
expect_error "eval: missing data dir" eval -m $M --tasks ppl --data /nonexistent
expect_error "referee: calibration data inside the eval set" referee -m $M --calib-data data/eval/linux.txt --eval-data data/eval -o "$T/ref" --quick
expect_error "referee: --report-only with --calibrate-only" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --report-only --calibrate-only
expect_error "referee: --report-only without any run" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref-empty" --report-only
expect_error "eval: unknown device" eval -m $M --device tpu
expect_error "referee: a clip listed twice" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --clip-grid 0.9,0.9
expect_error "referee: a malformed --cost-shape" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --cost-shape 8by32768
expect_error "referee: a --cost-shape of 0 sequences" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --cost-shape 0x1024
expect_error "referee: --plan with --report-only" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --plan --report-only
expect_error "referee: --plan of a shape without tokenizer over every window" referee -m models/shapes/qwen3-8b --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --plan --windows 0
expect_error "referee: --plan beyond the model's context" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --plan --ctx 65536 --methods bf16
expect_error "referee: --skip-unsupported with a value" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --skip-unsupported=maybe
expect_error "referee: a clip above 1" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --clip-grid 0.9,1.5
expect_error "referee: a clip that is not a number" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --clip-grid 0.9,x
expect_error "referee: unknown method" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --methods int2,int3
expect_error "run: unknown device" run -m $M -p hi -n 1 --device tpu
expect_error "ppl: unknown GPU GEMM precision" ppl -m $M -f data/eval/linux.txt --device cuda --gpu-gemm fp16
expect_error "bench decode: a bad --cuda-graphs value" bench decode -m $M -c 64 --device cuda --cuda-graphs maybe
expect_error "bench decode: a negative --warmup" bench decode -m $M -c 64 --warmup -1
expect_error "bench decode: context + warm-up + timed steps past the model's" bench decode -m $M -c 8190 -n 2 --warmup 1
S=models/shapes/qwen3-8b  # a config without weights: only --dummy-weights runs it
expect_error "ppl: dummy weights" ppl -m $M -f data/eval/linux.txt --dummy-weights
expect_error "eval: dummy weights" eval -m $M --tasks ppl --dummy-weights
expect_error "referee: dummy weights" referee -m $M --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --quick --dummy-weights
expect_error "referee: no model" referee --calib-data data/calib/linux.txt --eval-data data/eval -o "$T/ref" --quick
expect_error "referee: --results without --report-only" referee --results docs/reports/referee-niah-results.json.gz -o "$T/rr"
expect_error "referee: --results with a model" referee --report-only --results docs/reports/referee-niah-results.json.gz -m $M -o "$T/rr"
head -c 3000 docs/reports/referee-niah-results.json.gz > "$T/truncated.json.gz"
expect_error "referee: a truncated results.json.gz" referee --report-only --results "$T/truncated.json.gz" -o "$T/rr"
printf '{"runs": [' > "$T/bad.json"
expect_error "referee: results that are not JSON" referee --report-only --results "$T/bad.json" -o "$T/rr"
printf '{"runs": []}' > "$T/other.json"
expect_error "referee: a JSON that is not a referee's results" referee --report-only --results "$T/other.json" -o "$T/rr"
expect_error "info: --markdown without --codecs" info -m $M --markdown
expect_error "calibrate: dummy weights" calibrate -m $M --data data/calib/linux.txt -o "$T/r.safetensors" --dummy-weights
expect_error "run: dummy weights" run -m $S -p hi -n 1 --dummy-weights
expect_error "bench decode: a shape config without --dummy-weights" bench decode -m $S -c 64
expect_error "bench decode: a rotation file with dummy weights" bench decode -m $M -c 64 --dummy-weights --rotation tests/golden/golden.safetensors
expect_error "run: --rotation random (bench decode's timing stand-in)" run -m $M -p hi -n 1 --rotation random
expect_error "bench decode: a bad --seqs" bench decode -m $M -c 64 --seqs many
expect_error "bench decode: --seqs 0" bench decode -m $M -c 64 --seqs 0
expect_error "bench decode: --vs-bf16 of a bf16 cache" bench decode -m $M -c 64 --vs-bf16
expect_error "bench decode: --seqs max on the CPU without a budget" bench decode -m $M -c 64 --seqs max --dummy-weights
expect_error "bench decode: --fill-cache on the CPU" bench decode -m $M -c 64 --fill-cache
expect_error "bench decode: --seqs max with a budget that holds no sequence" bench decode -m $M -c 4096 --seqs max --kv-budget-gib 0.001 --dummy-weights
expect_error "bench gemm: a directory without config.json" bench gemm -m data
expect_error "bench gemm: --rows 0" bench gemm -m $S --rows 0
expect_error "bench gemm: a malformed --rows" bench gemm -m $S --rows 8,x
expect_error "bench gemm: a negative --lt" bench gemm -m $S --lt -1
expect_error "bench attention: --kv-split on the CPU" bench attention --ctx 256 --kv-split 2048
expect_error "bench attention: a negative --kv-split" bench attention --device cuda --kv-split -128
expect_error "serve: unknown chat template name" serve -m $M --chat-template vicuna
expect_error "serve: a chat template with dummy weights (token ids only)" serve -m $S --dummy-weights --chat-template chatml
# ~61 GiB of bf16 weights: more host memory than a CI machine has
expect_error "bench decode: dummy weights larger than the host's memory" bench decode -m models/shapes/qwen3-32b --dummy-weights -c 64
expect_error "serve: zero running sequences" serve -m $M -np 0
expect_error "serve: port out of range" serve -m $M --port 70000
expect_error "serve: context larger than the model's" serve -m $M -c 100000
expect_error "serve: a negative --queue-timeout" serve -m $M --queue-timeout -1
expect_error "serve: zero --http-threads" serve -m $M --http-threads 0
expect_error "serve: a zero --idle-timeout" serve -m $M --idle-timeout 0
mkdir -p "$T/badchat" && cp $M/config.json $M/*.safetensors* $M/tokenizer.json "$T/badchat/" && printf '%s' '{"chat_template": "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"}' > "$T/badchat/tokenizer_config.json"
expect_error "serve: a chat template kvq does not render" serve -m "$T/badchat" --port 0
# The checkpoints users bring (tests/models): groups that do not fit the head_dim, what the GPU does not run, configs
# kvq does not run.
expect_error "run: an explicit group that does not divide head_dim 64" run -m tests/models/llama3-d64 -p hi -n 1 \
  -ctk int2 --kv-group 128
expect_error "run: int2 at head_dim 80 (no group of 32, 64, 128 divides it)" run -m tests/models/llama-d80 -p hi -n 1 \
  -ctk int2 -ctv int2
expect_error "info: a sliding-window model with a pair only tensor cores run" info -m tests/models/mistral-d64-sw \
  --device cuda -ctk int2 -ctv bf16
mkdir -p "$T/moe" "$T/awq" && cp tests/malformed/config_moe.json "$T/moe/config.json" && \
  cp tests/malformed/config_quantized.json "$T/awq/config.json"
expect_error "info: a mixture-of-experts config" info -m "$T/moe"
expect_error "run: a quantized checkpoint's config" run -m "$T/awq" -p hi -n 1
mkdir -p "$T/rope" && cp tests/malformed/config_bad_rope_type.json "$T/rope/config.json"
expect_error "info: a RoPE type kvq does not run (yarn)" info -m "$T/rope"
# Checkpoints broken on disk: a shard the index names is missing, a shard cut short, tensors not of the config's shape.
mkdir -p "$T/noshard" "$T/trunc" "$T/shape"
for f in models/ref/*; do ln -s "$PWD/$f" "$T/noshard/"; done
rm "$T/noshard/model-00002-of-00003.safetensors"
expect_error "run: a shard the index names is missing" run -m "$T/noshard" -p hi -n 1
cp tests/models/qwen3-d128/config.json tests/models/qwen3-d128/tokenizer*.json "$T/trunc/"
head -c 100000 tests/models/qwen3-d128/model.safetensors > "$T/trunc/model.safetensors"
expect_error "run: a shard cut short" run -m "$T/trunc" -p hi -n 1
expect_error "bench decode: a shard cut short" bench decode -m "$T/trunc" -c 64 -n 1
cp tests/models/qwen3-d128/* "$T/shape/"
sed -i 's/"intermediate_size": \([0-9]*\)/"intermediate_size": 1\1/' "$T/shape/config.json"
expect_error "run: tensors not of the config's shapes" run -m "$T/shape" -p hi -n 1
# Fails everywhere: without CUDA or a device (no device), with one (f32 caches are CPU-only).
expect_error "run: --device cuda with a CPU-only cache" run -m $M -p hi -n 1 --device cuda -ctk f32 -ctv f32
if ! nvidia-smi -L >/dev/null 2>&1; then  # no GPU here: --device cuda must be refused in one line
  expect_error "run: --device cuda without a device" run -m $M -p hi -n 1 --device cuda
  expect_error "ppl: --device cuda without a device" ppl -m $M -f data/eval/linux.txt --device cuda
  expect_error "bench decode: --device cuda without a device" bench decode -m $M --device cuda --ctx 64,128 --seqs 4
fi
echo "$((n - fail)) passed, $fail failed"
[[ $fail -eq 0 ]]
