#!/usr/bin/env bash
# The README's main command (for now): install, build, then replay a synthetic gradient
# stream through 1-bit Adam with 4 workers, once over the in-process transport and once
# over gloo (TCP on 127.0.0.1), and check that both give the same parameters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bazel build -c opt //tools:onebit-replay //tools:onebit-gradient-stream

out=${ONEBIT_DEMO_DIR:-out/replay-demo}
mkdir -p "$out"
workers=4 steps=100 n=1000000 freeze=20
./bazel-bin/tools/onebit-gradient-stream --workers=$workers --steps=$steps --n=$n --out_dir="$out"
for transport in inproc gloo; do
  echo "== onebit-replay over $transport"
  ./bazel-bin/tools/onebit-replay --optimizer=onebit_adam --workers=$workers \
    --lr=1e-3 --freeze-step=$freeze --weight-decay=0.01 \
    --params="$out/params.npy" --grads="$out/grads.npy" --out="$out/params_$transport.npy" \
    --transport=$transport
done
if cmp -s "$out/params_inproc.npy" "$out/params_gloo.npy"; then
  echo "inproc and gloo produced identical parameters ($out/params_inproc.npy)"
else
  echo "error: inproc and gloo results differ" >&2
  exit 1
fi
