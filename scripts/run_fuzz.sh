#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD_DIR (executables named fuzz_*) for SECONDS each, on a corpus seeded from
# fuzz/seeds, tests/malformed, tests/server/requests, tests/models and, when present, tests/golden and models/ref (files
# under 1 MiB), with fuzz/<target>.dict as dictionary when present. Fails when
# a target crashes; crash inputs are kept under BUILD_DIR/fuzz-artifacts/<target>/.
#   scripts/run_fuzz.sh BUILD_DIR SECONDS
#   scripts/run_fuzz.sh --install-deps     install clang and the libFuzzer runtime (Debian), only those missing
set -euo pipefail

if [[ "${1:-}" == "--install-deps" ]]; then
  bash "$(dirname "$0")/install_deps.sh" clang libclang-rt-14-dev
  exit 0
fi

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS | $0 --install-deps" >&2
  exit 2
fi
BUILD_DIR=$1
SECONDS_EACH=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)

mapfile -t TARGETS < <(find "$BUILD_DIR" -maxdepth 1 -type f -name 'fuzz_*' -perm -u+x | sort)
if ((${#TARGETS[@]} == 0)); then
  echo "run_fuzz: no fuzz_* executables in $BUILD_DIR (configure with -DKVQ_FUZZ=ON and CXX=clang++)" >&2
  exit 1
fi

failed=()
for target in "${TARGETS[@]}"; do
  name=$(basename "$target")
  corpus="$BUILD_DIR/fuzz-corpus/$name"
  artifacts="$BUILD_DIR/fuzz-artifacts/$name"
  mkdir -p "$corpus" "$artifacts"
  # Seeds: every regular file of the committed corpora (libFuzzer dedups by content hash when it saves).
  for seeds in "$ROOT/fuzz/seeds" "$ROOT/tests/malformed" "$ROOT/tests/server/requests" "$ROOT/tests/models" \
      "$ROOT/tests/golden" "$ROOT/models/ref"; do
    [[ -d "$seeds" ]] || continue
    while IFS= read -r -d '' f; do
      cp "$f" "$corpus/seed_$(sha256sum "$f" | cut -c1-16)"
    done < <(find "$seeds" -type f -size -1024k -print0)
  done
  echo "run_fuzz: $name for ${SECONDS_EACH}s on $(ls "$corpus" | wc -l) corpus files"
  log="$BUILD_DIR/fuzz-artifacts/$name.log"
  dict=()
  [[ -f "$ROOT/fuzz/$name.dict" ]] && dict=(-dict="$ROOT/fuzz/$name.dict")
  if "$target" "${dict[@]}" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$artifacts/" -print_final_stats=1 "$corpus" >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^stat::new_units_added|^#[0-9]+ +DONE" "$log" |
      sed "s/^/  $name: /" || true
  else
    echo "run_fuzz: $name FAILED; see $log and $artifacts/" >&2
    tail -n 30 "$log" >&2
    failed+=("$name")
  fi
done

if ((${#failed[@]})); then
  echo "run_fuzz: crashes in: ${failed[*]}" >&2
  exit 1
fi
echo "run_fuzz: ${#TARGETS[@]} target(s) ran ${SECONDS_EACH}s each without a crash"
