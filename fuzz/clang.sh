#!/usr/bin/env bash
# clang++ for the fuzzers (fuzz.bzl): says clearly what is missing instead of failing deep
# inside a compile. Arguments are passed to clang++ unchanged.
set -euo pipefail
clang="${ONEBIT_FUZZ_CLANG:-clang++}"
if ! command -v "$clang" >/dev/null 2>&1; then
  echo "fuzz: error: $clang not found; the fuzzers need clang and its libFuzzer runtime" \
       "(Debian: apt-get install clang libclang-rt-14-dev; deploy/install-deps.sh does it)" >&2
  exit 1
fi
runtime="$("$clang" -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)"
if [ ! -f "$runtime" ]; then
  runtime_dir="$("$clang" -print-runtime-dir 2>/dev/null || true)"
  runtime="$runtime_dir/libclang_rt.fuzzer-x86_64.a"
fi
if [ ! -f "$runtime" ]; then
  echo "fuzz: error: $clang has no libFuzzer runtime (libclang_rt.fuzzer-x86_64.a);" \
       "Debian: apt-get install libclang-rt-14-dev (deploy/install-deps.sh does it)" >&2
  exit 1
fi
exec "$clang" "$@"
