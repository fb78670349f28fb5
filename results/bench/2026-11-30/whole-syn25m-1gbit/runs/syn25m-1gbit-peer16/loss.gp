set terminal pngcairo size 1100,450 font ',10'
set output '/tmp/whole25/runs/syn25m-1gbit-peer16/loss.png'
set datafile separator ','
set multiplot layout 1,2
set title 'training loss (worker 0, mean of 20 steps)'
set xlabel 'step'
set grid
set key top right
set arrow from 30, graph 0 to 30, graph 1 nohead dt 2 lc rgb 'gray'
set label 'switch to 1-bit' at 30, graph 0.95 offset 1,0
array w[20]
sm(x, n) = (w[int(n)%20+1] = x, n < 19 ? x : (sum [i=1:20] w[i]) / 20.0)
plot '/tmp/whole25/runs/syn25m-1gbit-peer16/onebit_adam/worker-0.csv' using 1:(stringcolumn(2) eq 'step' ? sm($4, $1) : 1/0) with lines lw 2 title '1-bit Adam'
unset arrow
unset label
set title 'test accuracy (worker 0)'
set key bottom right
set format y '%.1f%%'
plot '/tmp/whole25/runs/syn25m-1gbit-peer16/onebit_adam/worker-0.csv' using 1:(stringcolumn(2) eq 'eval' ? 100*$8 : 1/0) with linespoints lw 2 title '1-bit Adam'
unset multiplot
