#!/usr/bin/env bash
# Inter-node bytes of the hierarchical exchange against the flat modes, measured on an
# emulated cluster (root only): NODES network namespaces with LOCAL workers each, every
# node's link limited to RATE with tc, the coordinator and shards on a host of their own.
#
#   sudo tools/bench_hierarchical.sh [NODES=2] [LOCAL=2] [RATE=1gbit] [PARAMS=1000000] [STEPS=30]
#
# ONLY=REGEX runs only the exchanges whose label matches (e.g. ONLY=hierarchical).
# For each exchange (flat peer, flat ps, hierarchical over peer, hierarchical over ps) and
# each stage (a run of warmup steps only, a run of compression steps only) it records:
#   - wire bytes that left each node per step: the node's eth0 counter (payload, TCP/IP
#     headers, control traffic), the measure that needs no trust in the processes;
#   - payload bytes the node's workers counted as inter-node, per step (a flat exchange
#     counts every byte, including those to a worker on the same node);
#   - step time (mean over workers of the stage's seconds / steps).
# The compression runs start compressing at step 1, before any variance exists: eps 1 keeps
# the updates bounded (these runs measure bytes and time, not training).
# Results: a Markdown table on stdout and in out/bench_hierarchical/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${1:-2}
LOCAL=${2:-2}
RATE=${3:-1gbit}
PARAMS=${4:-1000000}
STEPS=${5:-30}
WORKERS=$((NODES * LOCAL))
OUT=out/bench_hierarchical
[ "$(id -u)" -eq 0 ] || { echo "bench_hierarchical: needs root (network namespaces)" >&2; exit 1; }

bazel build //deploy:onebit-launch //coordinator:onebit-coordinator //server:onebit-server \
  //worker:onebit-worker > /dev/null
mkdir -p "$OUT"
cat > "$OUT/job.json" <<EOF
{
  "train_micro_batch_size_per_gpu": 16, "steps": $STEPS, "seed": 1,
  "optimizer": {"type": "OneBitAdam",
                "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1.0, "freeze_step": 0}},
  "onebit": {"workers": $WORKERS, "device": "cpu", "lease_steps": 10, "log_every": 1000,
             "workload": {"type": "synthetic", "parameters": $PARAMS}}
}
EOF
trap 'tools/emulated_cluster.sh down' EXIT
cluster=$(tools/emulated_cluster.sh up "$NODES" "$RATE")

node_tx() { tools/emulated_cluster.sh bytes | awk '{s += $2} END {print s}'; }

# run NAME STAGE FLAGS...: one job, prints "wire_per_node_step payload_per_node_step step_ms"
run() {
  local name=$1 stage=$2; shift 2
  local freeze=0
  [ "$stage" = warmup ] && freeze=$((STEPS + 1))
  local before after
  before=$(node_tx)
  ./bazel-bin/deploy/onebit-launch --config="$OUT/job.json" --out_dir="$OUT/$name-$stage" \
    --bin_dir=bazel-bin --compare_adam=false --echo_all=false --freeze_step=$freeze \
    $cluster "$@" > "$OUT/$name-$stage.log" 2>&1 ||
    { echo "bench_hierarchical: $name $stage failed, see $OUT/$name-$stage.log" >&2; exit 1; }
  after=$(node_tx)
  python3 - "$OUT/$name-$stage/onebit_adam" "$stage" "$WORKERS" "$NODES" "$STEPS" \
      "$((after - before))" <<'PY'
import json, sys
d, stage, workers, nodes, steps, wire = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
s = [json.load(open(f"{d}/worker-{i}.json")) for i in range(workers)]
payload = sum(int(x[f"inter_node_bytes_sent_{stage}"]) for x in s) / nodes / steps
ms = 1000 * sum(float(x[f"seconds_{stage}"]) for x in s) / workers / steps
print(f"{wire / nodes / steps:.0f} {payload:.0f} {ms:.1f}")
PY
}

{
  echo "Emulated cluster: $NODES nodes x $LOCAL workers, $RATE per node link, synthetic workload"
  echo "of $PARAMS parameters, $STEPS steps per run, 1-bit Adam over gloo; bytes per node per step."
  echo
  echo "| exchange | stage | wire bytes out of a node (eth0) | inter-node payload (counters) | step time |"
  echo "|---|---|---|---|---|"
} | tee "$OUT/results.md"
for spec in "flat peer|--exchange=peer" "flat ps ($NODES shards)|--exchange=ps --servers=$NODES" \
            "hierarchical, peer between nodes|--exchange=hierarchical --local_size=$LOCAL --inter=peer" \
            "hierarchical, ps between nodes ($((NODES * LOCAL)) shards)|--exchange=hierarchical --local_size=$LOCAL --inter=ps --servers=$((NODES * LOCAL))" \
            "hierarchical sharded state, peer between nodes|--exchange=hierarchical --local_size=$LOCAL --inter=peer --shard_state=true"; do
  label=${spec%%|*}
  [[ -z "${ONLY:-}" || "$label" =~ $ONLY ]] || continue
  flags=${spec#*|}
  name=$(echo "$label" | tr -c 'a-z0-9' '-' | sed 's/-*$//')
  for stage in warmup compression; do
    read -r wire payload ms < <(run "$name" "$stage" $flags)
    printf '| %s | %s | %s | %s | %s ms |\n' "$label" "$stage" "$wire" "$payload" "$ms" |
      tee -a "$OUT/results.md"
  done
done
