#!/usr/bin/env bash
# onebit against PyTorch DDP on an emulated cluster (root only): 4 nodes as network
# namespaces joined by veth links to one bridge, each node's link limited with tc (both
# directions) to each RATE in turn; one worker per node; the coordinator and the ps shards on
# a host of their own whose link is not limited (tools/emulated_cluster.sh).
#
#   sudo tools/bench/run.sh [--quick] [--rates "100mbit 1gbit 10gbit none"]
#                           [--workloads "syn25m syn100m fmnist"] [--systems "adam peer ps ddp"]
#                           [--out DIR]
#
# Systems (each a run of its own per workload, rate and stage):
#   adam   onebit, optimizer "Adam": full-precision exchange (peer mode) on every step
#   peer   onebit, 1-bit Adam, peer mode: a warmup-only run and a compression-only run
#   ps     onebit, 1-bit Adam, ps mode with 4 shards (S = W): the same two runs
#   ddp    PyTorch DDP + torch.optim.Adam over gloo (tools/bench/ddp_baseline.py)
# Workloads: synNNm (onebit's synthetic quadratic bowl with NN million parameters; any NN,
# and synNNk for thousands) and fmnist (the demo's MLP on Fashion-MNIST, 64 per worker).
# The compression-only runs switch at step 1, before any variance exists: eps 1 keeps the
# updates bounded (they measure time and bytes, not training).
#
# Per run it records: each step's time (per worker; the first step of a run is dropped, it
# connects), the gradient's share of it, the workers' own byte counters, the bytes every
# node's eth0 counted both ways, and `uptime`. A memcpy measurement (tools/bench/memcpy_bw.c)
# at the start and the end gives the bound. tools/bench/report.py then writes
# OUT/results.csv, OUT/results.md and OUT/*.png (gnuplot).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

QUICK=0
RATES="100mbit 1gbit 10gbit none"
WORKLOADS="syn25m syn100m fmnist"
SYSTEMS="adam peer ps ddp"
OUT=out/bench
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --rates) RATES=$2; shift ;;
    --workloads) WORKLOADS=$2; shift ;;
    --systems) SYSTEMS=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--quick] [--rates R] [--workloads W] [--systems S] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
if [ $QUICK = 1 ]; then
  RATES=${QUICK_RATES:-"100mbit none"}
  WORKLOADS=${QUICK_WORKLOADS:-"syn2m fmnist"}
  [ "$OUT" = out/bench ] && OUT=out/bench-quick
fi
WORKERS=4
# Debian's python (python3-torch), whatever python3 comes first on PATH.
PY=${PYTHON:-/usr/bin/python3}
die() { echo "bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc)"
command -v gnuplot > /dev/null || die "needs gnuplot (apt-get install gnuplot-nox)"
"$PY" -c 'import torch' 2> /dev/null || die "needs PyTorch for the DDP baseline (apt-get install python3-torch)"
[ -d /usr/share/datasets/fashion-mnist ] || die "needs Fashion-MNIST (apt-get install dataset-fashion-mnist)"

log() { echo "[bench $(date -u +%H:%M:%S)] $*"; }
mkdir -p "$OUT/runs"
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw.jsonl
: > "$RAW"

log "building (bazel, -O2 as .bazelrc sets)"
bazel build --disk_cache=/work/.bazel-disk-cache //deploy:onebit-launch \
  //coordinator:onebit-coordinator //server:onebit-server //worker:onebit-worker 2>&1 | tail -1
gcc -O2 -o "$OUT/memcpy_bw" tools/bench/memcpy_bw.c
# A copy of the binaries, so that a rebuild of the tree while the bench runs changes nothing.
BIN=$OUT/bin
rm -rf "$BIN"
for b in deploy/onebit-launch coordinator/onebit-coordinator server/onebit-server worker/onebit-worker; do
  mkdir -p "$BIN/$(dirname $b)"
  cp bazel-bin/$b "$BIN/$b"
done
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!out' || echo '+changes')" > "$OUT/commit"

memcpy_measure() {  # label
  local one all
  one=$("$OUT/memcpy_bw" 1 5)
  all=$("$OUT/memcpy_bw" "$(nproc)" 5)
  printf '{"kind": "memcpy", "label": "%s", "single_gbps": %s, "all_gbps": %s, "procs": %s, "uptime": "%s"}\n' \
    "$1" "$(echo "$one" | awk '{print $2}')" "$(echo "$all" | awk '{print $2}')" \
    "$(echo "$all" | awk '{print $6}')" "$(uptime | sed 's/.*load average: //')" >> "$RAW"
  log "memcpy ($1): one process $(echo "$one" | awk '{print $2}') GB/s, $(nproc) at once $(echo "$all" | awk '{print $2}') GB/s"
}

# Steps per run, by workload and rate: few where a step is long (the 100 Mbit/s warmup of
# 100M parameters moves about 600 MB per node: ~50 s a step).
steps_for() {  # workload rate stage -> steps (the first is dropped)
  local w=$1 r=$2 s=$3 n
  n=$(params_of "$w")
  if [ $QUICK = 1 ]; then
    [ "$w" = fmnist ] && { echo 20; return; }
    echo 4; return
  fi
  if [ "$w" = fmnist ]; then echo 40; return; fi
  if [ "$s" = compression ]; then
    if [ "$n" -ge 50000000 ]; then echo 5; else echo 8; fi; return
  fi
  case $r in
    100mbit) if [ "$n" -ge 50000000 ]; then echo 2; else echo 3; fi ;;
    *) if [ "$n" -ge 50000000 ]; then echo 3; else echo 5; fi ;;
  esac
}

params_of() {  # workload -> parameter count (fmnist: the MLP's)
  case $1 in
    fmnist) echo 235146 ;;
    syn*m) echo "${1#syn}" | sed 's/m$//' | awk '{printf "%d\n", $1 * 1000000}' ;;
    syn*k) echo "${1#syn}" | sed 's/k$//' | awk '{printf "%d\n", $1 * 1000}' ;;
    *) die "unknown workload $1" ;;
  esac
}

# The per-node byte counters of the cluster: "tx0 rx0 tx1 rx1 ..."
node_bytes() { tools/emulated_cluster.sh bytes | awk '{printf "%s %s ", $2, $3}'; }

job_config() {  # workload optimizer eps steps -> JSON
  local w=$1 opt=$2 eps=$3 steps=$4 workload
  if [ "$w" = fmnist ]; then
    workload='{"type": "fashion_mnist", "hidden": [256, 128], "eval_every": 0}'
  else
    workload="{\"type\": \"synthetic\", \"parameters\": $(params_of "$w")}"
  fi
  cat <<EOF
{
  "train_micro_batch_size_per_gpu": 64, "steps": $steps, "seed": 1,
  "optimizer": {"type": "$opt",
                "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": $eps, "freeze_step": 0}},
  "onebit": {"workers": $WORKERS, "device": "cpu", "lease_steps": 10, "log_every": 1000,
             "workload": $workload}
}
EOF
}

# record KEY=VALUE...: one JSON line in raw.jsonl
record() {
  python3 - "$RAW" "$@" <<'PY'
import json, sys
out, *kv = sys.argv[1:]
d = {}
for item in kv:
    k, v = item.split("=", 1)
    try:
        d[k] = json.loads(v)
    except ValueError:
        d[k] = v
with open(out, "a") as f:
    f.write(json.dumps(d) + "\n")
PY
}

# onebit_run WORKLOAD RATE SYSTEM STAGE
onebit_run() {
  local w=$1 rate=$2 sys=$3 stage=$4 steps opt eps freeze mode name dir before after t0 t1
  steps=$(steps_for "$w" "$rate" "$stage")
  name=$w-$rate-$sys-$stage
  dir=$OUT/runs/$name
  rm -rf "$dir"; mkdir -p "$dir"
  opt=OneBitAdam; eps=1e-8; mode=peer
  [ "$sys" = adam ] && opt=Adam
  [ "$sys" = ps ] && mode=ps
  if [ "$stage" = warmup ]; then freeze=$((steps + 1)); else freeze=0; eps=1.0; fi
  [ "$w" = fmnist ] && [ "$stage" = warmup ] && eps=1e-5
  job_config "$w" "$opt" "$eps" "$steps" > "$dir/job.json"
  local flags=(--exchange="$mode")
  [ "$mode" = ps ] && flags+=(--servers=$WORKERS)
  log "  $sys $stage: $steps steps"
  before=$(node_bytes)
  t0=$(date +%s.%N)
  # The shards' peak resident memory (VmHWM), sampled while the job runs.
  ( peak=0
    while :; do
      for pid in $(pgrep -x onebit-server || true); do
        kb=$(awk '/VmHWM/ {print $2}' /proc/$pid/status 2> /dev/null || echo 0)
        [ "${kb:-0}" -gt "$peak" ] && peak=$kb && echo "$peak" > "$dir/shard_peak_kb"
      done
      sleep 0.5
    done ) &
  local sampler=$!
  if ! "$BIN/deploy/onebit-launch" --config="$dir/job.json" --out_dir="$dir" \
      --bin_dir="$BIN" --compare_adam=false --echo_all=false --freeze_step=$freeze \
      --timeout_s=1800 $CLUSTER "${flags[@]}" > "$dir/launch.log" 2>&1; then
    kill "$sampler" 2> /dev/null || true
    log "  FAILED: see $dir/launch.log"; tail -5 "$dir/launch.log"; return 1
  fi
  kill "$sampler" 2> /dev/null || true
  wait "$sampler" 2> /dev/null || true
  t1=$(date +%s.%N)
  after=$(node_bytes)
  record kind=onebit workload="$w" params="$(params_of "$w")" rate="$rate" system="$sys" \
    stage="$stage" steps="$steps" dir="\"$dir/onebit_adam\"" before="\"$before\"" \
    after="\"$after\"" wall="$(echo "$t1 - $t0" | bc)" \
    shard_peak_kb="$(cat "$dir/shard_peak_kb" 2> /dev/null || echo 0)" uptime="\"$(uptime | sed 's/.*load average: //')\""
}

DDP_PORT=29500
ddp_run() {  # WORKLOAD RATE
  local w=$1 rate=$2 steps name dir before after pids=() i rc=0 t0 t1
  steps=$(( $(steps_for "$w" "$rate" warmup) ))
  name=$w-$rate-ddp
  dir=$OUT/runs/$name
  rm -rf "$dir"; mkdir -p "$dir"
  DDP_PORT=$((DDP_PORT + 1))
  local wl=(--workload synthetic --parameters "$(params_of "$w")")
  [ "$w" = fmnist ] && wl=(--workload fashion_mnist)
  log "  ddp: $steps steps (+2 without allreduce)"
  before=$(node_bytes)
  t0=$(date +%s.%N)
  for ((i = 0; i < WORKERS; ++i)); do
    ip netns exec "onebit-node$i" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
      "$PY" "$ROOT/tools/bench/ddp_baseline.py" --rank $i --world $WORKERS \
      --master "10.213.0.10:$DDP_PORT" "${wl[@]}" --steps "$steps" --compute_steps 2 \
      --out "$dir/rank-$i.json" > "$dir/rank-$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  t1=$(date +%s.%N)
  after=$(node_bytes)
  if [ $rc != 0 ]; then log "  FAILED: see $dir/rank-*.log"; tail -5 "$dir/rank-0.log"; return 1; fi
  record kind=ddp workload="$w" params="$(params_of "$w")" rate="$rate" system=ddp stage=warmup \
    steps="$steps" dir="\"$dir\"" before="\"$before\"" after="\"$after\"" \
    wall="$(echo "$t1 - $t0" | bc)" uptime="\"$(uptime | sed 's/.*load average: //')\""
}

trap 'tools/emulated_cluster.sh down > /dev/null 2>&1 || true' EXIT
START=$(date +%s)
log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), load $(uptime | sed 's/.*load average: //')"
log "rates: $RATES; workloads: $WORKLOADS; systems: $SYSTEMS; out: $OUT"
memcpy_measure start
failed=0
for rate in $RATES; do
  CLUSTER=$(tools/emulated_cluster.sh up $WORKERS "$rate")
  log "cluster up: $WORKERS nodes at $rate"
  for w in $WORKLOADS; do
    log "$w at $rate"
    for sys in $SYSTEMS; do
      case $sys in
        adam) onebit_run "$w" "$rate" adam warmup || failed=1 ;;
        peer|ps) onebit_run "$w" "$rate" "$sys" warmup || failed=1
                 onebit_run "$w" "$rate" "$sys" compression || failed=1 ;;
        ddp) ddp_run "$w" "$rate" || failed=1 ;;
        *) die "unknown system $sys" ;;
      esac
    done
  done
  tools/emulated_cluster.sh down
done
memcpy_measure end
log "runs took $(( $(date +%s) - START )) s; writing the report"
python3 tools/bench/report.py "$OUT" --workers $WORKERS
[ $failed = 0 ] || die "some runs failed (see above); the report has the others"
