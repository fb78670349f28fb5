#!/usr/bin/env bash
set -euo pipefail
cd "${TEST_TMPDIR:?}"
/usr/bin/python3 "${TEST_SRCDIR:?}/onebit/tools/refs_check_test.py"
