#!/usr/bin/env python3
"""The report of whole runs (tools/bench/run.sh --whole N): reads OUT/raw.jsonl and writes
OUT/whole.csv, OUT/whole.md and OUT/whole.png (gnuplot).

    python3 tools/bench/whole_report.py OUT [--workers 4]

For each run (a system on a workload at a rate) three times:
  launch to exit   what a user waits: the launcher (onebit) or the W DDP processes, from
                   start to the last exit (start-up, connections and the end included);
  steps            the first step's start to the last step's end, over all workers;
  composed         the run's own step medians times its step counts, stage by stage (the
                   first step of each stage left out of the median), as BENCHMARKS.md's
                   composed figures are made; "steps" over it says what composing misses.
Stages: onebit's warmup and compression; PowerSGD's plain allreduce before its start and
the compressed steps after; DDP and its 16-bit hooks have one.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import stage_step_s  # noqa: E402  the stage figures' one rule, shared with report.py

NAMES = {"adam": "onebit Adam", "peer": "1-bit Adam peer", "peer16": "1-bit Adam peer, bf16 warmup",
         "ps": "1-bit Adam ps, warmup through the shards", "psw": "1-bit Adam ps",
         "ddp": "DDP + Adam", "ddp16": "DDP + Adam, fp16 hook", "ddpbf16": "DDP + Adam, bf16 hook",
         "psgd": "DDP + Adam, powerSGD_hook (rank 4)",
         "bpsgd": "DDP + Adam, batched_powerSGD_hook (rank 4)"}


STAGE_ORDER = ("warmup", "allreduce", "compression", "compressed")


def name_of(system):
    base, _, deb = system.partition(":")
    return NAMES.get(base, base) + (" (Debian's torch)" if deb else "")


def onebit_run(rec, workers):
    stages, first_start, last_end = {}, float("inf"), 0.0
    for i in range(workers):
        with open(os.path.join(rec["dir"], f"worker-{i}.csv")) as f:
            for r in csv.DictReader(f):
                if r["kind"] != "step":
                    continue
                end, sec = float(r["unix_time"]), float(r["seconds"])
                first_start, last_end = min(first_start, end - sec), max(last_end, end)
                stages.setdefault(r["stage"], {}).setdefault(int(r["step"]), []).append(sec)
    counts = {st: len(t) for st, t in stages.items()}
    composed = sum(stage_step_s(t) * counts[st] for st, t in stages.items())
    return last_end - first_start, composed, counts, "-"


def ddp_run(rec, workers):
    ranks = [json.load(open(os.path.join(rec["dir"], f"rank-{i}.json"))) for i in range(workers)]
    first_start = min(r["step_end_unix"][0] - r["step_seconds"][0] for r in ranks)
    last_end = max(r["step_end_unix"][-1] for r in ranks)
    start = ranks[0].get("powersgd_start", 0) if ranks[0]["comm_hook"].endswith("powersgd") else 0
    stages = {}
    for r in ranks:
        for s, sec in enumerate(r["step_seconds"]):
            stage = "allreduce" if s < start or not start else "compressed"
            stages.setdefault(stage, {}).setdefault(s, []).append(sec)
    counts = {st: len(t) for st, t in stages.items()}
    composed = sum(stage_step_s(t) * counts[st] for st, t in stages.items())
    return last_end - first_start, composed, counts, ranks[0].get("torch", "?")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    recs = [json.loads(line) for line in open(os.path.join(a.out, "raw.jsonl")) if line.strip()]
    rows = []
    for rec in recs:
        if rec.get("kind") not in ("onebit", "ddp"):
            continue
        if not os.path.isdir(rec["dir"]) and "/runs/" in rec["dir"]:  # a copy of OUT elsewhere
            rec["dir"] = os.path.join(a.out, "runs", rec["dir"].split("/runs/", 1)[1])
        try:
            span, composed, counts, torch = (onebit_run if rec["kind"] == "onebit" else ddp_run)(
                rec, a.workers)
        except (OSError, ValueError, KeyError, IndexError, statistics.StatisticsError) as e:
            print(f"whole_report: {rec.get('system')} at {rec.get('rate')}: left out ({e})",
                  file=sys.stderr)
            continue
        rows.append({"workload": rec["workload"], "rate": rec["rate"], "system": rec["system"],
                     "name": name_of(rec["system"]), "torch": torch,
                     "steps": " + ".join(str(counts[k]) for k in STAGE_ORDER if k in counts),
                     "launch_to_exit_s": rec["wall"], "steps_s": span, "composed_s": composed})
    if not rows:
        sys.exit("whole_report: no run to report")
    with open(os.path.join(a.out, "whole.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = []
    for key in sorted({(r["workload"], r["rate"]) for r in rows}):
        group = [r for r in rows if (r["workload"], r["rate"]) == key]
        ddp = next((r for r in group if r["system"] == "ddp"), None)
        md += [f"### {key[0]} at {key[1]}", "",
               "| system | torch | steps (stages) | launch to exit | first step to last | "
               "composed from its step medians | steps / composed | faster than DDP: first "
               "step to last (composed) | faster than DDP: launch to exit |",
               "|---|---|---|---:|---:|---:|---:|---:|---:|"]

        def faster(key, r):
            return f"{ddp[key] / r[key]:.2f}x" if ddp else "-"
        for r in group:
            md.append(f"| {r['name']} | {r['torch']} | {r['steps']} | {r['launch_to_exit_s']:.1f} s | "
                      f"{r['steps_s']:.1f} s | {r['composed_s']:.1f} s | "
                      f"{r['steps_s'] / r['composed_s']:.2f} | {faster('steps_s', r)} "
                      f"({faster('composed_s', r)}) | {faster('launch_to_exit_s', r)} |")
        md.append("")
        data = os.path.join(a.out, f"whole-{key[0]}-{key[1]}.dat")
        with open(data, "w") as f:
            for r in group:
                f.write(f"\"{r['name']}\" {r['launch_to_exit_s']:.2f} {r['steps_s']:.2f} "
                        f"{r['composed_s']:.2f}\n")
        png = os.path.join(a.out, f"whole-{key[0]}-{key[1]}.png")
        plot = (f"set terminal pngcairo noenhanced size 1300,{300 + 40 * len(group)}; "
                f"set output '{png}'; set bmargin 16; set rmargin 30; "
                "set style data histograms; set style histogram clustered gap 1; "
                "set style fill solid 0.8 border -1; set boxwidth 0.9; set grid y; "
                "set xtics rotate by -25 left; set ylabel 'seconds'; set key top right; "
                f"set title 'Whole runs, {key[0]} at {key[1]}, {a.workers} nodes'; set yrange [0:*]; "
                f"plot '{data}' using 2:xtic(1) title 'measured: launch to exit', "
                "'' using 3 title 'measured: first step to last', "
                "'' using 4 title 'composed from its step medians'")
        if subprocess.run(["gnuplot", "-e", plot], capture_output=True).returncode != 0:
            print(f"whole_report: gnuplot failed for {png}", file=sys.stderr)
    with open(os.path.join(a.out, "whole.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
