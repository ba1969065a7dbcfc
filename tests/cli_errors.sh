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
echo "$((n - fail)) passed, $fail failed"
[[ $fail -eq 0 ]]
