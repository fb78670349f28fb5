#!/usr/bin/env python3
"""Step time against the number of nodes W, from several runs of tools/bench/run.sh that
differ only in --nodes:

    python3 tools/bench/width_plot.py OUT.png DIR4:4 DIR8:8 DIR16:16 DIR32:32

Each DIR is a run's --out folder (its results.csv), W its --nodes. Prints a Markdown table
(per W: DDP's step, peer warmup and compression steps, the compression bound and what the
busiest link carried) and draws OUT.png with gnuplot: step time against W (log-log), the
compression step against its bound.
"""
import csv
import os
import subprocess
import sys


def rows_of(folder):
    with open(os.path.join(folder, "results.csv")) as f:
        return list(csv.DictReader(f))


def pick(rows, system, stage):
    for r in rows:
        if r["system"] == system and r["stage"] == stage:
            return r
    return None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    png = sys.argv[1]
    points = []
    for arg in sys.argv[2:]:
        folder, w = arg.rsplit(":", 1)
        rows = rows_of(folder)
        ddp, warm, comp = (pick(rows, "ddp", "warmup"), pick(rows, "peer", "warmup"),
                           pick(rows, "peer", "compression"))
        if not (ddp and warm and comp):
            sys.exit(f"width_plot: {folder} lacks the ddp or peer rows")
        points.append((int(w), ddp, warm, comp))
    points.sort(key=lambda p: p[0])

    def ms(row, key="step_ms"):
        return float(row[key])

    print("| W | DDP + Adam step | peer warmup | peer compression | compression bound "
          "(wire + kernels) | bound / step | wire out per node, compression | DDP / compression |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w, ddp, warm, comp in points:
        print(f"| {w} | {ms(ddp):.0f} ms | {ms(warm):.0f} ms | {ms(comp):.1f} ms | "
              f"{ms(comp, 'bound_ms'):.1f} ms ({ms(comp, 'bound_wire_ms'):.1f} + "
              f"{ms(comp, 'bound_kernels_ms'):.1f}) | {100 * float(comp['bound_over_step']):.0f}% | "
              f"{float(comp['wire_tx_per_node_step']) / 1e6:.2f} MB | "
              f"{ms(ddp) / ms(comp):.1f}x |")

    dat = os.path.splitext(png)[0] + ".dat"
    with open(dat, "w") as f:
        f.write("# W ddp peer_warmup peer_compression compression_bound compression_wire\n")
        for w, ddp, warm, comp in points:
            f.write(f"{w} {ms(ddp) / 1e3} {ms(warm) / 1e3} {ms(comp) / 1e3} "
                    f"{ms(comp, 'bound_ms') / 1e3} {ms(comp, 'bound_wire_ms') / 1e3}\n")
    script = f"""set terminal pngcairo size 900,560 font ',11'
set output '{png}'
set title 'Step time against the number of nodes W (one worker each; 100 Mbit/s links)'
set logscale xy 2
set xtics ({", ".join(str(p[0]) for p in points)})
set grid
set key left center
set xlabel 'nodes W'
set ylabel 'seconds per step'
plot '{dat}' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'DDP + Adam', \\
     '{dat}' using 1:3 with linespoints lw 2 pt 5 lc rgb '#ff7f0e' title '1-bit Adam peer, warmup', \\
     '{dat}' using 1:4 with linespoints lw 2 pt 9 lc rgb '#1f77b4' title '1-bit Adam peer, compression', \\
     '{dat}' using 1:5 with lines dt 2 lw 1.5 lc rgb '#1f77b4' title 'compression bound (wire + kernels)', \\
     '{dat}' using 1:6 with lines dt 3 lw 1.5 lc rgb '#7f7f7f' title 'compression: wire alone'
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"\nplot: {png}")


if __name__ == "__main__":
    main()
