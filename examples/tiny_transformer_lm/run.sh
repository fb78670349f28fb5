#!/bin/bash
# Trains the character-level transformer twice, with 1-bit Adam launched torchrun-style
# (onebit-run) and with Adam over DDP (same text, windows, model, seed, steps), and plots both into
# results/loss.png (training loss of rank 0, held-out loss of rank 0's model).
#
#   examples/tiny_transformer_lm/run.sh              # the full run (~4 minutes on 2 cores)
#   STEPS=40 examples/tiny_transformer_lm/run.sh     # a smoke test: 40 steps, into out/smoke
#   PLOT_ONLY=1 examples/tiny_transformer_lm/run.sh  # redraw the last full run's plot
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY=/usr/bin/python3  # Debian's python3-torch (the pyenv python3 on PATH has no torch)
STEPS="${STEPS:-0}"
if [ "$STEPS" -gt 0 ]; then
  OUT="$HERE/out/smoke"; RESULTS="$OUT/results"
  OVERRIDE="$STEPS"
  EVERY=(--eval_every=10)
else
  OUT="$HERE/out/full"; RESULTS="$HERE/results"; OVERRIDE=0; EVERY=()
fi
mkdir -p "$OUT" "$RESULTS"
cd "$ROOT"
if [ -z "${PLOT_ONLY:-}" ]; then
  # The run's job config: job.json, with the smoke test's steps (freeze at half) where asked.
  "$PY" - "$HERE/job.json" "$OUT/job.json" "$OVERRIDE" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
if int(sys.argv[3]) > 0:
    job["steps"] = int(sys.argv[3])
    job["optimizer"]["params"]["freeze_step"] = int(sys.argv[3]) // 2
json.dump(job, open(sys.argv[2], "w"), indent=1)
PY
  WORKERS="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['onebit']['workers'])" "$OUT/job.json")"
  # onebit's extension (the wheel's, when pip-installed, serves as well). The project
  # machines share a disk cache; a fresh machine builds without one.
  bazel build --disk_cache=/work/.bazel-disk-cache //python:_onebit_core.so 2>/dev/null ||
    bazel build //python:_onebit_core.so
  # As torchrun launches it (onebit-run is its stand-in on one machine): rank 0 runs the
  # job's coordinator; every rank's history CSV and summary go to OUT/onebit_adam.
  rm -rf "$OUT/onebit_adam" && mkdir -p "$OUT/onebit_adam"
  PYTHONPATH="$ROOT/python:$ROOT/bazel-bin/python${PYTHONPATH:+:$PYTHONPATH}" \
    ONEBIT_HISTORY_CSV="$OUT/onebit_adam/worker-{rank}.csv" \
    ONEBIT_SUMMARY_FILE="$OUT/onebit_adam/summary-{rank}.json" \
    "$PY" -m onebit.run --nproc_per_node="$WORKERS" --master_port=0 \
    "$HERE/train.py" --config="$OUT/job.json" "${EVERY[@]}" --result="$RESULTS/onebit.json" \
    --held_out_csv="$RESULTS/onebit_held_out.csv" | tee "$OUT/onebit.log"
  "$PY" "$HERE/ddp_adam.py" --config="$OUT/job.json" --result="$RESULTS/adam.json" \
    --loss_csv="$OUT/adam.csv" --held_out_csv="$RESULTS/adam_held_out.csv" "${EVERY[@]}" \
    | tee "$OUT/adam.log"
fi
# What the 1-bit Adam job sent (rank 0's worker summary): bytes per worker and stage.
"$PY" - "$OUT/onebit_adam/summary-0.json" > "$RESULTS/onebit_summary.txt" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("1-bit Adam, rank 0 of the job (its worker summary):")
for stage in ("warmup", "compression"):
    steps = s[f"{stage}_steps"]
    sent = s[f"bytes_sent_{stage}"]
    print(f"  {stage:<12} {steps:>5} steps x {sent / max(steps, 1) / 1e3:8.1f} kB sent per step")
w, c = s["bytes_sent_warmup"] / max(s["warmup_steps"], 1), \
    s["bytes_sent_compression"] / max(s["compression_steps"], 1)
if c:
    print(f"  compression stage: {w / c:.1f}x fewer bytes per step than the fp32 warmup")
PY
cat "$RESULTS/onebit_summary.txt"

field() { "$PY" -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
ONEBIT_HO="$(field "$RESULTS/onebit.json" held_out_loss)"
ADAM_HO="$(field "$RESULTS/adam.json" held_out_loss)"
FREEZE="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['optimizer']['params']['freeze_step'])" "$OUT/job.json")"
gnuplot <<GP
set terminal pngcairo size 1200,500
set output "$RESULTS/loss.png"
set datafile separator ","
set multiplot layout 1,2 title "char-level transformer (2 layers, d=64) on Debian's license texts, 2 workers x 16 x 64 chars\nfinal held-out loss: 1-bit Adam $ONEBIT_HO, Adam over DDP $ADAM_HO nats/char"
set grid
set xlabel "step"
set arrow 1 from $FREEZE, graph 0 to $FREEZE, graph 1 nohead dt 2 lc rgb "gray"
set label 1 "freeze_step" at $FREEZE, graph 0.04 offset 0.5,0 noenhanced
set ylabel "training loss, rank 0 (nats/char, EMA 0.95)"
ema(x) = (s = (n == 0 ? x : 0.95 * s + 0.05 * x), n = n + 1, s)
n = 0; s = 0
plot "$OUT/onebit_adam/worker-0.csv" every ::1 using 1:(ema(\$4)) with lines lw 2 title "1-bit Adam (onebit)", \
     n = 0, "$OUT/adam.csv" every ::1 using 1:(ema(\$2)) with lines lw 2 title "Adam over DDP (gloo)"
set ylabel "held-out loss (nats/char)"
plot "$RESULTS/onebit_held_out.csv" every ::1 using 1:2 with linespoints lw 2 pt 7 ps 0.6 title "1-bit Adam (onebit)", \
     "$RESULTS/adam_held_out.csv" every ::1 using 1:2 with linespoints lw 2 pt 7 ps 0.6 title "Adam over DDP (gloo)"
unset multiplot
GP
echo "held-out loss: 1-bit Adam $ONEBIT_HO, Adam over DDP $ADAM_HO nats/char; plot: $RESULTS/loss.png"
