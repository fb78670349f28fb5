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
# shellcheck source=../run_lib.sh
source "$HERE/../run_lib.sh"
example_setup
if [ -z "${PLOT_ONLY:-}" ]; then
  launch_onebit --result="$RESULTS/onebit.json"
  "$PY" "$HERE/ddp_adam.py" --config="$OUT/job.json" --result="$RESULTS/adam.json" \
    --loss_csv="$OUT/adam.csv" | tee "$OUT/adam.log"
fi
onebit_summary

ONEBIT_ACC="$(result_field "$RESULTS/onebit.json" test_accuracy %.2f 100)"
ADAM_ACC="$(result_field "$RESULTS/adam.json" test_accuracy %.2f 100)"
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
set title "Fashion-MNIST CNN, 4 workers x batch 32, training loss of rank 0\ntest accuracy 1-bit Adam $ONEBIT_ACC %, Adam over DDP $ADAM_ACC %"
$(loss_plot 0.98 0.02)
GP
echo "1-bit Adam: $ONEBIT_ACC % test accuracy; Adam over DDP: $ADAM_ACC %; plot: $RESULTS/loss.png"
