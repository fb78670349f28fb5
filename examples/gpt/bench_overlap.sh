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
#
# Writes DIR/<job>/ (cluster.sh's files) and DIR/results.md: per job the median step time
# of steps 2..STEPS on rank 0 (the first connects) and its ratio to DDP's.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
RATE=100mbit
STEPS=16
OUT="$HERE/out/overlap"
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: $0 [--rate R] [--steps N] [--out DIR]" >&2; exit 2 ;;
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
job ddp_adam ddp_adam ""
job onebit_off onebit_adam "--overlap off"
job onebit_on onebit_adam "--overlap on"
job onebit_on_rank onebit_adam "--overlap on --config $HERE/warmup_rank.json"
/usr/bin/python3 - "$OUT" "$RATE" "$STEPS" <<'PY'
import os, statistics, sys
out, rate, steps = sys.argv[1:]
def median_step(name):
    sub = next(d for d in os.listdir(os.path.join(out, name)) if os.path.isdir(os.path.join(out, name, d)))
    with open(os.path.join(out, name, sub, "steps.csv")) as f:
        next(f)
        dts = [float(line.split(",")[2]) for line in f]
    return statistics.median(dts[1:])
names = ["ddp_adam", "onebit_off", "onebit_on", "onebit_on_rank"]
m = {n: median_step(n) for n in names}
lines = [f"{rate}, {steps} steps per job (all warmup), median step of steps 2..{steps}, rank 0", "",
         "| job | median step (s) | vs DDP |", "|---|---:|---:|"]
lines += [f"| {n} | {m[n]:.2f} | {m[n] / m['ddp_adam']:.2f}x |" for n in names]
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
