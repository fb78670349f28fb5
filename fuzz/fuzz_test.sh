#!/usr/bin/env bash
# The in-suite fuzz test (fuzz/BUILD :fuzz_test): every fuzzer first proves that a crash
# fails it (the canary inputs of fuzz_support.h: a heap overflow and a blown heap budget),
# then runs its whole seed corpus and fuzzes on for a few seconds from a fixed seed. Any
# crash, sanitizer report, leak, timeout or heap-budget overrun fails the test; the
# offending input is kept in the test's undeclared outputs (bazel-testlogs/fuzz/fuzz_test/
# test.outputs/), and `bazel-bin/fuzz/TARGET FILE` replays it.
#
# Arguments: the fuzzer binaries. ONEBIT_FUZZ_SECONDS (default 8) is the fuzzing time per
# target (bazel test //fuzz:fuzz_test --test_env=ONEBIT_FUZZ_SECONDS=60 for a longer run).
set -uo pipefail

seconds="${ONEBIT_FUZZ_SECONDS:-8}"
# fuzz/ in the runfiles (Bazel runs tests from the runfiles root): corpus/ and dict/.
here="${ONEBIT_FUZZ_DATA:-fuzz}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-$tmp/artifacts}"
mkdir -p "$artifacts"
# Sanitizer reports as crashes with stack traces; leaks count.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

if [ "$#" -eq 0 ]; then
  echo "fuzz_test: no fuzzers given" >&2
  exit 1
fi

failures=()
summary=()
for fuzzer in "$@"; do
  name="$(basename "$fuzzer")"
  seeds="$here/corpus/$name"
  if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds")" ]; then
    echo "fuzz_test: $name has no seed corpus in fuzz/corpus/$name" >&2
    failures+=("$name: no seeds")
    continue
  fi
  num_seeds="$(ls -A "$seeds" | wc -l)"

  # 1. The canaries must crash: otherwise a passing run below would prove nothing.
  for canary in ONEBIT-FUZZ-CANARY ONEBIT-FUZZ-CANARY-HEAP; do
    printf '%s' "$canary-input" > "$tmp/$name-canary"
    log="$tmp/$name-$canary.log"
    # In a subshell that waits (exit $?), so that its "Aborted" notice goes to the log.
    if (ONEBIT_FUZZ_CANARY=1 "$fuzzer" -artifact_prefix="$tmp/$name-canary-" \
          "$tmp/$name-canary"; exit $?) >"$log" 2>&1; then
      echo "fuzz_test: $name did not fail on the canary input $canary: a crash would go unnoticed" >&2
      tail -n 20 "$log" >&2
      failures+=("$name: canary $canary passed")
    elif ! grep -q -e "AddressSanitizer: heap-buffer-overflow" -e "heap budget exceeded" "$log"; then
      echo "fuzz_test: $name failed on the canary $canary, but not as expected:" >&2
      tail -n 20 "$log" >&2
      failures+=("$name: canary $canary failed oddly")
    fi
  done

  # 2. Seeds, then fuzzing from a fixed seed for a bounded time (canaries disarmed: the
  # fuzzer would find them).
  corpus="$tmp/corpus/$name"
  mkdir -p "$corpus"
  dict=()
  stem="${name%_fuzzer}"
  [ -f "$here/dict/$stem.dict" ] && dict=(-dict="$here/dict/$stem.dict")
  log="$tmp/$name.log"
  start=$SECONDS
  "$fuzzer" -seed=1 -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$name-" "${dict[@]}" \
      "$corpus" "$seeds" >"$log" 2>&1
  rc=$?
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz_test: $name failed (exit $rc); the input is in $artifacts:" >&2
    grep -v -e '^#[0-9]' -e '^INFO:' "$log" | tail -n 60 >&2
    failures+=("$name: exit $rc")
    continue
  fi
  if [ -z "$runs" ] || [ "$runs" -lt "$num_seeds" ]; then
    echo "fuzz_test: $name ran ${runs:-no} inputs for $num_seeds seeds:" >&2
    tail -n 30 "$log" >&2
    failures+=("$name: did not run")
    continue
  fi
  summary+=("$(printf '%-20s %9s executions in %3ss, %3s seeds, corpus now %s' \
      "$name" "$runs" "$((SECONDS - start))" "$num_seeds" "$(ls -A "$corpus" | wc -l)")")
done

printf '%s\n' "${summary[@]}"
if [ "${#failures[@]}" -gt 0 ]; then
  printf 'fuzz_test: FAILED: %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "fuzz_test: every fuzzer passed its canaries, seeds and ${seconds}s of fuzzing"
