#!/usr/bin/env bash
# Builds onebit's wheel (the package, its native core and the job binaries, with the shared
# libraries they load bundled: manylinux_2_35_x86_64, any CPython >= 3.9) into dist/:
#
#   bash python/wheel/build.sh
#   python3 -m venv venv && venv/bin/pip install dist/onebit-*.whl   # pulls torch from PyPI
#
# then `import onebit.torch` works from anywhere, and onebit-coordinator, onebit-server,
# onebit-worker, onebitctl, onebit-launch and onebit-run are on the venv's PATH. Installs
# only what the build needs (deploy/install-deps.sh --build: no test or deployment tools).
# Needs no CUDA: without /usr/local/cuda/bin/nvcc, or with ONEBIT_CUDA=off in the
# environment, the wheel is for CPUs only, and a job on device "cuda" fails with an error
# that says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/install-deps.sh --build >/dev/null
bazel build //python:wheel
mkdir -p dist
rm -f dist/onebit-*.whl
cp bazel-bin/python/onebit-*manylinux*.whl dist/
chmod u+w dist/onebit-*.whl
ls -l dist/onebit-*.whl
