#!/usr/bin/env bash
# The full-precision warmup exchange on an emulated cluster (root only): NODES network
# namespaces with one worker each, every node's link limited to RATE with tc.
#
#   sudo tools/bench_warmup.sh BASELINE_BIN [NODES=4] [PARAMS=25000000] [RATES="100mbit 1gbit"]
#                              [ITERS=5] [STEPS_100M=5] [STEPS_1G=10] [JOBS=1]
#
# BASELINE_BIN is a bin dir (deploy/, coordinator/, server/, worker/) built from the commit
# to compare with; this tree's bazel-bin is the new one. For each rate, in one run:
#   1. the exchange alone (onebit-allreduce-bench, one process per node): gloo's ring
#      allreduce (what PyTorch DDP calls over gloo), the former AllToAll exchange, the
#      pipelined ring in fp32 and bf16; median of ITERS iterations;
#   2. whole jobs, Adam (full-precision exchange every step), synthetic workload, peer mode
#      over gloo: the baseline binaries, the new ones, the new ones with warmup_dtype bf16;
#      mean warmup step time over the workers, and the bytes that left each node (eth0).
# The wire time is the payload a rank sends per allreduce, 2(W-1)/W * 4 * PARAMS bytes
# (half that for bf16), at the link rate. Results: out/bench_warmup/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=$(realpath "${1:?usage: bench_warmup.sh BASELINE_BIN [NODES] [PARAMS] [RATES] [ITERS]}")
NODES=${2:-4}
PARAMS=${3:-25000000}
RATES=${4:-"100mbit 1gbit"}
ITERS=${5:-5}
STEPS_100M=${6:-5}
STEPS_1G=${7:-10}
JOBS=${8:-1}  # 0: the exchange alone
OUT=out/bench_warmup
# A cluster of its own beside the default one (another benchmark may be using that).
export ONEBIT_CLUSTER=${ONEBIT_CLUSTER:-warmup}
export ONEBIT_CLUSTER_SUBNET=${ONEBIT_CLUSTER_SUBNET:-10.214.0}
[ "$(id -u)" -eq 0 ] || { echo "bench_warmup: needs root (network namespaces)" >&2; exit 1; }
for f in deploy/onebit-launch coordinator/onebit-coordinator server/onebit-server worker/onebit-worker; do
  [ -x "$BASE/$f" ] || { echo "bench_warmup: $BASE/$f missing" >&2; exit 1; }
done
bazel build --disk_cache=/work/.bazel-disk-cache //deploy:onebit-launch \
  //coordinator:onebit-coordinator //server:onebit-server //worker:onebit-worker \
  //tools:onebit-allreduce-bench > /dev/null 2>&1 ||
  { echo "bench_warmup: bazel build failed" >&2; exit 1; }
NEW=$(realpath bazel-bin)
rm -rf "$OUT"
mkdir -p "$OUT"
trap 'tools/emulated_cluster.sh down' EXIT

job_json() {  # STEPS DTYPE
  cat <<EOF
{
  "train_micro_batch_size_per_gpu": 16, "steps": $1, "seed": 1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8}},
  "onebit": {"workers": $NODES, "device": "cpu", "lease_steps": 10, "log_every": 1000,
             "exchange": {"mode": "peer"$([ "$2" = fp32 ] || echo ", \"warmup_dtype\": \"$2\"")},
             "workload": {"type": "synthetic", "parameters": $PARAMS}}
}
EOF
}

node_tx() { tools/emulated_cluster.sh bytes | awk '{s += $2} END {printf "%.0f\n", s}'; }
rate_bits() { case $1 in *gbit) echo $((${1%gbit} * 1000000000)) ;; *mbit) echo $((${1%mbit} * 1000000)) ;; esac; }

{
  echo "Emulated cluster: $NODES nodes, one worker each, synthetic workload of $PARAMS parameters,"
  echo "gloo over TCP; $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); $(date -u +%F)."
  echo
} > "$OUT/results.md"

for RATE in $RATES; do
  cluster=$(tools/emulated_cluster.sh up "$NODES" "$RATE")
  bits=$(rate_bits "$RATE")
  wire_fp32=$(python3 -c "print(2*($NODES-1)/$NODES*4*$PARAMS*8/$bits)")
  # 1. The exchange alone.
  store=$(mktemp -d /tmp/bench_warmup_store.XXXXXX)
  pids=()
  for ((i = 0; i < NODES; ++i)); do
    ip netns exec "$ONEBIT_CLUSTER-node$i" "$NEW/tools/onebit-allreduce-bench" --rank=$i \
      --world=$NODES --hostname="$ONEBIT_CLUSTER_SUBNET.$((10 + i))" --store="$store" --n="$PARAMS" --iters="$ITERS" \
      --algos=gloo_ring,alltoall,ring,ring_bf16 > "$OUT/allreduce-$RATE-$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  rm -rf "$store"
  {
    echo "### $RATE: the exchange alone (wire time of fp32: $(printf %.3f "$wire_fp32") s)"
    echo
    echo "| algorithm | median s | x wire time (fp32) | x gloo ring | bytes sent per rank |"
    echo "|---|---:|---:|---:|---:|"
    python3 - "$OUT/allreduce-$RATE-0.log" "$wire_fp32" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
wire = float(sys.argv[2])
ring = next(r["median_s"] for r in rows if r["algo"] == "gloo_ring")
names = {"gloo_ring": "gloo ring allreduce (DDP's)", "alltoall": "former exchange (AllToAll + AllGather)",
         "ring": "pipelined ring, fp32", "ring_bf16": "pipelined ring, bf16 on the wire"}
for r in rows:
    print(f"| {names[r['algo']]} | {r['median_s']:.3f} | {r['median_s'] / wire:.2f} | "
          f"{r['median_s'] / ring:.2f} | {r['bytes_sent']} |")
PY
    echo
  } >> "$OUT/results.md"
  # 2. Whole jobs.
  [ "$JOBS" = 1 ] || continue
  steps=$STEPS_1G
  [ "$RATE" = 100mbit ] && steps=$STEPS_100M
  job_json "$steps" fp32 > "$OUT/job-fp32.json"
  job_json "$steps" bf16 > "$OUT/job-bf16.json"
  {
    echo "### $RATE: Adam jobs, $steps steps"
    echo
    echo "| binaries | warmup dtype | step time (mean) | x wire time (fp32) | wire bytes out of a node per step (eth0) |"
    echo "|---|---|---:|---:|---:|"
  } >> "$OUT/results.md"
  for spec in "baseline|$BASE|fp32" "ring|$NEW|fp32" "ring|$NEW|bf16"; do
    IFS='|' read -r label bin dtype <<< "$spec"
    name="job-$RATE-$label-$dtype"
    before=$(node_tx)
    "$bin/deploy/onebit-launch" --config="$OUT/job-$dtype.json" --out_dir="$OUT/$name" \
      --bin_dir="$bin" --compare_adam=false --echo_all=false $cluster > "$OUT/$name.log" 2>&1 ||
      { echo "bench_warmup: $name failed, see $OUT/$name.log" >&2; exit 1; }
    after=$(node_tx)
    python3 - "$OUT/$name/onebit_adam" "$NODES" "$steps" "$((after - before))" "$wire_fp32" \
        "$label" "$dtype" <<'PY' >> "$OUT/results.md"
import json, sys
d, nodes, steps, wire_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
wire, label, dtype = float(sys.argv[5]), sys.argv[6], sys.argv[7]
s = [json.load(open(f"{d}/worker-{i}.json")) for i in range(nodes)]
step = sum(float(x["seconds_warmup"]) / int(x["warmup_steps"]) for x in s) / nodes
print(f"| {label} | {dtype} | {step:.3f} s | {step / wire:.2f} | {wire_bytes / nodes / steps:.0f} |")
PY
  done
  echo >> "$OUT/results.md"
done
cat "$OUT/results.md"
