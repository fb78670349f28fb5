#!/usr/bin/env bash
# Installs what onebit needs to build and test on Debian 12, from Debian's packages only.
# Idempotent: installs nothing when everything is already there.
set -euo pipefail

packages=(
  build-essential
  bazel-bootstrap bazel-platforms bazel-rules-java
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libcpp-httplib-dev libeigen3-dev zlib1g-dev
  libssl-dev openssl
  dataset-fashion-mnist
  prometheus
  gnuplot-nox
  iproute2 python3
  # The Python package (python/): its extension's headers, and PyTorch (CPU) for the
  # package, its tests and examples.
  python3-dev pybind11-dev python3-torch python3-numpy
  # OpenBLAS for Debian's torch: without it its matrix products use the reference BLAS
  # (3.5 GFLOP/s on one core here, 124 with it). The GPT example's corpus: GCIDE.
  libopenblas0-pthread dict-gcide
  # The wheel (python/wheel) is installed into a virtual environment by its test.
  python3-venv python3-pip
  # The fuzzers (fuzz/): clang with its sanitizer and libFuzzer runtimes.
  clang libclang-rt-14-dev
  # The deployment (deploy/images, deploy/compose, deploy/k8s; tests/deploy_test): podman
  # as root with runc (its config: deploy/images/containers.conf, via CONTAINERS_CONF),
  # name resolution between containers (dnsname), the pause binary of kube play
  # (catatonit), debootstrap for the base image, Debian's python3-yaml for the test.
  podman podman-compose runc containernetworking-plugins
  golang-github-containernetworking-plugin-dnsname catatonit debootstrap
  python3-yaml curl
  # The documentation site (mkdocs.yml, docs/; //docs:site_test builds it strictly).
  mkdocs
)

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
# own apt repository where that is configured (as on the project's machines); without it
# the deploy test says that it skips the Kubernetes checks.
if ! command -v kubectl >/dev/null; then
  echo "install-deps: kubectl not found; trying apt-get install kubectl"
  [ "$(id -u)" -eq 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends kubectl \
    || echo "install-deps: no kubectl package available; deploy/k8s is then only partly checked"
fi

# CUDA 13 (nvcc, cudart, NCCL) is preinstalled under /usr/local/cuda; Debian does not ship
# it, so say clearly when it is absent instead of failing deep inside the build.
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: error: /usr/local/cuda/bin/nvcc not found; the CUDA kernels need the CUDA 13 toolkit there" >&2
  exit 1
fi
