#!/usr/bin/env bash
# The Python package (python/onebit) through real jobs: python/tests/package_test.py, on one
# of the two PyTorch stacks onebit is tested on:
#   debian        Debian 12's python3 (3.11) with python3-torch 1.13 and NumPy 1.24
#                 (deploy/install-deps.sh installs them)
#   torch-latest  pip's newest torch and NumPy 2 on pyenv's CPython, with no Debian Python
#                 package in sight ($ONEBIT_VENVS/torch-latest: python/envs/setup.sh)
set -euo pipefail
# One intra-op thread per PyTorch process: the jobs run several processes at once.
export OMP_NUM_THREADS=1
stack=${1:?usage: python_package_test.sh debian|torch-latest}
case "$stack" in
  debian) py=/usr/bin/python3 ;;
  torch-latest) py="${ONEBIT_VENVS:-/opt/onebit/venvs}/torch-latest/bin/python" ;;
  *) echo "no stack $stack" >&2; exit 2 ;;
esac
root="${TEST_SRCDIR:?}/onebit"
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch and numpy (the $stack stack is not installed:" \
       "deploy/install-deps.sh installs both): the Python package was not tested on it"
  exit 0
fi
"$py" -c 'import sys, torch, numpy; print(f"stack: Python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}, NumPy {numpy.__version__}")'
cd "${TEST_TMPDIR:?}"
exec "$py" "$root/python/tests/package_test.py" "$root"
