#!/usr/bin/env bash
# The prose check (prose_check.py) on this repository's pages, after its own test.
set -euo pipefail
root="${TEST_SRCDIR:?}/onebit"
/usr/bin/python3 "$root/docs/prose_check_test.py"
/usr/bin/python3 "$root/docs/prose_check.py" "$root"
