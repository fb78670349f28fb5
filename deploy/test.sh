#!/usr/bin/env bash
# The README's test command: install what is missing, then build everything (CUDA code
# included, compiled with nvcc; no GPU needed) and run every test. GPU tests skip with a
# message when there is no GPU. Then the build without CUDA (tests/cpu_only_build.sh: the
# wheel for CPUs only, in an output base of its own). Before the build, tools/refs_check.py
# checks that the docs and code comments name only files the repository has.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
/usr/bin/python3 tools/refs_check.py .
bazel build //...
bazel test //... "$@"
bash tests/cpu_only_build.sh
