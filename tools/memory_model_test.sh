#!/usr/bin/env bash
# The memory model (memory_model.py, docs/performance.md "Memory"): its layout, closed
# forms, refusals and table, the code its rows name, and its CPU prediction against the
# peaks tools/bench_memory.sh recorded (results/bench/2026-11-29/memory-step7/results.csv).
set -euo pipefail
cd "${TEST_TMPDIR:?}"
/usr/bin/python3 "${TEST_SRCDIR:?}/onebit/tools/memory_model_test.py"
