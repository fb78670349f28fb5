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
ROOT="$(cd "$HERE/../.." && pwd)"
PY=/usr/bin/python3  # Debian's python3-torch (the pyenv python3 on PATH has no torch)
STEPS="${STEPS:-0}"
if [ "$STEPS" -gt 0 ]; then
  OUT="$HERE/out/smoke"; RESULTS="$OUT/results"
  OVERRIDE="$STEPS"
  EVERY=(--eval_every=10)
else
  OUT="$HERE/out/full"; RESULTS="$HERE/../../results/tiny_transformer_lm"; OVERRIDE=0; EVERY=()
fi
mkdir -p "$OUT" "$RESULTS"
# shellcheck source=../run_lib.sh
source "$HERE/../run_lib.sh"
if [ -z "${PLOT_ONLY:-}" ]; then
  launch_onebit "${EVERY[@]}" --result="$RESULTS/onebit.json" \
    --held_out_csv="$RESULTS/onebit_held_out.csv"
  "$PY" "$HERE/ddp_adam.py" --config="$OUT/job.json" --result="$RESULTS/adam.json" \
    --loss_csv="$OUT/adam.csv" --held_out_csv="$RESULTS/adam_held_out.csv" "${EVERY[@]}" \
    | tee "$OUT/adam.log"
fi
onebit_summary

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
