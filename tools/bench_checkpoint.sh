#!/usr/bin/env bash
# What a checkpoint costs a training job: the pause of each worker's training thread (the
# host snapshot of its state; a writer thread then writes the part), the time that writer
# takes to write and report the part, a plain `dd ... conv=fsync` of the same number of
# bytes to the same disk in the same run (the least any durable write of the part could
# take), and the job's mean step time.
#
#   tools/bench_checkpoint.sh [PARAMS=5000000] [WORKERS=2] [MODE=peer] [STEPS=60] [EVERY=10] [ASYNC=false]
#
# Runs a synthetic job with a checkpoint every EVERY steps. Results: a Markdown table on
# stdout and in out/bench_checkpoint/results.md. Expects the binaries built (the script
# builds them with bazel when bazel is free).
set -euo pipefail
cd "$(dirname "$0")/.."
PARAMS=${1:-5000000}
WORKERS=${2:-2}
MODE=${3:-peer}
STEPS=${4:-60}
EVERY=${5:-10}
ASYNC=${6:-false}
OUT=out/bench_checkpoint
SERVERS=0
[ "$MODE" = ps ] && SERVERS=2
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  bazel build //deploy:onebit-launch //coordinator:onebit-coordinator //server:onebit-server \
    //worker:onebit-worker > /dev/null
fi
rm -rf "$OUT"
mkdir -p "$OUT"
CKPT=$(realpath "$OUT")/ckpt
cat > "$OUT/job.json" <<JSON
{
  "train_micro_batch_size_per_gpu": 16, "steps": $STEPS, "seed": 1,
  "optimizer": {"type": "OneBitAdam",
                "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "freeze_step": $((STEPS / 4))}},
  "onebit": {"workers": $WORKERS, "device": "cpu", "lease_steps": 10, "log_every": 1000,
             "exchange": {"mode": "$MODE", "servers": $SERVERS},
             "workload": {"type": "synthetic", "parameters": $PARAMS},
             "checkpoint": {"dir": "$CKPT", "every_steps": $EVERY, "keep": 100, "async": $ASYNC}}
}
JSON
bazel-bin/deploy/onebit-launch --config="$OUT/job.json" --out_dir="$OUT/run" --compare_adam=false \
  --echo_all=false --bin_dir="$(pwd)/bazel-bin" > "$OUT/launch.log" 2>&1

python3 - "$OUT" "$CKPT" "$WORKERS" "$PARAMS" "$MODE" "$ASYNC" <<'PY'
import csv, glob, os, re, subprocess, sys, time
out, ckpt, workers, params, mode, asynchronous = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
pauses, writes = [], []
for log in sorted(glob.glob(os.path.join(out, "run", "*", "worker-*.log"))):
    text = open(log).read()
    pauses += [float(m) for m in re.findall(r"checkpoint after step \d+: training paused ([\d.]+) ms", text)]
    writes += [float(m) for m in re.findall(r"written and reported in ([\d.]+) ms", text)]
steps = []
for path in sorted(glob.glob(os.path.join(out, "run", "*", "worker-*.csv"))):
    for row in csv.DictReader(open(path)):
        if row["kind"] == "step":
            steps.append(float(row["seconds"]) * 1e3)
parts = sorted(glob.glob(os.path.join(ckpt, "step-*", "worker-*.part")))
part_bytes = sum(os.path.getsize(p) for p in parts) / max(1, len(parts))
# Baseline in the same run: the same bytes written with fsync by dd, 5 times.
base = []
target = os.path.join(out, "baseline.bin")
for _ in range(5):
    t = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", "of=" + target, "bs=1M", "count=%d" % max(1, round(part_bytes / 2**20)),
                    "conv=fsync", "status=none"], check=True)
    base.append((time.monotonic() - t) * 1e3)
    os.remove(target)
med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
rows = [
    ("parameters, workers, mode, async", "%d, %d, %s, %s" % (params, workers, mode, asynchronous)),
    ("checkpoints taken (parts per worker)", "%d" % (len(pauses) // max(1, workers))),
    ("part size per worker", "%.1f MB" % (part_bytes / 1e6)),
    ("training-thread pause per checkpoint (median, min..max)", "%.1f ms (%.1f..%.1f)" % (med(pauses), min(pauses), max(pauses))),
    ("part written and reported by the writer thread (median, min..max)", "%.1f ms (%.1f..%.1f)" % (med(writes), min(writes), max(writes))),
    ("dd of the same bytes with fsync (median of 5, min..max)", "%.1f ms (%.1f..%.1f)" % (med(base), min(base), max(base))),
    ("pause / dd", "%.3f" % (med(pauses) / med(base))),
    ("write / dd", "%.2f" % (med(writes) / med(base))),
    ("mean step time without checkpoint", "%.1f ms" % (sum(steps) / len(steps))),
]
table = "| measure | value |\n|---|---|\n" + "\n".join("| %s | %s |" % r for r in rows)
open(os.path.join(out, "results.md"), "w").write(table + "\n")
print(table)
PY
