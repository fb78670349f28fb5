#!/usr/bin/env bash
# Builds the onebit container images with podman (as root), from Debian's packages only
# (there is no image registry here):
#
#   localhost/onebit-debian12-base   stock Debian 12: debootstrap --variant=minbase, then
#                                    podman import (the root file system is cached)
#   localhost/onebit                 the runtime image: the binaries, their runtime
#                                    libraries, Fashion-MNIST, a non-root user
#   localhost/onebit-gpu             the same for the NVIDIA container runtime
#   localhost/onebit-prometheus      Debian's Prometheus, for deploy/compose
#   localhost/onebit-pytorch         PyTorch workers: Debian's Python and torch, onebit's
#                                    wheel, the GPT example (deploy/pytorch)
#
# and checks them (every binary's libraries resolve, the user is not root, no compiler).
# Idempotent: the debootstrap tarball is kept in $ONEBIT_IMAGE_CACHE and the base image
# is only imported when missing; podman's layer cache skips unchanged steps.
#
#   deploy/images/build.sh                  # bazel builds the binaries first
#   deploy/images/build.sh --bin_dir=DIR    # binaries already built (DIR/coordinator/
#                                           # onebit-coordinator, server/..., worker/...,
#                                           # tools/onebitctl, deploy/onebit-launch)
#   deploy/images/build.sh --tag=TAG        # image tag (default: latest)
#   deploy/images/build.sh --wheel=PATH     # the wheel for onebit-pytorch (default: bazel
#                                           # builds //python:wheel; with --bin_dir and no
#                                           # --wheel, onebit-pytorch is not built)
#
# Environment: CONTAINERS_CONF (default: deploy/images/containers.conf beside this script),
# ONEBIT_IMAGE_CACHE (default /var/cache/onebit-images), DEBIAN_MIRROR (default
# http://deb.debian.org/debian), NCCL_LIB (default /usr/local/cuda/lib/libnccl.so.2).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin_dir=""
wheel=""
tag="latest"
for arg in "$@"; do
  case "$arg" in
    --bin_dir=*) bin_dir="${arg#--bin_dir=}" ;;
    --tag=*) tag="${arg#--tag=}" ;;
    --wheel=*) wheel="${arg#--wheel=}" ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "build.sh: run as root (debootstrap, and podman's root storage the compose test uses)" >&2
  exit 1
fi
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool missing: run deploy/install-deps.sh" >&2; exit 1; }
done
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
podman=(podman --runtime runc --cgroup-manager=cgroupfs)
cache="${ONEBIT_IMAGE_CACHE:-/var/cache/onebit-images}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
nccl="${NCCL_LIB:-/usr/local/cuda/lib/libnccl.so.2}"
base="localhost/onebit-debian12-base:latest"
log() { echo "build.sh: $*"; }

# ---- 1. the base: debootstrap once, import when the image is missing ----
mkdir -p "$cache"
if ! "${podman[@]}" image exists "$base"; then
  if [ ! -s "$cache/base.tar" ]; then
    rootfs="$cache/rootfs.tmp"
    rm -rf "$rootfs"
    mkdir -p "$cache/debs"
    log "debootstrap --variant=minbase bookworm from $mirror (the downloads are kept in $cache/debs)"
    debootstrap --variant=minbase --cache-dir="$cache/debs" bookworm "$rootfs" "$mirror" \
      > "$cache/debootstrap.log" 2>&1 || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    # Security and point-release updates for the images' own apt-get; no package lists or
    # downloaded packages in the base.
    cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
EOF
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
    tar -C "$rootfs" --numeric-owner -cf "$cache/base.tar.tmp" .
    mv "$cache/base.tar.tmp" "$cache/base.tar"
    rm -rf "$rootfs"
  fi
  log "podman import $cache/base.tar as $base"
  "${podman[@]}" import --change 'CMD ["/bin/bash"]' \
    --message "Debian 12 (bookworm), debootstrap --variant=minbase" "$cache/base.tar" "$base" >/dev/null
fi

# ---- 2. the binaries ----
targets=(//coordinator:onebit-coordinator //server:onebit-server //worker:onebit-worker
         //tools:onebitctl //deploy:onebit-launch)
binaries=(coordinator/onebit-coordinator server/onebit-server worker/onebit-worker
          tools/onebitctl deploy/onebit-launch)
if [ -z "$bin_dir" ]; then
  log "bazel build ${targets[*]} //python:wheel"
  (cd "$repo" && bazel build --disk_cache=/work/.bazel-disk-cache "${targets[@]}" //python:wheel)
  bin_dir="$(cd "$repo" && bazel info bazel-bin 2>/dev/null)"
  [ -n "$wheel" ] || wheel="$(ls "$bin_dir"/python/onebit-*manylinux*.whl)"
fi
context="$(mktemp -d "$cache/context.XXXXXX")"
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/bin" "$context/lib"
for b in "${binaries[@]}"; do
  [ -x "$bin_dir/$b" ] || { echo "build.sh: $bin_dir/$b is missing" >&2; exit 1; }
  mkdir -p "$context/bin/$(dirname "$b")"
  cp -L "$bin_dir/$b" "$context/bin/$b"
done
[ -r "$nccl" ] || { echo "build.sh: $nccl is missing (NCCL, which onebit-worker links)" >&2; exit 1; }
# A hard link where the cache and CUDA share a file system (218 MB); a copy otherwise.
ln "$(readlink -f "$nccl")" "$context/lib/libnccl.so.2" 2>/dev/null || cp -L "$nccl" "$context/lib/libnccl.so.2"
cp "$here/onebit-launch.sh" "$context/"

# ---- 3. the images ----
log "podman build localhost/onebit:$tag"
"${podman[@]}" build -q --build-arg BASE="$base" -t "localhost/onebit:$tag" \
  -f "$here/Containerfile" "$context" >/dev/null
log "podman build localhost/onebit-gpu:$tag"
"${podman[@]}" build -q --build-arg RUNTIME="localhost/onebit:$tag" -t "localhost/onebit-gpu:$tag" \
  -f "$here/Containerfile.gpu" "$context" >/dev/null
log "podman build localhost/onebit-prometheus:$tag"
"${podman[@]}" build -q --build-arg BASE="$base" -t "localhost/onebit-prometheus:$tag" \
  -f "$here/Containerfile.prometheus" "$context" >/dev/null
if [ -n "$wheel" ]; then
  [ -r "$wheel" ] || { echo "build.sh: $wheel is missing" >&2; exit 1; }
  py_context="$context/pytorch"
  mkdir -p "$py_context/examples"
  cp "$wheel" "$py_context/"
  cp -r "$repo/examples/gpt" "$py_context/examples/"
  rm -rf "$py_context/examples/gpt/out"
  log "podman build localhost/onebit-pytorch:$tag ($(basename "$wheel"))"
  "${podman[@]}" build -q --build-arg BASE="$base" -t "localhost/onebit-pytorch:$tag" \
    -f "$here/Containerfile.pytorch" "$py_context" >/dev/null
fi

# ---- 4. checks ----
check() {
  local image="$1"
  "${podman[@]}" run --rm --network none "$image" /bin/sh -c '
    set -e
    [ "$(id -u)" != 0 ] || { echo "runs as root"; exit 1; }
    for b in onebit-coordinator onebit-server onebit-worker onebitctl /opt/onebit/deploy/onebit-launch; do
      p=$(command -v "$b" || echo "$b")
      if ldd "$p" | grep "not found"; then echo "$b: libraries missing"; exit 1; fi
    done
    for c in gcc cc c++ g++ clang ld as make; do
      if command -v "$c" >/dev/null; then echo "a build tool is in the image: $c"; exit 1; fi
    done
    for f in train-images-idx3-ubyte t10k-labels-idx1-ubyte; do
      ls /usr/share/datasets/fashion-mnist/ | grep -q "$f" || { echo "Fashion-MNIST $f missing"; exit 1; }
    done
    onebitctl --help >/dev/null 2>&1 || [ $? -le 1 ]
    out=$(onebit-coordinator --config=/nonexistent.json 2>&1) && exit 1
    echo "$out" | grep -q nonexistent.json
  ' || { echo "build.sh: check of $image failed" >&2; exit 1; }
  log "checked $image: libraries resolve, user $("${podman[@]}" run --rm --network none "$image" id -un), no build tools, Fashion-MNIST present"
}
check "localhost/onebit:$tag"
check "localhost/onebit-gpu:$tag"
"${podman[@]}" run --rm --network none "localhost/onebit-prometheus:$tag" --version >/dev/null
if [ -n "$wheel" ]; then
  "${podman[@]}" run --rm --network none "localhost/onebit-pytorch:$tag" /bin/sh -c '
    set -e
    [ "$(id -u)" != 0 ] || { echo "runs as root"; exit 1; }
    python3 -c "import torch, onebit.torch, onebit._native as n; n.lib(); print(torch.__version__)"
    for b in onebit-coordinator onebit-worker onebit-run; do command -v "$b" >/dev/null; done
    test -r /opt/onebit/examples/gpt/train.py
  ' || { echo "build.sh: check of localhost/onebit-pytorch:$tag failed" >&2; exit 1; }
  log "checked localhost/onebit-pytorch:$tag: onebit.torch imports, the commands and the GPT example are there"
fi
log "images: $("${podman[@]}" images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "onebit" | tr '\n' ';')"
