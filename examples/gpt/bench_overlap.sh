#!/usr/bin/env bash
# The warmup step with and without overlap on the emulated cluster (root only): the GPT
# example's small model, 4 nodes at RATE, every step a warmup step (freeze_step past the
# end), one job after the other in this order:
#   ddp_adam        Adam over DDP (gloo; its bucketed allreduce overlaps backward)
#   onebit_off      1-bit Adam, overlap=False (the warmup sum after backward, ring order)
#   onebit_on       1-bit Adam, overlap on (the default: buckets during backward, each
#                   summed round the ring)
#   onebit_on_rank  the same with onebit.exchange.warmup_order "rank" (warmup_rank.json:
#                   the same bits as overlap off, more shift steps)
#
#   sudo examples/gpt/bench_overlap.sh [--rate 100mbit] [--steps 16] [--out DIR]
#                                      [--config FILE] [--jobs "ddp_adam onebit_off ..."]
#
# --config gives the onebit jobs a job config (onebit_on_rank adds warmup_rank.json's
# order to it): ps_per_node.json runs a shard on every node, its warmup between the
# workers, as onebit.torch's servers "per_node" does. --jobs runs only those jobs.
#
# Writes DIR/<job>/ (cluster.sh's files) and DIR/results.md: per job the median step time
# of steps 2..STEPS on rank 0 (the first connects) and its ratio to DDP's.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
RATE=100mbit
STEPS=16
OUT="$HERE/out/overlap"
CONFIG=""
JOBS="ddp_adam onebit_off onebit_on onebit_on_rank"
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --config) CONFIG=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift ;;
    --jobs) JOBS=$2; shift ;;
    *) echo "usage: $0 [--rate R] [--steps N] [--out DIR] [--config FILE] [--jobs LIST]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
job() {  # NAME SYSTEM TRAIN_ARGS
  echo "[overlap $(date -u +%H:%M:%S)] $1"
  "$HERE/cluster.sh" --rate "$RATE" --steps "$STEPS" --freeze_step 100000 --systems "$2" \
    --train_args "$3" --out "$OUT/$1" > "$OUT/$1.log" 2>&1 ||
    { tail -20 "$OUT/$1.log"; exit 1; }
}
RANK_CONFIG=$HERE/warmup_rank.json
if [ -n "$CONFIG" ]; then  # the given config with the rank order
  RANK_CONFIG=$OUT/warmup_rank_config.json
  /usr/bin/python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c.setdefault("onebit", {}).setdefault("exchange", {})["warmup_order"] = "rank"
json.dump(c, open(sys.argv[2], "w"))' "$CONFIG" "$RANK_CONFIG"
fi
WITH_CONFIG=${CONFIG:+--config $CONFIG}
for j in $JOBS; do
  case $j in
    ddp_adam) job ddp_adam ddp_adam "" ;;
    onebit_off) job onebit_off onebit_adam "--overlap off $WITH_CONFIG" ;;
    onebit_on) job onebit_on onebit_adam "--overlap on $WITH_CONFIG" ;;
    onebit_on_rank) job onebit_on_rank onebit_adam "--overlap on --config $RANK_CONFIG" ;;
    *) echo "bench_overlap: unknown job $j" >&2; exit 2 ;;
  esac
done
/usr/bin/python3 - "$OUT" "$RATE" "$STEPS" "$JOBS" "$CONFIG" <<'PY'
import os, statistics, sys
out, rate, steps, jobs, config = sys.argv[1:]
def median_step(name):
    sub = next(d for d in os.listdir(os.path.join(out, name)) if os.path.isdir(os.path.join(out, name, d)))
    with open(os.path.join(out, name, sub, "steps.csv")) as f:
        next(f)
        dts = [float(line.split(",")[2]) for line in f]
    return statistics.median(dts[1:])
names = jobs.split()
m = {n: median_step(n) for n in names}
lines = [f"{rate}, {steps} steps per job (all warmup), median step of steps 2..{steps}, rank 0"
         + (f"; onebit jobs with {os.path.basename(config)}" if config else ""), "",
         "| job | median step (s) | vs DDP |", "|---|---:|---:|"]
base = m.get("ddp_adam", m[names[0]])
lines += [f"| {n} | {m[n]:.2f} | {m[n] / base:.2f}x |" for n in names]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
