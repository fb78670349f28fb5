#!/usr/bin/env bash
# The wheel as users install it (docs/pytorch.md, "Install"):
#   1. auditwheel calls it manylinux_2_35_x86_64, and nothing in it loads a library outside
#      the wheel but those the policy lets a wheel take from the system.
#   2. Every pyenv CPython from 3.9 on that this machine has: a bare virtual environment,
#      the wheel installed without dependencies, the core loaded and its coordinator started
#      (no torch needed for that).
#   3. A clean virtual environment on pyenv's CPython with pip's torch 2 and NumPy 2 (those
#      of $ONEBIT_VENVS/torch-latest, seen through a .pth file: no Debian Python package),
#      the wheel installed with `pip install --no-index`, and a 2-rank job with torchrun's
#      variables, then one under the installed onebit-run.
#   4. Debian's python3 with python3-torch 1.13 (a venv with system site packages): the six
#      commands on PATH, torchrun's variables, onebit-run and onebit-launch.
# ONEBIT_WHEEL=PATH tests that wheel instead of //python:wheel (tests/cpu_only_build.sh: the
# wheel built without CUDA), in TEST_TMPDIR; ONEBIT_LICENSE=PATH is then the repository's
# LICENSE, which the wheel must carry.
set -euo pipefail
wheel=${ONEBIT_WHEEL:-$(ls "${TEST_SRCDIR:?}"/onebit/python/onebit-*manylinux*.whl)}
license=${ONEBIT_LICENSE:-${TEST_SRCDIR:-}/onebit/LICENSE}  # the repository's
venvs="${ONEBIT_VENVS:-/opt/onebit/venvs}"
cd "${TEST_TMPDIR:?}"
unset PYTHONPATH
export OMP_NUM_THREADS=1
skipped=()

# ---- 1. The tag, and what the ELF files load. ----
if [ -x "$venvs/wheel-tools/bin/python" ]; then
  "$venvs/wheel-tools/bin/python" -m auditwheel show "$wheel" >show.txt 2>&1 || { cat show.txt; exit 1; }
  tr '\n' ' ' <show.txt | grep -q 'consistent with the following platform tag: "manylinux_2_35_x86_64"' ||
    { echo "FAIL: auditwheel show:"; cat show.txt; exit 1; }
  echo "auditwheel show: manylinux_2_35_x86_64"
else
  skipped+=("auditwheel show ($venvs/wheel-tools is missing: python/envs/setup.sh)")
fi
mkdir unpacked && /usr/bin/python3 -m zipfile -e "$wheel" unpacked
# The license travels with the wheel, and its metadata names it.
cmp -s unpacked/onebit-*.dist-info/LICENSE "$license" ||
  { echo "FAIL: the wheel's dist-info has no LICENSE, or another one than the repository's"; exit 1; }
grep -qx "License: Apache-2.0" unpacked/onebit-*.dist-info/METADATA ||
  { echo "FAIL: METADATA names no license"; cat unpacked/onebit-*.dist-info/METADATA; exit 1; }
allowed='^(linux-vdso|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libz|ld-linux-x86-64)\.'
for elf in unpacked/onebit/libonebit_core.so unpacked/onebit/bin/*/*; do
  chmod +x "$elf"
  outside=$(ldd "$elf" | grep -v "onebit.libs/" | awk '{print $1}' | grep -v '^/' | grep -Ev "$allowed" || true)
  if [ -n "$outside" ]; then echo "FAIL: $elf loads from the system: $outside"; exit 1; fi
  if ldd "$elf" | grep -q "not found"; then echo "FAIL: $elf:"; ldd "$elf"; exit 1; fi
done
echo "ELF files: only onebit.libs and the policy's system libraries"

cat > job.json <<'JSON'
{"steps": 20, "seed": 1, "train_micro_batch_size_per_gpu": 1,
 "optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 5}},
 "onebit": {"workers": 2, "log_every": 10, "workload": {"type": "pytorch", "parameters": 161},
            "failure": {"max_restarts": 0, "heartbeat_timeout_s": 5}}}
JSON

# ---- 2. The core on every CPython from 3.9 on. ----
found=0
# pyenv's root: $PYENV_ROOT, else the user's ~/.pyenv (Bazel's test environment has no HOME).
home=$(getent passwd "$(id -u)" | cut -d: -f6)
for py in "${PYENV_ROOT:-${home:-/root}/.pyenv}"/versions/3.*/bin/python3; do
  [ -x "$py" ] || continue
  minor=$("$py" -c 'import sys; print(sys.version_info[1])')
  [ "$minor" -ge 9 ] || continue
  found=$((found + 1))
  v="core-3.$minor"
  "$py" -m venv "$v"
  "$v/bin/python" -m pip install -q --no-index --no-deps --no-cache-dir "$wheel"
  "$v/bin/python" - <<'PY'
import sys
from onebit import _native
assert "site-packages" in _native.__file__, _native.__file__
assert _native.check_config("job.json") == [], _native.check_config("job.json")
c = _native.Coordinator("job.json", port=0, rest_port=0, metrics_port=0)
assert c.poll() == "running", c.poll()
assert c.address.startswith("127.0.0.1:"), c.address
c.close()
try:
    _native.check_config("missing.json")
    raise SystemExit("a missing config loaded")
except FileNotFoundError as e:
    assert "missing.json" in str(e), e
try:
    _native.config_facts('{"steps": "x"}')
    raise SystemExit("a bad config passed")
except ValueError as e:
    assert "steps" in str(e), e
print(f"Python {sys.version.split()[0]}: the core loads, checks a config, runs a coordinator")
PY
done
[ "$found" -gt 0 ] || skipped+=("the core on pyenv's CPythons (no pyenv here)")

cat > train.py <<'PY'
import os
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
config = os.environ.get("ONEBIT_CONFIG") or {"steps": 20, "onebit": {"log_every": 10}}
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=5, config=config)
g = torch.Generator().manual_seed(ot.rank())
losses = []
while not opt.done:
    opt.zero_grad()
    x = torch.randn(64, 8, generator=g)
    loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
    loss.backward()
    losses.append(loss.item())
    opt.step(loss=loss)
assert losses[-1] < losses[0], losses
print(f"rank {ot.rank()} of {ot.world_size()}: {len(losses)} steps, loss {losses[0]:.3f} -> "
      f"{losses[-1]:.3f} (torch {torch.__version__})")
PY

two_ranks() {  # VENV NAME: the script as torchrun's two ranks, with its variables
  local venv=$1 name=$2 port r pids=()
  port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$venv/bin/python" train.py >"$name-$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    if ! wait "${pids[$r]}"; then echo "FAIL: $name rank $r"; cat "$name-$r.log"; exit 1; fi
    grep -q "rank $r of 2: 20 steps" "$name-$r.log" || { cat "$name-$r.log"; exit 1; }
  done
  echo "$name: torchrun-style job OK ($(grep -h 'rank 0 of 2' "$name-0.log"))"
}

# ---- 3. pip's torch 2 and NumPy 2 on pyenv's CPython. ----
latest="$venvs/torch-latest/bin/python"
if [ -x "$latest" ] && "$latest" -c "import torch, numpy" 2>/dev/null; then
  "$latest" -m venv clean
  site=$("$latest" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mine=$(clean/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site" >"$mine/torch-latest.pth"
  clean/bin/python -m pip install -q --no-index --no-cache-dir "$wheel"
  clean/bin/python - <<'PY'
import sys, torch, numpy
import onebit.torch as ot
assert "site-packages" in ot.__file__, ot.__file__
assert not any(p.startswith("/usr/lib/python3") for p in sys.path), sys.path  # no Debian packages
print(f"clean venv: Python {sys.version.split()[0]} ({sys.base_prefix}), torch {torch.__version__}, "
      f"NumPy {numpy.__version__}")
PY
  two_ranks clean torch-latest
  clean/bin/onebit-run --nproc_per_node=2 --master_port=0 --log_dir=run-latest train.py ||
    { cat run-latest/rank-*.log; exit 1; }
  grep -q "rank 1 of 2: 20 steps" run-latest/rank-1.log || { cat run-latest/rank-*.log; exit 1; }
  echo "torch-latest: onebit-run from the wheel OK"
else
  skipped+=("pip's torch 2 ($venvs/torch-latest is missing: python/envs/setup.sh)")
fi

# ---- 4. Debian's python3 with python3-torch 1.13. ----
py=/usr/bin/python3
if "$py" -c "import torch, ensurepip" 2>/dev/null; then
  "$py" -m venv --system-site-packages venv
  venv/bin/python -m pip install -q --no-index --no-cache-dir "$wheel"
  # docs/install.md's check of the install, as the page gives it (//docs:code_blocks_test
  # holds the page to these two lines).
  venv/bin/python -c "import onebit.torch as ot; print(ot.OneBitAdam)"
  venv/bin/onebit-run --help >/dev/null
  for c in onebit-coordinator onebit-server onebit-worker onebitctl onebit-launch onebit-run; do
    [ -x "venv/bin/$c" ] || { echo "FAIL: $c is not on the venv's PATH"; exit 1; }
  done
  venv/bin/onebit-coordinator --check --config=job.json | grep -q "flags and config OK"
  two_ranks venv debian
  venv/bin/onebit-run --nproc_per_node=2 --master_port=0 --log_dir=run train.py ||
    { cat run/rank-*.log; exit 1; }
  grep -q "rank 1 of 2: 20 steps" run/rank-1.log || { cat run/rank-*.log; exit 1; }
  echo "debian: onebit-run from the wheel OK"
  venv/bin/onebit-launch --config=job.json --out_dir=launched --echo_all=false --timeout_s=120 \
    -- "$PWD/venv/bin/python" train.py >launch.log 2>&1 || { cat launch.log; exit 1; }
  grep -q "rank 1 of 2: 20 steps" launched/*/worker-1.log || { cat launch.log launched/*/worker-1.log; exit 1; }
  echo "debian: onebit-launch from the wheel OK"
else
  skipped+=("Debian's torch 1.13 ($py lacks torch or ensurepip: deploy/install-deps.sh)")
fi

for s in "${skipped[@]}"; do echo "SKIPPED: $s"; done
echo "wheel_test: OK"
