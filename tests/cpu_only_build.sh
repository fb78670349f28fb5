#!/usr/bin/env bash
# The build without CUDA (building the wheel for CPUs needs no CUDA), checked on a
# machine that has CUDA: --repo_env=ONEBIT_CUDA=off (third_party/cuda/cuda_configure.bzl),
# in a Bazel output base of its own, so that the normal build's stays as it is.
#   1. @cuda is the empty repository; every target analyses (`build --nobuild //...`); the
#      wheel and the tests over the CUDA stubs (tag gpu) build, and those tests pass, saying
#      what they skip.
#   2. No ELF file of the wheel has CUDA or NCCL in it: none needs or names libcuda,
#      libcudart, libcublas or libnccl (the CUDA build's do: CUDA's static runtime opens
#      libcuda.so.1, the NCCL transport libnccl.so.2, the GPU MLP libcublas).
#   3. tests/wheel_test.sh on that wheel: manylinux, every pyenv CPython, the torch jobs.
#   4. From the installed wheel, a 1-worker job on device "cpu" trains, and the same job on
#      device "cuda" fails at once (exit 78: no restart) with the build's error; so does
#      onebit.torch asked for device "cuda".
#
#   bash tests/cpu_only_build.sh      (deploy/test.sh runs it after the tests)
#
# The output base is ONEBIT_CPU_ONLY_OUTPUT_BASE, by default the normal one's path with
# "-cpu-only" appended. The first run builds the wheel and those tests from scratch (3 min
# on 2 idle cores; all of it took 4.5 min), later runs only what changed (2 min in all,
# most of it tests/wheel_test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ob=${ONEBIT_CPU_ONLY_OUTPUT_BASE:-$(bazel info output_base)-cpu-only}
# No bazel-* links in the workspace: they stay the normal build's.
bzl() { bazel --output_base="$ob" --max_idle_secs=300 "$@"; }
flags=(--repo_env=ONEBIT_CUDA=off --symlink_prefix=/)
# //... without the normal build's bazel-* links, which this server would walk into (they
# lead to another output base, with its external repositories' BUILD files).
all=(//:all)
for d in */; do
  d=${d%/}
  [ -L "$d" ] || [ -z "$(find "$d" -name BUILD -print -quit)" ] || all+=("//$d/...")
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

# ---- 1. Analysis, the wheel, the tests over the stubs. ----
bzl build "${flags[@]}" --nobuild "${all[@]}"
grep -qx "CUDA_AVAILABLE = False" "$ob/external/cuda/defs.bzl" ||
  { echo "FAIL: @cuda is not the repository without CUDA:"; cat "$ob/external/cuda/defs.bzl"; exit 1; }
bzl build "${flags[@]}" //python:wheel
bzl test "${flags[@]}" --build_tests_only --test_tag_filters=gpu --test_output=errors "${all[@]}"
bin=$(bzl info "${flags[@]}" bazel-bin)
wheel=$(ls "$bin"/python/onebit-*manylinux*.whl)
testlogs=$(bzl info "${flags[@]}" bazel-testlogs)
grep -q "OK \] NoCudaBuildTest.CudaBackendIsAPermanentClearError" \
  "$testlogs/kernels/cuda_backend_test/test.log" ||
  { echo "FAIL: NoCudaBuildTest did not run"; exit 1; }
echo "built without CUDA: $wheel ($((SECONDS - start)) s)"

# ---- 2. Nothing of CUDA in the wheel. ----
/usr/bin/python3 -m zipfile -e "$wheel" "$tmp/unpacked"
cuda='lib(cuda|cudart|cublas|cublasLt|nccl)\.so'
elves=0
while IFS= read -r -d '' f; do
  head -c 4 "$f" | grep -q $'^\x7fELF' || continue
  elves=$((elves + 1))
  if readelf -d "$f" | grep NEEDED | grep -Eq "$cuda"; then
    echo "FAIL: $f needs CUDA:"; readelf -d "$f" | grep NEEDED; exit 1
  fi
  if grep -Eaq "$cuda" "$f"; then
    echo "FAIL: $f names a CUDA library: $(grep -Eao "${cuda}[.0-9]*" "$f" | sort -u | tr '\n' ' ')"
    exit 1
  fi
done < <(find "$tmp/unpacked" -type f -print0)
[ "$elves" -ge 6 ] || { echo "FAIL: only $elves ELF files in the wheel"; exit 1; }
echo "the wheel's $elves ELF files neither need nor name CUDA, cuBLAS or NCCL"

# ---- 3. The wheel's own test. ----
mkdir "$tmp/wheel_test"
ONEBIT_WHEEL=$wheel ONEBIT_LICENSE="$PWD/LICENSE" TEST_TMPDIR="$tmp/wheel_test" bash tests/wheel_test.sh

# ---- 4. Device "cpu" trains, device "cuda" says why not. ----
cd "$tmp"
/usr/bin/python3 -m venv --system-site-packages venv
venv/bin/python -m pip install -q --no-index --no-deps --no-cache-dir "$wheel"
job() {  # DEVICE: a 1-worker job of the synthetic workload
  cat <<JSON
{"steps": 6, "seed": 1,
 "optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 3}},
 "onebit": {"device": "$1", "workers": 1, "log_every": 3,
            "workload": {"type": "synthetic", "parameters": 1000},
            "failure": {"max_restarts": 2, "heartbeat_timeout_s": 5}}}
JSON
}
no_cuda='this build of onebit has no CUDA'
job cpu >cpu.json
venv/bin/onebit-launch --config=cpu.json --out_dir=cpu --timeout_s=120 >cpu.log 2>&1 ||
  { echo "FAIL: the device cpu job"; cat cpu.log; exit 1; }
echo "device cpu: a 1-worker job trains"
job cuda >cuda.json
rc=0
timeout 120 venv/bin/onebit-launch --config=cuda.json --out_dir=cuda --timeout_s=60 \
  >cuda.log 2>&1 || rc=$?
if [ "$rc" -ne 78 ] || ! grep -rqF "$no_cuda" cuda.log cuda; then
  echo "FAIL: the device cuda job exited $rc (want 78, the job failed for good) without"
  echo "\"$no_cuda\":"; cat cuda.log; exit 1
fi
echo "device cuda: exit 78, \"$(grep -rhoF "$no_cuda" cuda.log cuda | head -1)...\""
if venv/bin/python -c "import torch" 2>/dev/null; then
  timeout 120 venv/bin/python - <<'PY' >torch.log 2>&1 || { echo "FAIL: onebit.torch on cuda"; cat torch.log; exit 1; }
import torch
import onebit.torch as ot
model = torch.nn.Linear(4, 1)
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=1,
                    config={"steps": 2, "onebit": {"device": "cuda", "exchange": {"overlap": False}}})
try:
    while not opt.done:
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
except ot.OnebitError as e:
    assert "this build of onebit has no CUDA" in str(e) and e.exit_code == 78, (e, e.exit_code)
    print(f"onebit.torch on device cuda: OnebitError, exit_code {e.exit_code}")
else:
    raise SystemExit("onebit.torch trained on device cuda in a build without CUDA")
PY
  grep "^onebit.torch on device cuda" torch.log
else
  echo "SKIPPED: onebit.torch on device cuda (Debian's python3-torch is missing)"
fi
echo "cpu_only_build: OK ($((SECONDS - start)) s)"
