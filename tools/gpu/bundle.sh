#!/usr/bin/env bash
# Packs what tools/gpu/check.sh runs on a GPU machine into gpu-bundle/ (git ignores it: the
# script adds it to .git/info/exclude). That machine has CUDA, NCCL, PyTorch and a C++
# compiler but no Bazel, gRPC or Debian packages, so everything is built here:
#   - the GPU tests and the job binaries (bazel-bin's layout, stripped), in bundle.tar.xz;
#   - the Debian shared libraries they load (not glibc, libstdc++ or CUDA's: the GPU
#     machine's own are used);
#   - the Python package's C++ side as a shared library (libonebit_worker.so: every object
#     of //python:_onebit_core.so except core.cc) and the Abseil headers core.cc includes,
#     so that check.sh compiles the small pybind11 module there, against that machine's
#     Python and pybind11 (its PyTorch needs them; Debian's are other versions);
#   - Python 3.12's headers where this machine has a CPython 3.12, for a GPU machine whose
#     Python came without them;
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
  worker/workloads/mlp_cuda_test worker/transport/nccl_transport_test worker/trainer_test
)
BINARIES=(
  deploy/onebit-launch coordinator/onebit-coordinator server/onebit-server
  worker/onebit-worker tools/onebitctl tools/onebit-replay tools/onebit-gradient-stream
)
labels=(//python:_onebit_core.so)
for p in "${TESTS[@]}" "${BINARIES[@]}"; do labels+=("//${p%/*}:${p##*/}"); done
bazel build "${labels[@]}"

rm -rf "$B"
mkdir -p "$S/bin/python" "$S/lib" "$S/include" "$B/fashion-mnist"
for p in "${TESTS[@]}" "${BINARIES[@]}"; do
  install -D -m 755 "bazel-bin/$p" "$S/bin/$p"
  strip "$S/bin/$p"
done
cp -r python/onebit "$S/bin/python/"

# libonebit_worker.so: the link of //python:_onebit_core.so without core.cc, with the same
# libraries (read from Bazel's own link action).
link="$(bazel aquery 'mnemonic("CppLink", //python:_onebit_core.so)' --output=text 2>/dev/null)"
mapfile -t objects < <(grep -oE 'bazel-out/[^ ,]+\.pic\.o' <<<"$link" | grep -v '/core\.pic\.o$' | sort -u)
mapfile -t libs < <(sed -n '/Command Line/,/^ *#/p' <<<"$link" | tr -d "\\\\'" |
  sed 's/ *$//' | grep -oE '^ +(-l[^ ]+|-L/[^ ]+|-pthread)$' | sed 's/^ *//')
g++ -shared -o "$S/lib/libonebit_worker.so" "${objects[@]}" \
  -Wl,-S -Wl,-rpath,'$ORIGIN:/usr/local/cuda/lib64' -L/usr/local/cuda/lib64 "${libs[@]}"

# The headers core.cc includes that are neither the compiler's, glibc's, Python's nor
# pybind11's: Debian's Abseil, protobuf, gRPC and prometheus-cpp, and the generated
# protobuf and gRPC headers of proto/ (the project's own sources travel with the tree).
dep=bazel-out/k8-fastbuild/bin/python/_objs/_onebit_core.so/core.pic.d
tr ' \\' '\n\n' <"$dep" | grep -E '^/usr/include/(absl|google|grpc|grpcpp|prometheus)/' |
  sort -u | while read -r h; do
    install -D -m 644 "$h" "$S/include/${h#/usr/include/}"
  done
tr ' \\' '\n\n' <"$dep" | grep -E '^bazel-out/.*/_virtual_includes/' | sort -u | while read -r h; do
  install -D -m 644 "$h" "$S/include/$(sed -E 's#.*/_virtual_includes/[^/]+/##' <<<"$h")"
done

# Python 3.12's headers (the GPU machine's PyTorch runs on 3.12), for a machine whose
# Python has none: from a local CPython 3.12 if there is one (pyenv's on the project's
# machines; the C API is the same across 3.12.x).
for py312 in "${PY312:-}" /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
  [ -x "$py312" ] || continue
  inc="$("$py312" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  if [ -f "$inc/Python.h" ]; then
    mkdir -p "$S/python-include" && cp -r "$inc" "$S/python-include/python3.12"
    break
  fi
done

# Every Debian library the binaries load, except the ones any Linux with CUDA has.
system='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libnccl|libcublas|libcublasLt|libcudart|linux-vdso)\.so'
for f in "${TESTS[@]/#/$S/bin/}" "${BINARIES[@]/#/$S/bin/}" "$S/lib/libonebit_worker.so"; do
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
