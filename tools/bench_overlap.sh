#!/usr/bin/env bash
# Overlap of the full-precision exchange with the backward pass: the Fashion-MNIST
# MLP (784-256-128-10), 4 workers, optimizer "Adam" (every step a full-precision exchange),
# peer mode over gloo, exchange.overlap off and on in alternation, REPS pairs, in one run.
#
#   tools/bench_overlap.sh [RATE=loopback] [REPS=3] [STEPS=300]
#
# RATE loopback: the workers are processes on this machine over 127.0.0.1; otherwise (root
# only) an emulated cluster of 4 nodes whose links tc limits to RATE (100mbit, 1gbit;
# tools/emulated_cluster.sh, under ONEBIT_CLUSTER=ovl, 10.216.5.*). Per run: the mean over
# workers of the median step time, compute part and exchange part (steps 2..STEPS; the
# first one connects). Results: out/bench_overlap/results-RATE.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-loopback}
REPS=${2:-3}
STEPS=${3:-300}
OUT=out/bench_overlap
export ONEBIT_CLUSTER=${ONEBIT_CLUSTER:-ovl}
export ONEBIT_CLUSTER_SUBNET=${ONEBIT_CLUSTER_SUBNET:-10.216.5}
bazel build --disk_cache=/work/.bazel-disk-cache //deploy:onebit-launch \
  //coordinator:onebit-coordinator //server:onebit-server //worker:onebit-worker > /dev/null 2>&1 ||
  { echo "bench_overlap: bazel build failed" >&2; exit 1; }
mkdir -p "$OUT"
BIN=$(mktemp -d /tmp/bench_overlap_bin.XXXXXX)  # a copy: a rebuild meanwhile changes nothing
for f in deploy/onebit-launch coordinator/onebit-coordinator server/onebit-server worker/onebit-worker; do
  mkdir -p "$BIN/$(dirname $f)"; cp bazel-bin/$f "$BIN/$f"
done
CLUSTER=
if [ "$RATE" != loopback ]; then
  [ "$(id -u)" -eq 0 ] || { echo "bench_overlap: an emulated cluster needs root" >&2; exit 1; }
  trap 'tools/emulated_cluster.sh down > /dev/null 2>&1 || true' EXIT
  CLUSTER=$(tools/emulated_cluster.sh up 4 "$RATE")
fi

job_json() {  # OVERLAP
  cat <<JSON
{
  "train_micro_batch_size_per_gpu": 64, "steps": $STEPS, "seed": 1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8}},
  "onebit": {"workers": 4, "device": "cpu", "lease_steps": 50, "log_every": 1000,
             "exchange": {"mode": "peer", "overlap": $1},
             "workload": {"type": "fashion_mnist", "hidden": [256, 128], "eval_every": 0}}
}
JSON
}
job_json false > "$OUT/job-off.json"
job_json true > "$OUT/job-on.json"
RES=$OUT/results-$RATE.md
{
  echo "Fashion-MNIST MLP 784-256-128-10, 4 workers, Adam, peer mode over gloo, $RATE, $STEPS steps;"
  echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); $(date -u +%FT%TZ)."
  echo
  echo "| run | overlap | step ms (median) | compute ms | rest (exchange + update) ms | load before |"
  echo "|---|---|---:|---:|---:|---|"
} > "$RES"
for ((r = 1; r <= REPS; ++r)); do
  order="off on"; [ $((r % 2)) = 0 ] && order="on off"
  for o in $order; do
    dir=$OUT/runs/$RATE-$r-$o
    rm -rf "$dir"; mkdir -p "$dir"
    load=$(uptime | sed 's/.*load average: //')
    "$BIN/deploy/onebit-launch" --config="$OUT/job-$o.json" --out_dir="$dir" --bin_dir="$BIN" \
      --compare_adam=false --echo_all=false --timeout_s=1800 $CLUSTER > "$dir/launch.log" 2>&1 ||
      { echo "bench_overlap: run $dir failed, see $dir/launch.log" >&2; exit 1; }
    python3 - "$dir/onebit_adam" "$r" "$o" "$load" <<'PY' >> "$RES"
import csv, statistics, sys
d, r, o, load = sys.argv[1:]
step, comp, exch = [], [], []
for i in range(4):
    rows = [x for x in csv.DictReader(open(f"{d}/worker-{i}.csv")) if x["kind"] == "step"]
    rows = [x for x in rows if int(x["step"]) >= 2]
    step.append(statistics.median(float(x["seconds"]) for x in rows))
    comp.append(statistics.median(float(x["compute_seconds"]) for x in rows))
    exch.append(statistics.median(float(x["seconds"]) - float(x["compute_seconds"]) for x in rows))
m = lambda v: 1e3 * statistics.mean(v)
print(f"| {r} | {o} | {m(step):.2f} | {m(comp):.2f} | {m(exch):.2f} | {load} |")
PY
  done
done
rm -rf "$BIN"
python3 - "$RES" <<'PY' | tee -a "$RES"
import re, statistics, sys
rows = [l.split("|") for l in open(sys.argv[1]) if re.match(r"\| \d", l)]
by = {"off": [], "on": []}
for c in rows:
    by[c[2].strip()].append(float(c[3]))
off, on = statistics.median(by["off"]), statistics.median(by["on"])
print(f"\nmedian over runs: off {off:.2f} ms, on {on:.2f} ms per step; on/off = {on / off:.3f}")
PY
