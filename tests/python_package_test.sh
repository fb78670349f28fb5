#!/usr/bin/env bash
# The Python package (python/onebit) through real jobs: tests/../python/tests/package_test.py
# with Debian's python3 and python3-torch (deploy/install-deps.sh installs them).
set -euo pipefail
# One intra-op thread per PyTorch process: the jobs run several processes at once.
export OMP_NUM_THREADS=1
py=/usr/bin/python3
root="${TEST_SRCDIR:?}/onebit"
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch and numpy (Debian's python3-torch is not installed;" \
       "deploy/install-deps.sh installs it): the Python package was not tested"
  exit 0
fi
cd "${TEST_TMPDIR:?}"
exec "$py" "$root/python/tests/package_test.py" "$root"
