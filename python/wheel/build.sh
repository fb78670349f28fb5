#!/usr/bin/env bash
# Builds onebit's wheel (the package, its extension and the job binaries) into dist/:
#
#   bash python/wheel/build.sh
#   python3 -m venv --system-site-packages venv     # sees Debian's python3-torch
#   venv/bin/pip install --no-index dist/onebit-*.whl
#
# then `import onebit.torch` works from anywhere, and onebit-coordinator, onebit-server,
# onebit-worker, onebitctl and onebit-launch are on the venv's PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/install-deps.sh >/dev/null
bazel build //python:wheel
mkdir -p dist
rm -f dist/onebit-*.whl
cp bazel-bin/python/onebit-*.whl dist/
chmod u+w dist/onebit-*.whl
ls -l dist/onebit-*.whl
