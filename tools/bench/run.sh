#!/usr/bin/env bash
# onebit against PyTorch DDP on an emulated cluster (root only): 4 nodes as network
# namespaces joined by veth links to one bridge, each node's link limited with tc (both
# directions) to each RATE in turn; one worker per node; the coordinator (and, by default, the ps shards) on
# a host of their own whose link is not limited (tools/emulated_cluster.sh).
#
#   sudo tools/bench/run.sh [--quick] [--rates "100mbit 1gbit 10gbit none"]
#                           [--workloads "syn25m syn100m fmnist"] [--systems "adam peer peer16 ps psw zo ddp ddp16"]
#                           [--shards separate|colocated] [--shards-per-node P] [--nodes N]
#                           [--cc cubic|bbr|machine]
#                           [--out DIR] [--bin DIR] [--skip "WORKLOAD@RATE ..."]
#
# --shards: where ps mode's shards run: "separate" (default; on the control host, whose
# link is not limited) or "colocated" (shard i on worker i's node, behind that node's
# limited link, as BytePS's colocated mode or a DaemonSet places them).
# --shards-per-node P: ps mode runs P x nodes shards (1 by default); colocated, P on each
# node, which the workers push part by part (worker/exchange/ps_exchange.h, PlanPushes).
# --nodes N: nodes (one worker each), 4 by default.
# --cc C: the hosts' TCP congestion control, cubic (Linux's default) unless given: bbr,
# reno, or machine (whatever this machine has; bbr on the project's). Set machine-wide for
# the run and put back after; runs before 2026-11-27's "TCP congestion control" used bbr.
# --skip: configurations left out (e.g. "fmnist@10gbit"), to fit a run into the time there is.
# --whole N: whole runs, timed from launch to exit: every system runs N steps, onebit's
# 1-bit Adam with 15% of them warmup (PowerSGD's plain allreduce as long); the report is
# tools/bench/whole_report.py's (OUT/whole.md, OUT/whole.png) instead of report.py's.
# COMPRESSION_STEPS=N (environment): compression steps per run instead of 8 (4 from 50M
# parameters), for steadier medians.
# --bin DIR: the onebit binaries of an earlier run (OUT/bin of it) instead of building this
# tree's, e.g. to measure a change against the binaries before it.
# Systems (each a job of its own per workload and rate):
#   adam   onebit, optimizer "Adam": full-precision exchange (peer mode) on every step
#   peer   onebit, 1-bit Adam, peer mode: warmup steps, then compression steps
#   peer16 the same with the warmup's exchange in bf16 (onebit.exchange.warmup_dtype)
#   ps     onebit, 1-bit Adam, ps mode with 4 shards (S = W), the warmup through the shards
#          (onebit.exchange.warmup_over shards): the same
#   psw    the same with the warmup between the workers (warmup_over workers, 1-bit Adam's
#          default: the peer warmup's ring; the shards serve the compression stage)
#   zo     onebit, 0/1 Adam, peer mode, to time each kind of its steps: ZO_WARMUP (8)
#          steps before var_freeze_step with var_update_scaler 1 (variance updates, an exact
#          allreduce, at steps 1, 2, 4, 8; compressed-gradient steps between), then ZO_STEPS
#          (48) of local steps and syncs with DeepSpeed's local_step_clipper (16, the longest
#          interval between syncs) and local_step_scaler 2 (the interval reaches 16 after 8
#          local steps). report.py times each kind and composes a long run with DeepSpeed's
#          settings from them.
#   ddp    PyTorch DDP + torch.optim.Adam over gloo (tools/bench/ddp_baseline.py)
#   ddp16  the same with DDP's fp16 compression hook (gradients in fp16 on the wire)
#   ddpbf16  the same with the bf16 hook
#   psgd   the same with torch's powerSGD_hook (rank 4; the synthetic workload's chunks as
#          1000-column matrices, so that it has matrices to compress), plain allreduce for
#          as many steps as 1-bit Adam warms up
#   bpsgd  the same with batched_powerSGD_hook (rank 4)
#   A DDP system with ":deb" (ddp:deb, psgd:deb, ...) runs on Debian's python3-torch
#   (/usr/bin/python3); without it, on $PYTHON (Debian's too unless set, e.g.
#   PYTHON=/opt/onebit/venvs/torch-latest/bin/python for pip's torch).
# Workloads: synNNm (onebit's synthetic quadratic bowl with NN million parameters; synNNk for
# thousands) and fmnist (the demo's MLP on Fashion-MNIST, 64 examples per worker and step).
# The runs switch after a few warmup steps (eps 1 keeps the first compressed updates
# bounded; these runs measure time and bytes, not training).
#
# Per run it records: each step's time and end time (per worker; the first step of each
# stage is not measured: it connects or sets up), the gradient's share of it, the workers'
# own byte counters, every node's link counters both ways sampled every 0.1 s
# (tools/bench/sampler.py; a stage's wire bytes are the counters between the ends of its
# measured steps), in peer mode every transport call of every worker (transport-<i>.csv,
# tools/bench/rounds.py), the shards' peak memory, and `uptime`. A memcpy measurement
# (tools/bench/memcpy_bw.c) at the start and at the end gives the bound.
# tools/bench/report.py then writes OUT/results.csv, OUT/results.md and OUT/<workload>.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

QUICK=0
RATES="100mbit 1gbit 10gbit none"
WORKLOADS="syn25m syn100m fmnist"
SYSTEMS="adam peer ps ddp"
OUT=out/bench
BIN_FROM=
SKIP=" "
SHARDS=separate
SHARDS_PER_NODE=1
WORKERS=4
CC=cubic
WHOLE=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --rates) RATES=$2; shift ;;
    --workloads) WORKLOADS=$2; shift ;;
    --systems) SYSTEMS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --bin) BIN_FROM=$(cd "$2" && pwd); shift ;;
    --skip) SKIP=" $2 "; shift ;;
    --shards) SHARDS=$2; shift ;;
    --shards-per-node) SHARDS_PER_NODE=$2; shift ;;
    --nodes) WORKERS=$2; shift ;;
    --cc) CC=$2; shift ;;
    --whole) WHOLE=$2; shift ;;
    *) echo "usage: $0 [--quick] [--whole N] [--rates R] [--workloads W] [--systems S] [--shards S] [--shards-per-node P] [--nodes N] [--cc C] [--out DIR] [--bin DIR]" >&2; exit 2 ;;
  esac
  shift
done
if [ $QUICK = 1 ]; then
  [ "$RATES" = "100mbit 1gbit 10gbit none" ] && RATES="100mbit none"
  [ "$WORKLOADS" = "syn25m syn100m fmnist" ] && WORKLOADS="syn2m fmnist"
  [ "$OUT" = out/bench ] && OUT=out/bench-quick
fi
case $WHOLE in 0|[1-9]|[1-9][0-9]|[1-9][0-9][0-9]|[1-9][0-9][0-9][0-9]) ;; *) echo "--whole must be a number of steps" >&2; exit 2 ;; esac
case $SHARDS in separate|colocated) ;; *) echo "--shards must be separate or colocated" >&2; exit 2 ;; esac
case $SHARDS_PER_NODE in [1-9]|[1-9][0-9]) ;; *) echo "--shards-per-node must be a number from 1 to 99" >&2; exit 2 ;; esac
# A cluster of its own (names and subnet), so that it never meets another one on the machine.
export ONEBIT_CLUSTER=${ONEBIT_CLUSTER:-obbench}
export ONEBIT_CLUSTER_SUBNET=${ONEBIT_CLUSTER_SUBNET:-10.214.7}
# Debian's python (python3-torch), whatever python3 comes first on PATH.
PY=${PYTHON:-/usr/bin/python3}
die() { echo "bench: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc)"
command -v gnuplot > /dev/null || die "needs gnuplot (apt-get install gnuplot-nox)"
"$PY" -c 'import torch' 2> /dev/null || die "needs PyTorch for the DDP baseline (apt-get install python3-torch)"
[ -d /usr/share/datasets/fashion-mnist ] || die "needs Fashion-MNIST (apt-get install dataset-fashion-mnist)"

log() { echo "[bench $(date -u +%H:%M:%S)] $*"; }
load() { uptime | sed 's/.*load average: //'; }
mkdir -p "$OUT/runs"
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw.jsonl
: > "$RAW"

gcc -O2 -o "$OUT/memcpy_bw" tools/bench/memcpy_bw.c
# A copy of the binaries, so that a rebuild of the tree while the bench runs changes nothing.
BIN=$OUT/bin
if [ -n "$BIN_FROM" ]; then
  [ "$BIN_FROM" = "$BIN" ] || { rm -rf "$BIN"; cp -r "$BIN_FROM" "$BIN"; }
  log "binaries from $BIN_FROM ($(cat "$BIN_FROM/../commit" 2> /dev/null || echo '?'))"
  cp "$BIN_FROM/../commit" "$OUT/commit" 2> /dev/null || true
else
  log "building (bazel, -O2 as .bazelrc sets)"
  bazel build --disk_cache=/work/.bazel-disk-cache //deploy:onebit-launch \
    //coordinator:onebit-coordinator //server:onebit-server //worker:onebit-worker 2>&1 | tail -1
  rm -rf "$BIN"
  for b in deploy/onebit-launch coordinator/onebit-coordinator server/onebit-server worker/onebit-worker; do
    mkdir -p "$BIN/$(dirname $b)"
    cp bazel-bin/$b "$BIN/$b"
  done
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!out' || echo '+changes')" > "$OUT/commit"
fi

TRACE=0
case $("$BIN/deploy/onebit-launch" --helpfull 2>&1 || true) in *transport_trace*) TRACE=1 ;; esac

memcpy_measure() {  # label
  local one all
  one=$("$OUT/memcpy_bw" 1 5)
  all=$("$OUT/memcpy_bw" "$(nproc)" 5)
  printf '{"kind": "memcpy", "label": "%s", "single_gbps": %s, "all_gbps": %s, "procs": %s, "uptime": "%s"}\n' \
    "$1" "$(echo "$one" | awk '{print $2}')" "$(echo "$all" | awk '{print $2}')" \
    "$(echo "$all" | awk '{print $6}')" "$(load)" >> "$RAW"
  log "memcpy ($1): one process $(echo "$one" | awk '{print $2}') GB/s, $(nproc) at once $(echo "$all" | awk '{print $2}') GB/s"
}

params_of() {  # workload -> parameter count (fmnist: the MLP's)
  case $1 in
    fmnist) echo 235146 ;;
    syn*m) echo "${1#syn}" | sed 's/m$//' | awk '{printf "%d\n", $1 * 1000000}' ;;
    syn*k) echo "${1#syn}" | sed 's/k$//' | awk '{printf "%d\n", $1 * 1000}' ;;
    *) die "unknown workload $1" ;;
  esac
}

# Steps per stage, by workload and rate (the first step of each stage is not measured): few
# where a step is long (the 100 Mbit/s warmup of 100M parameters moves about 600 MB per
# node, ~50 s a step).
steps_for() {  # workload rate stage -> steps
  local w=$1 r=$2 s=$3 n
  n=$(params_of "$w")
  if [ "$WHOLE" -gt 0 ]; then  # 15% warmup, at least 2 (PowerSGD's start)
    local warm=$(( (WHOLE * 15 + 50) / 100 ))
    [ $warm -ge 2 ] || warm=2
    if [ "$s" = compression ]; then echo $((WHOLE - warm)); else echo $warm; fi
    return
  fi
  if [ $QUICK = 1 ]; then
    [ "$w" = fmnist ] && { echo 15; return; }
    echo 3; return
  fi
  if [ "$w" = fmnist ]; then echo 40; return; fi
  if [ "$s" = compression ]; then
    if [ -n "${COMPRESSION_STEPS:-}" ]; then echo "$COMPRESSION_STEPS"; return; fi
    if [ "$n" -ge 50000000 ]; then echo 4; else echo 8; fi; return
  fi
  case $r in
    100mbit) if [ "$n" -ge 50000000 ]; then echo 2; else echo 3; fi ;;
    *) if [ "$n" -ge 50000000 ]; then echo 3; else echo 5; fi ;;
  esac
}

job_config() {  # workload optimizer steps [warmup_dtype [warmup_over]] -> JSON
  local w=$1 opt=$2 steps=$3 dtype=${4:-fp32} over=${5:-} workload params xkeys
  params='"lr": 0.001, "betas": [0.9, 0.999], "eps": 1.0, "freeze_step": 0'
  if [ "$opt" = ZeroOneAdam ]; then
    params='"lr": 0.001, "betas": [0.9, 0.999], "eps": 1.0, "var_freeze_step": 0,
                           "var_update_scaler": 1, "local_step_scaler": 2, "local_step_clipper": 16'
  fi
  xkeys="\"warmup_dtype\": \"$dtype\""
  # warmup_over is a ps key: the file says ps too (the launcher's --exchange and --servers
  # come after the file is read). ps names "shards" (OneBitAdam's default is "workers").
  [ -z "$over" ] ||
    xkeys="$xkeys, \"mode\": \"ps\", \"servers\": $WORKERS, \"warmup_over\": \"$over\""
  if [ "$w" = fmnist ]; then
    workload='{"type": "fashion_mnist", "hidden": [256, 128], "eval_every": 0}'
  else
    workload="{\"type\": \"synthetic\", \"parameters\": $(params_of "$w")}"
  fi
  # Deadlines of 15 min: a ps warmup round trip of 100M parameters over 100 Mbit/s took over
  # the default 2 min here (the job then restarts, again and again).
  # eps 1: the runs switch after a few warmup steps, when v is still near 0 and a small eps
  # diverges (the MLP within a few compressed steps); these runs measure time and bytes.
  cat <<EOF
{
  "train_micro_batch_size_per_gpu": 64, "steps": $steps, "seed": 1,
  "optimizer": {"type": "$opt",
                "params": {$params}},
  "onebit": {"workers": $WORKERS, "device": "cpu", "lease_steps": 10, "log_every": 1000,
             "exchange": {$xkeys},
             "failure": {"ps_step_deadline_s": 900, "gloo_timeout_s": 900},
             "workload": $workload}
}
EOF
}

# record KEY=VALUE...: one JSON line in raw.jsonl (values parsed as JSON where they are)
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

SAMPLER_PID=
sampler_start() {  # file
  python3 tools/bench/sampler.py "$1" $WORKERS 0.1 "$ONEBIT_CLUSTER" &
  SAMPLER_PID=$!
  # Its first sample before the job starts (python starts slowly on a loaded machine); the
  # report leaves a stage's wire bytes out when the samples do not cover it.
  local i
  for i in $(seq 50); do [ -s "$1" ] && break; sleep 0.2; done
}
sampler_stop() {
  if [ -n "$SAMPLER_PID" ]; then
    kill "$SAMPLER_PID" 2> /dev/null || true
    wait "$SAMPLER_PID" 2> /dev/null || true
  fi
  SAMPLER_PID=
}

# onebit_run WORKLOAD RATE SYSTEM: adam (warmup steps only), peer or ps (warmup steps, then
# compression steps, in one job).
onebit_run() {
  local w=$1 rate=$2 sys=$3 nw nc opt=OneBitAdam mode=peer name dir t0 t1 load0 dtype=fp32
  local over=
  nw=$(steps_for "$w" "$rate" warmup)
  nc=$(steps_for "$w" "$rate" compression)
  if [ "$sys" = ps ]; then mode=ps; over=shards; fi
  if [ "$sys" = psw ]; then mode=ps; over=workers; fi
  if [ "$sys" = adam ]; then opt=Adam; nc=0; [ "$WHOLE" -gt 0 ] && nw=$WHOLE; fi
  [ "$sys" = peer16 ] && dtype=bf16
  if [ "$sys" = zo ]; then opt=ZeroOneAdam; nw=${ZO_WARMUP:-8}; nc=${ZO_STEPS:-48}; fi
  name=$w-$rate-$sys
  dir=$OUT/runs/$name
  rm -rf "$dir"; mkdir -p "$dir"
  job_config "$w" "$opt" $((nw + nc)) "$dtype" "$over" > "$dir/job.json"
  local flags=(--exchange="$mode")
  [ "$mode" = ps ] && flags+=(--servers=$((WORKERS * SHARDS_PER_NODE)))
  [ "$mode" = ps ] && [ "$SHARDS" = colocated ] && flags+=(--cluster_shards=nodes)
  # Peer mode's per-call trace (tools/bench/rounds.py), where the launcher has it (--bin
  # may name binaries from before it).
  { [ "$mode" = peer ] || [ "$mode" = ps ]; } && [ "$TRACE" = 1 ] && flags+=(--transport_trace)
  log "  $sys: $nw warmup + $nc compression steps"
  load0=$(load)
  sampler_start "$dir/sampler.txt"
  t0=$(date +%s.%N)
  if ! "$BIN/deploy/onebit-launch" --config="$dir/job.json" --out_dir="$dir" \
      --bin_dir="$BIN" --compare_adam=false --echo_all=false --freeze_step="$nw" \
      --timeout_s=1800 $CLUSTER "${flags[@]}" > "$dir/launch.log" 2>&1; then
    sampler_stop
    log "  FAILED: see $dir/launch.log"; tail -5 "$dir/launch.log"; return 1
  fi
  t1=$(date +%s.%N)
  sampler_stop
  record kind=onebit workload="$w" params="$(params_of "$w")" rate="$rate" system="$sys" \
    shards="$SHARDS" shards_per_node="$SHARDS_PER_NODE" \
    warmup_steps="$nw" compression_steps="$nc" whole="$WHOLE" dir="\"$dir/onebit_adam\"" \
    sampler="\"$dir/sampler.txt\"" wall="$(echo "$t1 - $t0" | bc)" \
    load_before="\"$load0\"" uptime="\"$(load)\""
}

DDP_PORT=29500
ddp_run() {  # WORKLOAD RATE SYSTEM (ddp, ddp16, ddpbf16, psgd, bpsgd; :deb for Debian's torch)
  local w=$1 rate=$2 sys=$3 steps name dir pids=() i rc=0 t0 t1 load0 hook=none py=$PY
  local warm compute=2
  steps=$(steps_for "$w" "$rate" warmup)
  warm=$steps
  if [ "$WHOLE" -gt 0 ]; then steps=$WHOLE; compute=0; fi
  case $sys in *:deb) py=/usr/bin/python3 ;; esac
  local extra=()
  case ${sys%:deb} in
    ddp16) hook=fp16 ;;
    ddpbf16) hook=bf16 ;;
    psgd) hook=powersgd; extra=(--powersgd_start "$warm" --chunk 1000000 --matrix_cols 1000) ;;
    bpsgd) hook=batched_powersgd; extra=(--powersgd_start "$warm") ;;
  esac
  name=$w-$rate-${sys/:/-}
  dir=$OUT/runs/$name
  rm -rf "$dir"; mkdir -p "$dir"
  DDP_PORT=$((DDP_PORT + 1))
  local wl=(--workload synthetic --parameters "$(params_of "$w")")
  [ "$w" = fmnist ] && wl=(--workload fashion_mnist)
  log "  $sys: $steps steps (after $compute without allreduce), torch $("$py" -c 'import torch; print(torch.__version__)')"
  load0=$(load)
  sampler_start "$dir/sampler.txt"
  t0=$(date +%s.%N)
  for ((i = 0; i < WORKERS; ++i)); do
    ip netns exec "$ONEBIT_CLUSTER-node$i" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
      "$py" "$ROOT/tools/bench/ddp_baseline.py" --rank $i --world $WORKERS \
      --master "$ONEBIT_CLUSTER_SUBNET.10:$DDP_PORT" "${wl[@]}" --steps "$steps" \
      --compute_steps $compute --comm_hook $hook "${extra[@]}" \
      --out "$dir/rank-$i.json" > "$dir/rank-$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  t1=$(date +%s.%N)
  sampler_stop
  if [ $rc != 0 ]; then log "  FAILED: see $dir/rank-*.log"; tail -5 "$dir/rank-0.log"; return 1; fi
  record kind=ddp workload="$w" params="$(params_of "$w")" rate="$rate" system="$sys" \
    warmup_steps="$steps" compression_steps=0 whole="$WHOLE" dir="\"$dir\"" sampler="\"$dir/sampler.txt\"" \
    wall="$(echo "$t1 - $t0" | bc)" load_before="\"$load0\"" uptime="\"$(load)\""
}

# The hosts' TCP congestion control: a new namespace takes the machine's, and these
# machines' namespaces may not change it, so the machine's is set for the run and put back
# after (the run's results depend on it: BENCHMARKS.md, "TCP congestion control").
CC_BEFORE=$(sysctl -n net.ipv4.tcp_congestion_control)
if [ "$CC" != machine ] && [ "$CC" != "$CC_BEFORE" ]; then
  sysctl -q -w net.ipv4.tcp_congestion_control="$CC" || die "cannot set TCP congestion control $CC"
fi
trap 'sampler_stop; tools/emulated_cluster.sh down > /dev/null 2>&1 || true; sysctl -q -w net.ipv4.tcp_congestion_control="$CC_BEFORE" || true' EXIT
START=$(date +%s)
log "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), load $(load)"
CC_USED=$(sysctl -n net.ipv4.tcp_congestion_control)
log "TCP congestion control in the cluster: $CC_USED (--cc; the machine's was $CC_BEFORE)"
record kind=env tcp_congestion_control="$CC_USED" cores="$(nproc)"
log "rates: $RATES; workloads: $WORKLOADS; systems: $SYSTEMS; $WORKERS nodes; ps shards $SHARDS ($SHARDS_PER_NODE per node); out: $OUT"
memcpy_measure start
failed=0
for rate in $RATES; do
  CLUSTER=$(tools/emulated_cluster.sh up $WORKERS "$rate")
  log "cluster up: $WORKERS nodes at $rate"
  for w in $WORKLOADS; do
    if [[ "$SKIP" == *" $w@$rate "* ]]; then log "$w at $rate: skipped (--skip)"; continue; fi
    log "$w at $rate"
    for sys in $SYSTEMS; do
      case $sys in
        adam|peer|peer16|ps|psw|zo) onebit_run "$w" "$rate" "$sys" || failed=1 ;;
        ddp|ddp16|ddpbf16|psgd|bpsgd|ddp:deb|ddp16:deb|ddpbf16:deb|psgd:deb|bpsgd:deb)
          ddp_run "$w" "$rate" "$sys" || failed=1 ;;
        *) die "unknown system $sys" ;;
      esac
    done
  done
  tools/emulated_cluster.sh down
done
memcpy_measure end
log "runs took $(( $(date +%s) - START )) s; writing the report"
if [ "$WHOLE" -gt 0 ]; then
  python3 tools/bench/whole_report.py "$OUT" --workers $WORKERS
else
  python3 tools/bench/report.py "$OUT" --workers $WORKERS
fi
[ $failed = 0 ] || die "some runs failed (see above); the report has the others"
