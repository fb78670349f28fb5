#!/usr/bin/env bash
# Every test (or the targets given) under AddressSanitizer + UndefinedBehaviorSanitizer
# (.bazelrc's config asan), with LeakSanitizer's suppressions (tools/lsan.supp) found by
# every process of a test, children included. The libFuzzer targets are left out: they
# have their own sanitizer build (fuzz/).
#
#   tools/asan_test.sh                      # all: about 15 min to build on 2 cores
#   tools/asan_test.sh //tests:job_test
set -euo pipefail
cd "$(dirname "$0")/.."
export LSAN_OPTIONS="suppressions=$PWD/tools/lsan.supp"
if [ $# -eq 0 ]; then set -- //...; fi
exec bazel test --config=asan --test_tag_filters=-fuzz --keep_going "$@"
