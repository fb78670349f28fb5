#!/usr/bin/env bash
# A longer fuzzing run of one target:
#
#   fuzz/run.sh TARGET [SECONDS] [-- LIBFUZZER_FLAGS...]
#
# TARGET is a fuzzer of fuzz/BUILD (part_fuzzer, rest_fuzzer, ...; `fuzz/run.sh` lists
# them), SECONDS the fuzzing time (default 300). It builds the target with Bazel, starts
# from the seeds in fuzz/corpus/TARGET plus the inputs earlier runs found
# (out/fuzz/TARGET/corpus, not committed), uses fuzz/dict/ when there is one, and keeps
# crashing inputs in out/fuzz/TARGET/. The last line says how many inputs ran.
#
# Replay one input: bazel-bin/fuzz/TARGET FILE (ONEBIT_FUZZ_VERBOSE=1 says what each
# decoder answered). A crash worth keeping goes to fuzz/corpus/TARGET/ once fixed, and to
# fuzz/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=$(sed -n 's/^    "\([a-z_0-9]*_fuzzer\)": \[.*/\1/p' fuzz/BUILD)
if [ "$#" -lt 1 ] || ! grep -qx "$1" <<<"$targets"; then
  echo "usage: fuzz/run.sh TARGET [SECONDS] [-- LIBFUZZER_FLAGS...]; targets:" >&2
  echo "$targets" | sed 's/^/  /' >&2
  exit 2
fi
target="$1"
seconds="${2:-300}"
shift $(( $# >= 2 ? 2 : 1 ))
[ "${1:-}" = "--" ] && shift

bazel build "//fuzz:$target"
work="out/fuzz/$target"
mkdir -p "$work/corpus"
dict=()
[ -f "fuzz/dict/${target%_fuzzer}.dict" ] && dict=(-dict="fuzz/dict/${target%_fuzzer}.dict")
log="$work/run-$(date +%Y%m%d-%H%M%S).log"
cmd=("bazel-bin/fuzz/$target" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048
     -print_final_stats=1 -artifact_prefix="$work/" "${dict[@]}" "$@"
     "$work/corpus" "fuzz/corpus/$target")
echo "fuzz/run.sh: ${cmd[*]}" | tee "$log"
set +e
"${cmd[@]}" 2>&1 | tee -a "$log" | grep -v -e '^#[0-9]*[[:space:]]*\(NEW\|REDUCE\|pulse\|RELOAD\)'
rc=${PIPESTATUS[0]}
set -e
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
echo "fuzz/run.sh: $target: exit $rc, ${runs:-?} inputs in ${seconds}s, corpus $(ls "$work/corpus" | wc -l) files, log $log"
exit "$rc"
