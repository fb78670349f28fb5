#!/usr/bin/env bash
# The README's main command: install what is missing, build, then run a real distributed
# 1-bit Adam job on this machine (a coordinator, 2 parameter-server shards and 4 workers,
# all separate processes on loopback, ports chosen free) training Fashion-MNIST, then the
# same job with plain Adam, and print the comparison. Extra arguments go to the launcher
# (e.g. --config=my.json, --echo_all=false, --compare_adam=false).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bazel build //deploy:onebit-launch
exec ./bazel-bin/deploy/onebit-launch --config=deploy/demo.json --out_dir=out/demo \
  --bin_dir=bazel-bin "$@"
