#!/usr/bin/env bash
# Installs what onebit needs to build and test on Debian 12: Debian's packages, then the
# Python environments of python/envs/setup.sh (pip's torch and NumPy, auditwheel).
# Idempotent: installs nothing when everything is already there.
#
#   bash deploy/install-deps.sh           everything: build, test, deploy, docs
#   bash deploy/install-deps.sh --build   only what builds the binaries and the wheel
#
# CUDA 13 is not a package: it is expected under /usr/local/cuda. Without it, --build goes
# on (the build is then for CPUs only: third_party/cuda/cuda_configure.bzl); everything
# else stops, unless ONEBIT_CUDA=off asks for that build on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=false
[ "${1:-}" = "--build" ] && build_only=true

# What builds the C++ binaries, the core and the wheel.
build_packages=(
  build-essential
  bazel-bootstrap bazel-platforms bazel-rules-java
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libcpp-httplib-dev libeigen3-dev zlib1g-dev
  libssl-dev openssl
  python3 python3-venv
)

# What the tests, the examples, the deployment and the docs need besides.
packages=(
  dataset-fashion-mnist
  prometheus
  gnuplot-nox
  iproute2 python3
  # Debian's PyTorch (CPU, 1.13) for the package's tests on Debian's stack, and examples.
  python3-torch python3-numpy
  # OpenBLAS for Debian's torch: without it its matrix products use the reference BLAS
  # (3.5 GFLOP/s on one core here, 124 with it). The GPT example's corpus: GCIDE.
  libopenblas0-pthread dict-gcide
  # The wheel (python/wheel) is installed into virtual environments by its test.
  python3-pip
  # The fuzzers (fuzz/): clang with its sanitizer and libFuzzer runtimes.
  clang libclang-rt-14-dev
  # The deployment (deploy/images, deploy/compose, deploy/k8s; tests/deploy_test): podman
  # as root with runc (its config: deploy/images/containers.conf, via CONTAINERS_CONF),
  # name resolution between containers (dnsname), the pause binary of kube play
  # (catatonit), debootstrap for the base image, Debian's python3-yaml for the test.
  podman podman-compose runc containernetworking-plugins
  golang-github-containernetworking-plugin-dnsname catatonit debootstrap
  python3-yaml curl
)

if $build_only; then
  packages=("${build_packages[@]}")
else
  packages=("${build_packages[@]}" "${packages[@]}")
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi

# kubectl (its kustomize builds deploy/k8s) is not in Debian 12: it comes from Kubernetes'
# own apt repository where that is configured (as on the build machines); without it
# the deploy test says that it skips the Kubernetes checks.
if ! $build_only && ! command -v kubectl >/dev/null; then
  echo "install-deps: kubectl not found; trying apt-get install kubectl"
  [ "$(id -u)" -eq 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends kubectl \
    || echo "install-deps: no kubectl package available; deploy/k8s is then only partly checked"
fi

# CUDA 13 (nvcc, cudart, NCCL) is preinstalled under /usr/local/cuda; Debian does not ship
# it. The wheel and the binaries build without it, for CPUs only; the tests, which check the
# CUDA code too, want it unless told otherwise.
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  if $build_only || [ "${ONEBIT_CUDA:-}" = off ]; then
    echo "install-deps: building without CUDA (no /usr/local/cuda/bin/nvcc): the wheel runs on CPUs only" >&2
  else
    echo "install-deps: error: /usr/local/cuda/bin/nvcc not found; the CUDA kernels need the CUDA 13 toolkit there (ONEBIT_CUDA=off: build and test without CUDA)" >&2
    exit 1
  fi
fi

# The Python environments: auditwheel for the wheel; for the tests, pip's torch and NumPy,
# and mkdocs-material for the documentation site.
if $build_only; then
  bash python/envs/setup.sh wheel-tools
else
  bash python/envs/setup.sh wheel-tools torch-latest docs
fi
