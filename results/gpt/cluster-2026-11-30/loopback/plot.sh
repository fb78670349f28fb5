#!/usr/bin/env bash
# Redraws loss.png from the runs' CSVs: rank 0's training loss, the mean of 20 steps, per step.
set -euo pipefail
cd "$(dirname "$0")"
runs="ddp400 ob_f60_s520 ob_f80_s520 ob_f100_s520 zo_nolocal_s520"  # ob_auto_s520 is Adam throughout
titles=("Adam over DDP, 400 steps" "1-bit Adam, freeze 60" "1-bit Adam, freeze 80" "1-bit Adam, freeze 100" "0/1 Adam, no local steps")
plots="" i=0
for r in $runs; do
  awk -F, 'NR > 1 { w[NR % 20] = $4; n = (NR - 1 < 20 ? NR - 1 : 20); s = 0; for (k in w) s += w[k]; print $1 "," s / n }' "$r.csv" > "/tmp/loopback-$r.sm"
  plots+="${plots:+, }\"/tmp/loopback-$r.sm\" using 1:2 with lines lw 2 title \"${titles[$i]}\""
  i=$((i + 1))
done
gnuplot <<GP
set terminal pngcairo size 1000,600
set output "loss.png"
set datafile separator ","
set title "GPT example on loopback (torch 2.15): where the freeze step puts 1-bit Adam" noenhanced
set grid
set linetype 5 lc rgb "#c00000"
set xlabel "step"
set ylabel "training loss, rank 0 (mean of 20 steps)"
set yrange [2:3.2]
set xrange [40:520]
set arrow from 40,2.1197 to 520,2.1197 nohead dt 2 lc rgb "black"
set label "DDP's final loss + 2%" at 45,2.105
plot $plots
GP
