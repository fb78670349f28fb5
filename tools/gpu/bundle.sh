#!/usr/bin/env bash
# Packs what tools/gpu/check.sh runs on a GPU machine into gpu-bundle/ (git ignores it: the
# script adds it to .git/info/exclude). That machine has CUDA, NCCL, PyTorch and a C++
# compiler but no Bazel, gRPC or Debian packages, so everything is built here:
#   - the GPU tests and the job binaries (bazel-bin's layout, stripped), in bundle.tar.xz;
#   - the Debian shared libraries they load (not glibc, libstdc++ or CUDA's: the GPU
#     machine's own are used);
#   - the Python package as users install it: the manylinux wheel (//python:wheel), which
#     check.sh unpacks unchanged for that machine's own Python and torch (its core is a C
#     library loaded with ctypes: nothing is compiled there);
#   - Fashion-MNIST (Debian's dataset-fashion-mnist).
#   - with BEFORE=COMMIT, the kernel benchmark of that commit too (gpu-bundle/before_bench,
#     built in a temporary git worktree), which check.sh's kernel_bench_before runs in the
#     same call, so that a kernel change is measured against its base on the same card.
# Usage: tools/gpu/bundle.sh            then carry gpu-bundle and run tools/gpu/check.sh.
#        BEFORE=b1fb0d6 tools/gpu/bundle.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
B="$ROOT/gpu-bundle"
S="$B/stage"
grep -qx '/gpu-bundle/' .git/info/exclude 2>/dev/null || echo '/gpu-bundle/' >> .git/info/exclude

# Test binaries are linked statically (their BUILD says why); the job binaries load the
# Debian libraries copied below.
TESTS=(
  kernels/cuda_backend_test kernels/cuda_determinism_test kernels/cuda_kernels_benchmark
  compression/fp8/fp8_cuda_test worker/workloads/mlp_cuda_test worker/transport/nccl_transport_test worker/trainer_test
)
BINARIES=(
  deploy/onebit-launch coordinator/onebit-coordinator server/onebit-server
  worker/onebit-worker tools/onebitctl tools/onebit-replay tools/onebit-gradient-stream
)
labels=(//python:wheel)
for p in "${TESTS[@]}" "${BINARIES[@]}"; do labels+=("//${p%/*}:${p##*/}"); done
bazel build "${labels[@]}"

rm -rf "$B"
mkdir -p "$S/bin/python" "$S/lib" "$S/include" "$B/fashion-mnist"
for p in "${TESTS[@]}" "${BINARIES[@]}"; do
  install -D -m 755 "bazel-bin/$p" "$S/bin/$p"
  strip "$S/bin/$p"
done
cp bazel-bin/python/onebit-*manylinux*.whl "$S/"

# Every Debian library the binaries load, except the ones any Linux with CUDA has.
system='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libnccl|libcublas|libcublasLt|libcudart|linux-vdso)\.so'
for f in "${TESTS[@]/#/$S/bin/}" "${BINARIES[@]/#/$S/bin/}"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  name="$(basename "$lib")"
  [[ "$name" =~ $system ]] && continue
  cp -L "$lib" "$S/lib/$name"
done

cp /usr/share/datasets/fashion-mnist/*.gz "$B/fashion-mnist/"

if [ -n "${BEFORE:-}" ]; then
  commit="$(git rev-parse --verify "$BEFORE^{commit}")"
  parent="$(mktemp -d)"
  tree="$parent/before"
  git worktree add -q --detach "$tree" "$commit"
  echo "bundle.sh: building the kernel benchmark of $commit in $tree"
  built=0
  (cd "$tree" && bazel build //kernels:cuda_kernels_benchmark &&
    install -m 755 bazel-bin/kernels/cuda_kernels_benchmark "$B/before_bench" &&
    strip "$B/before_bench" && bazel shutdown) || built=$?
  # The worktree goes whether or not the build did (a failed one is reported below).
  git worktree remove --force "$tree" && rmdir "$parent"
  if [ "$built" -ne 0 ]; then
    echo "bundle.sh: the kernel benchmark of $commit did not build" >&2
    exit 1
  fi
  echo "$commit" > "$B/before_commit"
fi
tar -C "$S" -cJf "$B/bundle.tar.xz" .
rm -rf "$S"
du -sh "$B" "$B"/*
