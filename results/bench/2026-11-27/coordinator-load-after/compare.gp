set terminal pngcairo size 1000,420 font ",10"
set output "compare.png"
set datafile separator ","
set multiplot layout 1,2 title "One coordinator against N simulated members: before (bac6582) and now, -c opt, coordinator pinned to one core"
set logscale xy
set xlabel "members"
set grid
set key top left
set ylabel "p99 Lease latency (ms)"
set xrange [48:1400]
plot "before/results.csv" every ::1 using 1:4 with linespoints lw 2 title "before", \
     "results.csv" every ::1 using 1:4 with linespoints lw 2 title "now", \
     10 with lines dt 2 title "target 10 ms"
set ylabel "coordinator CPU (cores)"
unset logscale y
set yrange [0:1.1]
plot "before/results.csv" every ::1 using 1:11 with linespoints lw 2 title "before", \
     "results.csv" every ::1 using 1:11 with linespoints lw 2 title "now", \
     1 with lines dt 2 title "target 1 core"
unset multiplot
