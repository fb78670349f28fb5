#!/bin/bash
# Trains the character-level transformer twice, with 1-bit Adam launched torchrun-style
# (onebit-run) and with Adam over DDP (same text, windows, model, seed, steps), and plots
# both into results/tiny_transformer_lm/loss.png at the repository's top (training loss of
# rank 0, held-out loss of rank 0's model).
#
#   examples/tiny_transformer_lm/run.sh              # the full run (~4 minutes on 2 cores)
#   STEPS=40 examples/tiny_transformer_lm/run.sh     # a smoke test: 40 steps, into out/smoke
#   PLOT_ONLY=1 examples/tiny_transformer_lm/run.sh  # redraw the last full run's plot
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../run_lib.sh
source "$HERE/../run_lib.sh"
example_setup
EVERY=()
if [ "$STEPS" -gt 0 ]; then
  EVERY=(--eval_every=10)
fi
if [ -z "${PLOT_ONLY:-}" ]; then
  launch_onebit "${EVERY[@]}" --result="$RESULTS/onebit.json" \
    --held_out_csv="$RESULTS/onebit_held_out.csv"
  "$PY" "$HERE/ddp_adam.py" --config="$OUT/job.json" --result="$RESULTS/adam.json" \
    --loss_csv="$OUT/adam.csv" --held_out_csv="$RESULTS/adam_held_out.csv" "${EVERY[@]}" \
    | tee "$OUT/adam.log"
fi
onebit_summary

ONEBIT_HO="$(result_field "$RESULTS/onebit.json" held_out_loss %.3f)"
ADAM_HO="$(result_field "$RESULTS/adam.json" held_out_loss %.3f)"
gnuplot <<GP
set terminal pngcairo size 1200,500
set output "$RESULTS/loss.png"
set datafile separator ","
set multiplot layout 1,2 title "char-level transformer (2 layers, d=64) on Debian's license texts, 2 workers x 16 x 64 chars\nfinal held-out loss: 1-bit Adam $ONEBIT_HO, Adam over DDP $ADAM_HO nats/char"
set grid
set xlabel "step"
set ylabel "training loss, rank 0 (nats/char, EMA 0.95)"
$(loss_plot 0.95 0.05)
set ylabel "held-out loss (nats/char)"
plot "$RESULTS/onebit_held_out.csv" every ::1 using 1:2 with linespoints lw 2 pt 7 ps 0.6 title "1-bit Adam (onebit)", \
     "$RESULTS/adam_held_out.csv" every ::1 using 1:2 with linespoints lw 2 pt 7 ps 0.6 title "Adam over DDP (gloo)"
unset multiplot
GP
echo "held-out loss: 1-bit Adam $ONEBIT_HO, Adam over DDP $ADAM_HO nats/char; plot: $RESULTS/loss.png"
