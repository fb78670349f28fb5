#!/bin/bash
# Trains the Fashion-MNIST CNN twice, with 1-bit Adam launched torchrun-style (onebit-run)
# and with Adam over DDP (same data, model, seed, steps), and plots both into
# results/fashion_mnist_cnn/loss.png (at the repository's top).
#
#   examples/fashion_mnist_cnn/run.sh            # the full run (a few minutes on 2 cores)
#   STEPS=60 examples/fashion_mnist_cnn/run.sh   # a smoke test: 60 steps, into out/smoke
#   PLOT_ONLY=1 examples/fashion_mnist_cnn/run.sh # redraw the last full run's plot
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY=/usr/bin/python3  # Debian's python3-torch (the pyenv python3 on PATH has no torch)
STEPS="${STEPS:-0}"
if [ "$STEPS" -gt 0 ]; then
  OUT="$HERE/out/smoke"; RESULTS="$OUT/results"
  OVERRIDE="$STEPS"
else
  OUT="$HERE/out/full"; RESULTS="$HERE/../../results/fashion_mnist_cnn"; OVERRIDE=0
fi
mkdir -p "$OUT" "$RESULTS"
# shellcheck source=../run_lib.sh
source "$HERE/../run_lib.sh"
if [ -z "${PLOT_ONLY:-}" ]; then
  launch_onebit --result="$RESULTS/onebit.json"
  "$PY" "$HERE/ddp_adam.py" --config="$OUT/job.json" --result="$RESULTS/adam.json" \
    --loss_csv="$OUT/adam.csv" | tee "$OUT/adam.log"
fi
onebit_summary

acc() { "$PY" -c "import json,sys; print('%.2f' % (100 * json.load(open(sys.argv[1]))['test_accuracy']))" "$1"; }
ONEBIT_ACC="$(acc "$RESULTS/onebit.json")"
ADAM_ACC="$(acc "$RESULTS/adam.json")"
FREEZE="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['optimizer']['params']['freeze_step'])" "$OUT/job.json")"
gnuplot <<GP
set terminal pngcairo size 900,540
set output "$RESULTS/loss.png"
set datafile separator ","
set key top right
set xlabel "step"
set ylabel "training loss, rank 0 (EMA, 0.98)"
set logscale y
set yrange [0.2:3]
set ytics (0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3)
set grid
set arrow 1 from $FREEZE, graph 0 to $FREEZE, graph 1 nohead dt 2 lc rgb "gray"
set label 1 "freeze_step" at $FREEZE, graph 0.04 offset 0.5,0 noenhanced
set title "Fashion-MNIST CNN, 4 workers x batch 32, training loss of rank 0\ntest accuracy 1-bit Adam $ONEBIT_ACC %, Adam over DDP $ADAM_ACC %"
ema(x) = (s = (n == 0 ? x : 0.98 * s + 0.02 * x), n = n + 1, s)
n = 0; s = 0
plot "$OUT/onebit_adam/worker-0.csv" every ::1 using 1:(ema(\$4)) with lines lw 2 title "1-bit Adam (onebit)", \
     n = 0, "$OUT/adam.csv" every ::1 using 1:(ema(\$2)) with lines lw 2 title "Adam over DDP (gloo)"
GP
echo "1-bit Adam: $ONEBIT_ACC % test accuracy; Adam over DDP: $ADAM_ACC %; plot: $RESULTS/loss.png"
