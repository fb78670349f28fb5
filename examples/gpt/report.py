"""The table and the plot of an examples/gpt/cluster.sh run:

    report.py OUT       writes OUT/results.md and OUT/loss.png (gnuplot)

Per system: rank 0's final training loss (mean of the last 20 steps) and held-out loss,
the wall time of the training loop, its ratio to Adam over DDP's, the median step time per
stage, the bytes that left each node, and the time at which the system's smoothed training
loss first came within 2% of DDP's final one. For onebit's systems a second table splits
that time into warmup and compressed steps, each step into compute and the rest (from the
workers' history, history-rank0.csv, where the run kept it).
"""
import csv
import json
import os
import statistics
import subprocess
import sys

LABELS = {
    "ddp_adam": "Adam over DDP (gloo)",
    "ddp_fp16": "DDP + fp16 compression hook",
    "ddp_powersgd": "DDP + PowerSGD",
    "onebit_adam": "1-bit Adam (onebit)",
    "zero_one_adam": "0/1 Adam (onebit)",
}
SMOOTH = 20  # the loss curves: a running mean over this many steps


def read_steps(path):
    rows = []
    with open(path) as f:
        next(f)
        for line in f:
            step, seconds, dt, loss, stage = line.strip().split(",")
            rows.append((int(step), float(seconds), float(dt), float(loss), stage))
    return rows


def smoothed(rows):
    out, window = [], []
    for step, seconds, _, loss, _ in rows:
        window = (window + [loss])[-SMOOTH:]
        out.append((step, seconds, sum(window) / len(window)))
    return out


def bytes_sent(d):
    def read(name):
        with open(os.path.join(d, name)) as f:
            return {p[0]: int(p[1]) for p in (line.split() for line in f) if len(p) == 3}
    try:
        before, after = read("bytes_before.txt"), read("bytes_after.txt")
    except OSError:
        return None
    return max(after[k] - before[k] for k in after)


def settings(r):
    """What a system was run with beyond the shared hyper-parameters."""
    if r["optimizer"] in ("onebit_adam", "zero_one_adam"):
        text = (f"freeze_step {r['freeze_step']}, {r.get('warmup_dtype', 'fp32')} warmup, "
                f"overlap {r.get('overlap', 'off')}")
        if "local_step_scaler" in r:
            text += f", local steps from step {r['freeze_step'] + r['local_step_scaler']}"
        return text
    if r["optimizer"] == "ddp_powersgd":
        p = r.get("powersgd", {"rank": 4, "hook": "layerwise"})
        hook = {"layerwise": "torch's powerSGD_hook", "batched": "torch's batched_powerSGD_hook",
                "synchronous": "synchronous hook"}.get(p["hook"], f"{p['hook']} hook")
        return f"{hook}, rank {p['rank']}, from step {max(2, r['freeze_step'])}"
    return ""


def history_medians(path):
    """{stage: (median step s, median s waiting for the script)} of a worker's history CSV
    (ONEBIT_HISTORY_CSV), the first step of each stage left out; {} without the file."""
    if not os.path.exists(path):
        return {}
    stages = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["kind"] == "step":
                stages.setdefault(row["stage"], []).append(
                    (float(row["seconds"]), float(row["compute_seconds"] or 0)))
    return {k: (statistics.median(s for s, _ in v[1:]), statistics.median(c for _, c in v[1:]))
            for k, v in stages.items() if len(v) > 1}


def split_lines(out, systems, results, step_rows, curves, target):
    """Where each onebit system's time to DDP's final loss went: its full-precision warmup,
    its compressed steps up to the target, and each stage's step split into the time the
    worker waited for the script (forward, backward, the step's Python side: compute) and
    the rest (the exchange and the update), from rank 0's worker history."""
    onebit = [s for s in systems if s in ("onebit_adam", "zero_one_adam")]
    if target is None or not onebit:
        return []
    ddp_step = results["ddp_adam"]["median_step_s"]["all"]
    lines = ["", "Where onebit's time to DDP's final loss went (rank 0; the step medians "
             "leave out each stage's first step):", "",
             "| system | reached at step | warmup steps | warmup time | compressed steps | "
             "compressed time | warmup step: compute + rest (s) | compressed step: compute + "
             "rest (s) | warmup step against DDP's |",
             "|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for s in onebit:
        hit = next((st for st, _, loss in curves[s] if loss <= target), None)
        upto = [r for r in step_rows[s] if hit is None or r[0] <= hit]
        warm = [r[2] for r in upto if r[4] == "warmup"]
        comp = [r[2] for r in upto if r[4] != "warmup"]
        hist = history_medians(os.path.join(out, s, "history-rank0.csv"))

        def part(stage):
            if stage not in hist:
                return "-"
            step, compute = hist[stage]
            return f"{compute:.2f} + {step - compute:.2f}"
        med = results[s]["median_step_s"]
        lines.append(f"| {LABELS[s]} | {hit if hit else 'not reached'} | {len(warm)} | "
                     f"{sum(warm):.0f} s | {len(comp)} | {sum(comp):.0f} s | {part('warmup')} | "
                     f"{part('compression')} | {med.get('warmup', 0) / ddp_step:.2f}x |")
    return lines


def main():
    out = sys.argv[1]
    systems = [s for s in LABELS if os.path.exists(os.path.join(out, s, "result.json"))]
    if not systems:
        raise SystemExit(f"no results under {out}")
    results, step_rows, curves = {}, {}, {}
    for s in systems:
        with open(os.path.join(out, s, "result.json")) as f:
            results[s] = json.load(f)
        step_rows[s] = read_steps(os.path.join(out, s, "steps.csv"))
        curves[s] = smoothed(step_rows[s])
        with open(os.path.join(out, s, "smoothed.csv"), "w") as f:
            f.writelines(f"{step},{sec:.3f},{loss:.5f}\n" for step, sec, loss in curves[s])
    base = results.get("ddp_adam")
    target = base["train_loss_last20"] * 1.02 if base else None
    machine = open(os.path.join(out, "machine.txt")).read().strip() \
        if os.path.exists(os.path.join(out, "machine.txt")) else ""
    lines = [f"Run: {machine}", "",
             "| system | settings | train loss (last 20) | held-out loss | wall time | vs DDP | "
             "median step (s) | MB out per node | within 2% of DDP's final loss at |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for s in systems:
        r = results[s]
        steps = ", ".join(f"{k} {v:.2f}" for k, v in r["median_step_s"].items())
        sent = bytes_sent(os.path.join(out, s))
        reach = "-"
        if target is not None:
            hit = next(((st, sec) for st, sec, loss in curves[s] if loss <= target), None)
            reach = f"step {hit[0]}, {hit[1]:.0f} s" if hit else "not reached"
        ratio = f"{r['seconds'] / base['seconds']:.2f}x" if base else "-"
        lines.append(f"| {LABELS[s]} | {settings(r)} | {r['train_loss_last20']:.4f} | "
                     f"{r['held_out_loss']:.4f} | {r['seconds']:.0f} s | {ratio} | {steps} | "
                     f"{'-' if sent is None else f'{sent / 1e6:.0f}'} | {reach} |")
    lines += split_lines(out, systems, results, step_rows, curves, target)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    any_r = next(iter(results.values()))
    title = (f"GPT-style byte LM, {any_r['parameters'] / 1e6:.1f}M parameters, "
             f"{any_r['workers']} workers x {any_r['batch']} x {any_r['block']} bytes; "
             f"{machine.split(';')[0].split(' ', 2)[-1] if machine else ''}")
    plots_t = ", ".join(f'"{out}/{s}/smoothed.csv" using 2:3 with lines lw 2 title "{LABELS[s]}"'
                        for s in systems)
    plots_s = ", ".join(f'"{out}/{s}/smoothed.csv" using 1:3 with lines lw 2 title "{LABELS[s]}"'
                        for s in systems)
    script = f"""
set terminal pngcairo size 1400,560
set output "{out}/loss.png"
set datafile separator ","
set multiplot layout 1,2 title "{title}" noenhanced
set grid
set key top right noenhanced
set ylabel "training loss, rank 0 (nats/byte, mean of {SMOOTH} steps)"
set xlabel "wall-clock time (s)"
plot {plots_t}
set xlabel "step"
plot {plots_s}
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    print(f"wrote {out}/results.md and {out}/loss.png")


if __name__ == "__main__":
    main()
