#!/usr/bin/env bash
# The GPT example on an emulated cluster (root only): 4 nodes as network namespaces, each
# node's link limited with tc to RATE both ways (tools/emulated_cluster.sh), one worker per
# node, launched as torchrun launches (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT; rank 0 on node 0 also runs onebit's coordinator, on MASTER_PORT + 1).
# Each system trains the same model (gpt.py "small", 10.8M parameters) on the same batches
# from the same seed, one after the other:
#
#   sudo examples/gpt/cluster.sh [--rate 100mbit] [--steps 200] [--freeze_step 20]
#                                [--systems "ddp_adam onebit_adam ..."] [--out DIR]
#                                [--train_args "--schedule cosine --betas 0.9 0.95 ..."]
#                                [--steps_for "onebit_adam=520 ..."] [--limit_s 3600]
#                                [--freeze_for "onebit_adam=40 ..."]
#   PLOT_ONLY=1 examples/gpt/cluster.sh --out DIR     # redraw DIR/loss.png and DIR/results.md
#   RESUME=1 examples/gpt/cluster.sh ... --out DIR    # run only the systems without a result
#
# --train_args go to every system's train.py (the same hyper-parameters for all).
# --steps_for gives a system its own number of steps (and so its own schedule's length):
# the comparison is loss against wall-clock time, so a cheaper step may be spent more often.
# --freeze_for gives a system its own --freeze_step the same way (the results table says
# each system's).
# --limit_s stops a system that runs longer (a hung collective) and records it as failed.
#
# Writes OUT/<system>/ (every rank's log; rank 0's CSV of loss and time per step and its
# result JSON; onebit's systems: every rank's worker history, history-rank<R>.csv, whose
# compute_seconds is the time the worker waited for the script; the nodes' link byte
# counters before and after), OUT/results.md (the table)
# and OUT/loss.png (training loss against wall-clock time, and against the step).
# Needs: dict-gcide, python3-torch, libopenblas0-pthread (deploy/install-deps.sh), gnuplot,
# and onebit's extension: the wheel installed, or `bazel build //python:libonebit_core.so`.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
RATE=100mbit
STEPS=200
FREEZE=20
BATCH=2
SYSTEMS="ddp_adam onebit_adam zero_one_adam ddp_fp16 ddp_powersgd"
TRAIN_ARGS=""
STEPS_FOR=""
FREEZE_FOR=""
LIMIT_S=3600
OUT="$HERE/out/cluster"
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --freeze_step) FREEZE=$2; shift ;;
    --batch) BATCH=$2; shift ;;
    --systems) SYSTEMS=$2; shift ;;
    --train_args) TRAIN_ARGS=$2; shift ;;
    --steps_for) STEPS_FOR=$2; shift ;;
    --freeze_for) FREEZE_FOR=$2; shift ;;
    --limit_s) LIMIT_S=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--rate R] [--steps N] [--freeze_step N] [--batch B] [--systems S] [--out DIR] [--train_args ARGS] [--steps_for S=N ...] [--freeze_for S=N ...] [--limit_s S]" >&2; exit 2 ;;
  esac
  shift
done
WORKERS=4
PY=${PYTHON:-/usr/bin/python3}  # Debian's python3-torch
export ONEBIT_CLUSTER=${ONEBIT_CLUSTER:-obgpt}
export ONEBIT_CLUSTER_SUBNET=${ONEBIT_CLUSTER_SUBNET:-10.214.9}
MASTER="$ONEBIT_CLUSTER_SUBNET.10"  # node 0
die() { echo "gpt cluster: $*" >&2; exit 1; }
log() { echo "[gpt $(date -u +%H:%M:%S)] $*"; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

value_for() {  # SYSTEM "S=N ..." DEFAULT: SYSTEM's entry in the list, else DEFAULT
  local kv
  for kv in $2; do
    if [ "${kv%%=*}" = "$1" ]; then echo "${kv#*=}"; return; fi
  done
  echo "$3"
}

run_system() {  # SYSTEM PORT
  local sys=$1 port=$2 dir="$OUT/$1" pids=() i rc=0 t0 steps freeze
  steps=$(value_for "$sys" "$STEPS_FOR" "$STEPS")
  freeze=$(value_for "$sys" "$FREEZE_FOR" "$FREEZE")
  rm -rf "$dir" && mkdir -p "$dir"
  "$ROOT/tools/emulated_cluster.sh" bytes > "$dir/bytes_before.txt"
  t0=$(date +%s.%N)
  for ((i = 0; i < WORKERS; ++i)); do
    ip netns exec "$ONEBIT_CLUSTER-node$i" env RANK=$i WORLD_SIZE=$WORKERS LOCAL_RANK=0 \
      LOCAL_WORLD_SIZE=1 MASTER_ADDR="$MASTER" MASTER_PORT="$port" GLOO_SOCKET_IFNAME=eth0 \
      OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1 \
      ONEBIT_HISTORY_CSV="$dir/history-rank{rank}.csv" \
      PYTHONPATH="$ROOT/python:$ROOT/bazel-bin/python${PYTHONPATH:+:$PYTHONPATH}" \
      timeout -k 10 "$LIMIT_S" "$PY" "$HERE/train.py" --optimizer "$sys" --size small --steps "$steps" \
      --batch "$BATCH" --freeze_step "$freeze" --log_every 10 \
      --csv "$dir/steps.csv" --result "$dir/result.json" $TRAIN_ARGS > "$dir/rank-$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  "$ROOT/tools/emulated_cluster.sh" bytes > "$dir/bytes_after.txt"
  echo "$(date +%s.%N) - $t0" | bc > "$dir/wall_s.txt"
  if [ $rc != 0 ]; then log "  $sys FAILED: see $dir/rank-*.log"; tail -5 "$dir/rank-0.log"; return 1; fi
  log "  $(tail -1 "$dir/rank-0.log")"
}

if [ -z "${PLOT_ONLY:-}" ]; then
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc)"
  [ -f /usr/share/dictd/gcide.dict.dz ] || die "needs Debian's dict-gcide (the corpus)"
  command -v gnuplot > /dev/null || die "needs gnuplot (apt-get install gnuplot-nox)"
  "$PY" -c 'import torch' || die "needs python3-torch"
  PYTHONPATH="$ROOT/python:$ROOT/bazel-bin/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c \
    'import onebit.torch' || die "needs onebit's extension: bazel build //python:libonebit_core.so"
  trap '"$ROOT/tools/emulated_cluster.sh" down > /dev/null 2>&1 || true' EXIT
  "$ROOT/tools/emulated_cluster.sh" up $WORKERS "$RATE" > /dev/null
  log "$WORKERS nodes at $RATE; $STEPS steps${STEPS_FOR:+ ($STEPS_FOR)} x $WORKERS workers x batch $BATCH; systems: $SYSTEMS"
  echo "$(git -C "$ROOT" rev-parse --short HEAD) $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); torch $("$PY" -c 'import torch; print(torch.__version__)'); rate $RATE; steps $STEPS${STEPS_FOR:+ ($STEPS_FOR)}; freeze_step $FREEZE${FREEZE_FOR:+ ($FREEZE_FOR)}; batch $BATCH; $TRAIN_ARGS" > "$OUT/machine.txt.$$"
  # A resumed run keeps the first part's line (the same settings: the systems compare).
  if [ -n "${RESUME:-}" ] && [ -f "$OUT/machine.txt" ]; then rm "$OUT/machine.txt.$$"; else mv "$OUT/machine.txt.$$" "$OUT/machine.txt"; fi
  port=29800
  failed=0
  for sys in $SYSTEMS; do
    port=$((port + 10))
    if [ -n "${RESUME:-}" ] && [ -f "$OUT/$sys/result.json" ]; then log "$sys: done before"; continue; fi
    log "$sys"
    run_system "$sys" $port || failed=1
  done
  [ $failed = 0 ] || log "some systems failed; the report has the others"
fi
"$PY" "$HERE/report.py" "$OUT"
