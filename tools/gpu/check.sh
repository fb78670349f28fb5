#!/usr/bin/env bash
# The GPU checks, in one call to a GPU machine (no Bazel, gRPC or apt there; CUDA,
# NCCL, PyTorch and a C++ compiler are). Build here first: tools/gpu/bundle.sh makes
# gpu-bundle/, which git ignores and the call carries:
#
#   device run:  command "bash tools/gpu/check.sh", carry ["gpu-bundle"]
#
# Each check runs under its own time limit and writes its log; the whole script keeps to
# BUDGET seconds (checks that would start later are reported as not run). The last lines
# are a table (check, result, seconds); $OUT gets summary.txt, logs.tar.gz (every log and
# result) and bench.json (the CUDA kernels against a device-to-device copy).
#
# Without a GPU (DEVICE=cpu) the same jobs run on the CPU, which is how this script is
# tested before device time is spent on it: DEVICE=cpu OUT=/tmp/gpu-out bash tools/gpu/check.sh
# CHECKS="name name ..." runs only those checks.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT="${OUT:-/tmp/gpu-out}"
OB="${OB:-/tmp/onebit-gpu}"         # the unpacked bundle
DEVICE="${DEVICE:-cuda}"
BUDGET="${BUDGET:-450}"
PY="${PY:-python3}"
# A python3 without torch (a pyenv one, say) while Debian's has it: take Debian's.
if ! "$PY" -c "import torch" > /dev/null 2>&1 && /usr/bin/python3 -c "import torch" > /dev/null 2>&1; then
  echo "check.sh: $PY has no torch; using /usr/bin/python3"
  PY=/usr/bin/python3
fi
LOGS="${LOGS:-/tmp/gpu-logs}"  # packed into $OUT/logs.tar.gz (less the checkpoints)
START=$SECONDS
rm -rf "$LOGS" && mkdir -p "$OUT" "$LOGS"
rm -rf "$OB" && mkdir -p "$OB"
tar -xJf gpu-bundle/bundle.tar.xz -C "$OB"
# Where the machine has a library of the same soname, its own copy is used.
for lib in "$OB"/lib/*.so.*; do
  name="$(basename "$lib")"
  if ldconfig -p | grep -q "^[[:space:]]*$name "; then rm "$lib"; fi
done
export LD_LIBRARY_PATH="$OB/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The workloads and the examples read Debian's path.
FMNIST=/usr/share/datasets/fashion-mnist
if [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  mkdir -p "$FMNIST" && cp gpu-bundle/fashion-mnist/*.gz "$FMNIST/"
fi
BIN="$OB/bin"
export ROOT OUT OB DEVICE PY LOGS BIN

printf '%-28s %-8s %s\n' check result seconds > "$OUT/summary.txt"
pack() { tar -C "$(dirname "$LOGS")" --exclude=ckpt -czf "$OUT/logs.tar.gz" "$(basename "$LOGS")"; }
want() { [ -z "${CHECKS:-}" ] || [[ " $CHECKS " == *" $1 "* ]]; }
# The checks that import onebit.torch need the package installed here first (a call that
# named them without it once spent its device time failing at the import).
if [ -n "${CHECKS:-}" ] && ! want py_extension; then
  for c in $CHECKS; do
    case "$c" in
      py_overlap | gpt2_* | step_* | cnn_*)
        echo "CHECKS has $c, which imports onebit.torch: py_extension added before it"
        CHECKS="py_extension $CHECKS"
        break ;;
    esac
  done
fi
# check NAME LIMIT_S COMMAND...: runs it with its output in $LOGS/NAME.log.
check() {
  local name="$1" limit="$2"
  shift 2
  want "$name" || return 0
  local left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt 10 ]; then
    printf '%-28s %-8s %s\n' "$name" "not-run" "(budget)" | tee -a "$OUT/summary.txt"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit="$left"
  local t0=$SECONDS rc
  echo "== $name (limit ${limit}s)"
  # Through bash: a check may be one of the functions below (exported before they run).
  timeout --kill-after=5 "$limit" bash -o pipefail -c '"$@"' _ "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  local result=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then result=timeout; elif [ $rc -ne 0 ]; then result="rc=$rc"; fi
  printf '%-28s %-8s %s\n' "$name" "$result" "$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
  tail -n 4 "$LOGS/$name.log" | sed 's/^/    /'
  pack  # what has run so far comes back even on a timeout
}

# A job config: deploy/demo.json (or $BASE) with a JSON object merged in, key by key.
job() {
  local path="$LOGS/$1.json"
  "$PY" - "${BASE:-deploy/demo.json}" "$2" "$path" <<'PYEOF'
import json, sys
def merge(a, b):  # b's keys into a, recursively; null removes a key
    for k, v in b.items():
        if v is None:
            a.pop(k, None)
        else:
            a[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return a
job = merge(json.load(open(sys.argv[1])), json.loads(sys.argv[2]))
json.dump(job, open(sys.argv[3], "w"), indent=1)
PYEOF
  echo "$path"
}
launch() {  # launch NAME CONFIG [launcher flags...]
  local name="$1" config="$2"
  shift 2
  "$BIN/deploy/onebit-launch" --bin_dir="$BIN" --config="$config" --out_dir="$LOGS/$name" \
    --echo_all=false --timeout_s=300 "$@" 2>&1 |
    while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done  # seconds, for the log
}

info() {
  nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
  g++ --version | head -1
  ls /usr/local/cuda/lib64 | grep -E '^lib(nccl|cublas)\.so' || echo "no NCCL/cuBLAS in /usr/local/cuda/lib64"
  echo "bundled libraries kept: $(ls "$OB/lib" | tr '\n' ' ')"
}
export -f info
check info 30 info

# ---- The GPU tests (each skips with a message where there is no GPU) ----
check cuda_backend_test 150 "$BIN/kernels/cuda_backend_test"
check cuda_determinism_test 200 "$BIN/kernels/cuda_determinism_test"
check fp8_cuda_test 120 "$BIN/compression/fp8/fp8_cuda_test"
check mlp_cuda_test 120 "$BIN/worker/workloads/mlp_cuda_test"
check nccl_transport_test 90 "$BIN/worker/transport/nccl_transport_test"
check trainer_test_gpu 120 "$BIN/worker/trainer_test" --gtest_filter='TrainerGpu*'

# ---- The CUDA kernels against a device-to-device copy (bench.json). BEFORE_BENCH=PATH: the
# benchmark binary of an earlier commit (built here, put in gpu-bundle/, which the call
# carries; `BEFORE=COMMIT tools/gpu/bundle.sh` puts it at gpu-bundle/before_bench, taken by
# default), run in the same call so that a change is measured against the copy of the same
# run on the same card (bench_before.json). ----
if [ -z "${BEFORE_BENCH:-}" ] && [ -x gpu-bundle/before_bench ]; then
  BEFORE_BENCH="$ROOT/gpu-bundle/before_bench"
  echo "kernel_bench_before: the benchmark of $(cat gpu-bundle/before_commit 2>/dev/null || echo '?')"
fi
# Named or not, the earlier benchmark runs wherever kernel_bench does.
if [ -n "${BEFORE_BENCH:-}" ] && want kernel_bench && ! want kernel_bench_before; then
  CHECKS="$CHECKS kernel_bench_before"
fi
check kernel_bench 150 "$BIN/kernels/cuda_kernels_benchmark" --benchmark_min_time=0.1 \
  --benchmark_out="$OUT/bench.json" --benchmark_out_format=json
if [ -n "${BEFORE_BENCH:-}" ]; then
  check kernel_bench_before 150 "$BEFORE_BENCH" --benchmark_min_time=0.1 \
    --benchmark_out="$OUT/bench_before.json" --benchmark_out_format=json
fi
# The table for BENCHMARKS.md (where a GPU measured something): bench_table.md.
if [ -s "$OUT/bench.json" ]; then
  before_json=()
  [ -s "$OUT/bench_before.json" ] && before_json=("$OUT/bench_before.json")
  "$PY" tools/gpu/bench_table.py "$OUT/bench.json" "${before_json[@]}" > "$OUT/bench_table.md" &&
    tail -n 1 "$OUT/bench_table.md"
fi

# ---- The Python package: the bundle's manylinux wheel, unpacked unchanged for this
# machine's Python and torch (its core is a C library loaded with ctypes: nothing to build) ----
install_package() {
  rm -rf "$BIN/python" && mkdir -p "$BIN/python" &&
    "$PY" -m zipfile -e "$OB"/onebit-*manylinux*.whl "$BIN/python" &&
    PYTHONPATH="$BIN/python" "$PY" -c 'import sys, torch, onebit.torch
from onebit import _native
print("import ok:", _native.lib().path, "Python", sys.version.split()[0], "torch", torch.__version__)'
}
export -f install_package
check py_extension 150 install_package

# ---- Overlap (the warmup exchange during backward) on CPU tensors through this machine's
# PyTorch: its post-accumulate hooks (torch >= 2.1; Debian's 1.13 takes the AccumulateGrad
# node's instead). Two ranks; overlap on and off must give the same bits, and a second
# gradient or one changed after it was sent must be refused (python/tests/overlap_train.py).
overlap_run() {  # overlap_run MODE
  OMP_NUM_THREADS=1 PYTHONPATH="$BIN/python" "$PY" -m onebit.run --nproc_per_node=2 \
    --master_port=0 --log_dir="$LOGS/py_overlap/$1" python/tests/overlap_train.py \
    "$LOGS/py_overlap/$1.npy" "$1"
}
py_overlap() {
  local m
  for m in on off; do overlap_run $m || return 1; done
  grep -h "exchange overlap: on, 2 buckets" "$LOGS/py_overlap/on/rank-0.log" || return 1
  "$PY" -c 'import numpy as np, sys
a, b = (np.load(f) for f in sys.argv[1:])
assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), abs(a - b).max()
print("overlap on and off: the same bits")' "$LOGS/py_overlap/on.npy" "$LOGS/py_overlap/off.npy" ||
    return 1
  for m in twice modified; do
    if overlap_run $m; then echo "$m: not refused"; return 1; fi
  done
  grep -h "got a second gradient before step()" "$LOGS/py_overlap/twice/"rank-*.log | head -1 &&
    grep -h "changed after backward() handed it" "$LOGS/py_overlap/modified/"rank-*.log | head -1
}
export -f overlap_run py_overlap
check py_overlap 150 py_overlap

# ---- The GPT example (examples/gpt) at GPT-2 small's size (124M parameters) on CUDA, bf16
# autocast, synthetic tokens: onebit.torch launched torchrun-style (a world of one, so rank 0
# embeds the job's coordinator; set_to_none gradients, torch 2's default) against
# torch.optim.AdamW (fused) in one process. Steps per second, per stage, in each JSON.
# GPT_SIZE=tiny AMP=none for a CPU try of this script. ----
gpt2() {  # gpt2 OPTIMIZER
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29710 \
    PYTHONPATH="$BIN/python" "$PY" examples/gpt/train.py --optimizer "$1" \
    --size "${GPT_SIZE:-gpt2}" --data synthetic --device "$DEVICE" --amp "${AMP:-bf16}" \
    --batch 8 --steps 60 --freeze_step 30 --log_every 10 --threads 4 \
    --csv "$LOGS/gpt2_$1.csv" --result "$LOGS/gpt2_$1.json"
}
export -f gpt2
check gpt2_adamw 100 gpt2 adamw
check gpt2_onebit_adam 120 gpt2 onebit_adam
# fp16 autocast with loss scaling: onebit's (the config's fp16 block, opt.scale(loss), every
# worker skipping alike) against AdamW with torch's GradScaler. Each JSON has the losses;
# the worker's log its final loss scale and skipped steps.
gpt2_fp16() {  # gpt2_fp16 OPTIMIZER
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29740 \
    PYTHONPATH="$BIN/python" "$PY" examples/gpt/train.py --optimizer "$1" \
    --size "${GPT_SIZE:-gpt2}" --data synthetic --device "$DEVICE" --amp fp16 \
    --batch 8 --steps 60 --freeze_step 30 --log_every 10 --threads 4 \
    --csv "$LOGS/gpt2_fp16_$1.csv" --result "$LOGS/gpt2_fp16_$1.json"
}
export -f gpt2_fp16
check gpt2_fp16_adamw 100 gpt2_fp16 adamw
check gpt2_fp16_onebit_adam 120 gpt2_fp16 onebit_adam
# Saved with torch.save after 20 steps (compression from step 11), resumed in a fresh job
# (the optimizer joins lazily; load_state_dict before the first step) and run to step 40.
gpt2_resume() {
  local common=(--optimizer onebit_adam --size "${GPT_SIZE:-gpt2}" --data synthetic
                --device "$DEVICE" --amp "${AMP:-bf16}" --batch 8 --freeze_step 10 --eps 1e-5
                --log_every 10 --threads 4)
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29720 \
    PYTHONPATH="$BIN/python" "$PY" examples/gpt/train.py "${common[@]}" --steps 20 \
    --save "$LOGS/gpt2_state.pt" &&
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29730 \
    PYTHONPATH="$BIN/python" "$PY" examples/gpt/train.py "${common[@]}" --steps 40 \
    --resume "$LOGS/gpt2_state.pt" --result "$LOGS/gpt2_resume.json"
  local rc=$?
  rm -f "$LOGS/gpt2_state.pt"  # 1.5 GB: not for the logs' archive
  return $rc
}
export -f gpt2_resume
check gpt2_resume 150 gpt2_resume

# ---- Where a GPU worker's step goes (tools/gpu/step_bench.py): compute, then
# onebit's step split into compress, exchange, update and PCIe copies, with the PCIe bytes
# per step, against fused AdamW in the same process. GPT-2 small (124M) and 1.07B on one
# worker over NCCL; GPT-2 with 4 workers sharing the GPU through 2 shards (two emulated
# nodes of 2, a shard per node) and through gloo. STEP_MODEL=tiny for a CPU try. ----
step_bench() {  # step_bench NAME MODEL NODES PER_NODE CONFIG [step_bench.py flags...]
  local name="$1" model="$2" nodes="$3" per_node="$4" config="$5" port node pids=() rc=0
  shift 5
  port="$(PYTHONPATH="$BIN/python" "$PY" -c 'from onebit.run import free_port_run; print(free_port_run())')"
  for ((node = 0; node < nodes; node++)); do
    ONEBIT_SERVER_BIN="$BIN/server/onebit-server" PYTHONPATH="$BIN/python" OMP_NUM_THREADS=2 \
      "$PY" -m onebit.run --nnodes="$nodes" --node_rank="$node" --nproc_per_node="$per_node" \
      --master_addr=127.0.0.1 --master_port="$port" --log_dir="$LOGS/$name/node$node" \
      tools/gpu/step_bench.py --model "${STEP_MODEL:-$model}" --device "$DEVICE" \
      --amp "${AMP:-bf16}" --steps 30 --freeze_step 10 --label "$name" --config "$config" \
      --profile_steps "${STEP_PROFILE:-3}" --result "$LOGS/$name.json" "$@" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  cat "$LOGS/$name/node0/rank-0.log"
  return $rc
}
export -f step_bench
STEP_NCCL="{\"optimizer\": {\"params\": {\"comm_backend_name\": \"$([ "$DEVICE" = cuda ] && echo nccl || echo gloo)\"}}}"
# One worker over NCCL compresses nothing (nothing to exchange): its compression stage is
# the frozen update. The compression stage's work is measured with two workers sharing the
# GPU over gloo (each compressing on the device, the blocks staged through pinned memory).
check step_gpt2_w1 120 step_bench step_gpt2_w1 gpt2 1 1 "$STEP_NCCL"
# GPT-2 small's 148 tensors at 162K parameters: the device's work is a few microseconds, so
# step() is the host's fixed cost of a step (the profile's host table splits it).
check step_gpt2_host_w1 90 step_bench step_gpt2_host_w1 gpt2_host 1 1 "$STEP_NCCL"
check step_gpt2_gloo_w2 120 step_bench step_gpt2_gloo_w2 gpt2 1 2 '{}'
check step_gpt2_ps_w4 150 step_bench step_gpt2_ps_w4 gpt2 2 2 \
  '{"onebit": {"exchange": {"mode": "ps", "servers": "per_node"}}}'
check step_1b_gloo_w2 240 step_bench step_1b_gloo_w2 1b 1 2 '{}'
# The 1.07B model as the issue names it: one worker over NCCL, and 4 workers sharing the GPU
# through shards. 2 shards cannot take it: a warmup push of 1.07B / 2 fp32 is over the 2 GiB
# a message may carry (PsLayout says so), so the shared form uses 4 (four emulated nodes of
# one worker, a shard per node; about 30 GB of GPU memory a worker: an H200's 139 GB, not an
# H100's 78).
# One worker's frozen-variance update is the plain momentum over sqrt(v) + eps: with eps 1e-5
# the 1.07B model's loss was 30.8 by step 20 and NaN at 30 (H100, 2026-11-27; its embedding
# rows no token reached in the 10 warmup steps froze at v = 0). A timing run: eps 1e-3.
check step_1b_w1 240 step_bench step_1b_w1 1b 1 1 "$STEP_NCCL" --eps 1e-3
check step_1b_ps_w4 300 step_bench step_1b_ps_w4 1b 4 1 '{"onebit": {"exchange": {"mode": "ps", "servers": "per_node"}}}'


# ---- Jobs. One GPU: NCCL takes one rank per GPU, so the NCCL jobs are worlds of one (the
# transport and its communicators are made all the same; nothing crosses the wire). Several
# workers share the GPU through host-memory exchanges: the ps shards or gloo. ----
NCCL="$([ "$DEVICE" = cuda ] && echo nccl || echo gloo)"
CUDA="\"device\": \"$DEVICE\""
ONE="\"workers\": 1, \"exchange\": {\"mode\": \"peer\", \"servers\": 0}"
WITH_NCCL="\"optimizer\": {\"params\": {\"comm_backend_name\": \"$NCCL\"}}"
export NCCL CUDA

# The Fashion-MNIST CNN example (examples/fashion_mnist_cnn), onebit.torch in each worker.
CNN=examples/fashion_mnist_cnn
export CNN
cnn() {  # cnn NAME MERGE
  local config
  config="$(BASE=$CNN/job.json job "$1" "$2")"
  launch "$1" "$config" -- "$PY" "$CNN/train.py" --result="$LOGS/$1/result.json"
}
ddp() {  # ddp NAME: Adam over DDP (gloo, on the CPU) with the job of the cnn check NAME
  "$PY" "$CNN/ddp_adam.py" --config="$LOGS/$1.json" --result="$LOGS/$1/adam.json" \
    --loss_csv="$LOGS/$1/adam.csv"
}
export -f job launch cnn ddp
check cnn_nccl_w1 120 cnn cnn_nccl_w1 "{\"onebit\": {$CUDA, $ONE}, $WITH_NCCL}"
check cnn_nccl_w1_ddp 120 ddp cnn_nccl_w1
# The same for 300 steps: the time from the launch to the first step and from the last
# step to the end (on the H200 both were ~90 s once: a mutex starved in the extension of then, python/embedded.cc now).
check cnn_w4_300 120 cnn cnn_w4_300 \
  "{\"steps\": 300, \"optimizer\": {\"params\": {\"freeze_step\": 100}}, \"onebit\": {$CUDA}}"
check cnn_w4 200 cnn cnn_w4 "{\"onebit\": {$CUDA}}"
check cnn_w4_ddp 200 ddp cnn_w4

# The C++ MLP workload (deploy/demo.json's job).
mlp() {  # mlp NAME MERGE [launcher flags]
  local name="$1" config
  config="$(job "$name" "$2")"
  shift 2
  launch "$name" "$config" "$@"
}
export -f mlp
check mlp_nccl_w1 120 mlp mlp_nccl_w1 "{\"onebit\": {$CUDA, $ONE}, $WITH_NCCL}"
check mlp_nccl_w1_fp16 90 mlp mlp_nccl_w1_fp16 \
  "{\"onebit\": {$CUDA, $ONE}, $WITH_NCCL, \"fp16\": {\"enabled\": true}}" --compare_adam=false
check mlp_nccl_w1_bf16 90 mlp mlp_nccl_w1_bf16 \
  "{\"onebit\": {$CUDA, $ONE}, $WITH_NCCL, \"bf16\": {\"enabled\": true}}" --compare_adam=false
# The rest of the family: 0/1 Adam (bias correction, as BENCHMARKS.md recommends), 1-bit LAMB.
check mlp_nccl_w1_zero_one 90 mlp mlp_nccl_w1_zero_one \
  "{\"onebit\": {$CUDA, $ONE}, \"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"comm_backend_name\": \"$NCCL\", \"freeze_step\": null, \"var_freeze_step\": 100, \"bias_correction\": true}}}" \
  --compare_adam=false
check mlp_nccl_w1_lamb 90 mlp mlp_nccl_w1_lamb \
  "{\"onebit\": {$CUDA, $ONE}, \"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"comm_backend_name\": \"$NCCL\", \"lr\": 0.005}}}" \
  --compare_adam=false
check mlp_ps_w4 150 mlp mlp_ps_w4 "{\"onebit\": {$CUDA}}"
check mlp_ps_w4_fp16 120 mlp mlp_ps_w4_fp16 \
  "{\"onebit\": {$CUDA}, \"fp16\": {\"enabled\": true}}" --compare_adam=false
check mlp_ps_w4_bf16 120 mlp mlp_ps_w4_bf16 \
  "{\"onebit\": {$CUDA}, \"bf16\": {\"enabled\": true}}" --compare_adam=false
check mlp_gloo_w4_fp16 120 mlp mlp_gloo_w4_fp16 \
  "{\"onebit\": {$CUDA, \"exchange\": {\"mode\": \"peer\", \"servers\": 0}}, \"fp16\": {\"enabled\": true}}" --compare_adam=false
check mlp_ps_w4_lamb_int8 120 mlp mlp_ps_w4_lamb_int8 \
  "{\"onebit\": {$CUDA, \"exchange\": {\"compressor\": \"int8\"}}, \"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.005}}}" \
  --compare_adam=false

# A failure no restart fixes fails the job at once: fp16 overflowing at the
# minimum loss scale (2^60, which may not shrink) is every worker's at step 1; the job must
# end with 78 from every process, naming a worker and the step, with no restart.
fails_fast() {
  local name=mlp_ps_w4_fp16_fails_fast out rc
  out="$(mlp "$name" "{\"onebit\": {$CUDA}, \"fp16\": {\"enabled\": true, \"initial_scale_power\": 60, \"min_loss_scale\": 1152921504606846976}}" --compare_adam=false)"
  rc=$?
  echo "$out"
  local log="$LOGS/$name/onebit_adam/coordinator.log"
  echo "launcher exit code $rc"
  [ "$rc" = 78 ] && grep -q "the job FAILED" <<< "$out" && ! grep -q "restarting it" <<< "$out" &&
    grep -E "job FAILED: worker [0-3] \(.*\) failed in step 1, which no restart fixes: fp16: the gradient of step 1 overflowed" "$log"
}
export -f fails_fast
if [ "$DEVICE" = cuda ]; then check fails_fast 90 fails_fast; fi

# Hierarchical, NCCL inside each node, with checkpoints; then the same job with a process
# killed: restarted, its groups made again, resumed from a checkpoint, and it must end with
# the same loss. hier_nccl_w1: one node of one GPU (both NCCL groups are worlds of one).
# hier_ps_w2: two nodes of one GPU each, shards between them.
hier() {  # hier NAME WORKERS EXCHANGE [launcher flags]
  local name="$1" workers="$2" exchange="$3"
  shift 3
  mlp "$name" "{\"steps\": 60, \"optimizer\": {\"params\": {\"freeze_step\": 40, \"comm_backend_name\": \"$NCCL\"}},
    \"onebit\": {$CUDA, \"workers\": $workers, \"lease_steps\": 5, \"exchange\": $exchange,
    \"checkpoint\": {\"dir\": \"$LOGS/$name/ckpt\", \"every_steps\": 10},
    \"failure\": {\"max_restarts\": 1, \"heartbeat_timeout_s\": 3}, \"workload\": {\"eval_every\": 0}}}" \
    --compare_adam=false "$@"
}
same_end() {  # same_end STRAIGHT RECOVERED: what the recovery did, and the same final loss
  grep -h "resum\|restart\|fault injection" "$LOGS/$2"/onebit_adam/*.log "$LOGS/$2.log" | head -8
  "$PY" - "$LOGS/$1/onebit_adam" "$LOGS/$2/onebit_adam" <<'PYEOF'
import json, sys
a, b = (json.load(open(d + "/worker-0.json")) for d in sys.argv[1:])
print("straight:", a["last_loss"], a["test_loss"], "recovered:", b["last_loss"], b["test_loss"])
sys.exit(0 if (a["last_loss"], a["test_loss"]) == (b["last_loss"], b["test_loss"]) else 1)
PYEOF
}
export -f hier same_end
H1='{"mode": "hierarchical", "local_size": 1, "inter": "peer", "servers": 0}'
check hier_nccl_w1 90 hier hier_nccl_w1 1 "$H1"
# Killed after writing its part of step 40's checkpoint, before the commit: resumes from 30.
check hier_nccl_w1_recovery 120 hier hier_nccl_w1_recovery 1 "$H1" --fault=worker0:kill_before_commit:40
check hier_nccl_w1_same_end 20 same_end hier_nccl_w1 hier_nccl_w1_recovery
H2='{"mode": "hierarchical", "local_size": 1, "inter": "ps", "servers": 2}'
check hier_ps_w2 90 hier hier_ps_w2 2 "$H2"
check hier_ps_w2_recovery 120 hier hier_ps_w2_recovery 2 "$H2" --fault=worker1:kill_in_exchange:45
check hier_ps_w2_same_end 20 same_end hier_ps_w2 hier_ps_w2_recovery
# NCCL inside each node (of one worker: one GPU), gloo between the nodes: the inter-node
# compression on the device, its blocks staged through pinned memory.
H3='{"mode": "hierarchical", "local_size": 1, "inter": "peer", "servers": 0, "inter_transport": "gloo"}'
check hier_nccl_gloo_w2 90 hier hier_nccl_gloo_w2 2 "$H3"

# ---- Nsight Compute on the kernels short of 0.85 of the copy (BENCHMARKS.md): each
# benchmark's first launches under `--set full`, as text (no ncu where the reports would be
# read): $OUT/ncu_details.txt, and the SASS of the servers' first pass with its stall samples
# ($OUT/ncu_server_sass.csv). ----
ncu_kernels() {
  command -v ncu > /dev/null || { echo "no ncu on this machine"; return 1; }
  local bench="$BIN/kernels/cuda_kernels_benchmark" f name kernels count
  : > "$OUT/ncu_details.txt"
  # benchmark:kernels (a regex of the kernels' names):launches
  for f in 'ServerAggregate/W=8:ServerInput|SignPack:2' \
           'ServerAggregate/W=8/warp_words2:ServerInputWords:1' \
           'ServerAggregate/W=8/warp_words4:ServerInputWords:1' 'Decompress:DecompressKernel:1' \
           'DecompressFrozenAdamUpdate/mask:DecompressFrozenAdam:1' 'SumSquares:SumSquaresKernel:1' \
           'ServerAggregateInt8/W=8:ServerInputInt8|QuantizeInt8:2'; do
    IFS=: read -r name kernels count <<< "$f"
    echo "==== $name" >> "$OUT/ncu_details.txt"
    ncu --clock-control none --set full --import-source no --kernel-name "regex:$kernels" \
      --launch-count "$count" "$bench" --benchmark_filter="^$name/manual_time\$" \
      --benchmark_min_time=0.001 >> "$OUT/ncu_details.txt" 2>&1 || return 1
  done
  ncu --clock-control none --set full --import-source no --launch-count 1 \
    --kernel-name regex:ServerInput --page source --print-source sass --csv \
    "$bench" --benchmark_filter='^ServerAggregate/W=8/manual_time$' --benchmark_min_time=0.001 \
    > "$OUT/ncu_server_sass.csv" 2>&1
  grep -E "^==== |Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued" "$OUT/ncu_details.txt"
}
export -f ncu_kernels
if [ "$DEVICE" = cuda ]; then check ncu_kernels 150 ncu_kernels; fi

pack
echo "== $((SECONDS - START)) s"
cat "$OUT/summary.txt"
