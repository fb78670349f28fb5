#!/usr/bin/env python3
"""The bench's report: reads OUT/raw.jsonl (tools/bench/run.sh) and writes OUT/results.csv,
OUT/results.md and one PNG per workload (OUT/<workload>.png, gnuplot).

    python3 tools/bench/report.py OUT [--workers 4]

Step time of a run: for each step the mean over workers of its wall time (onebit: the
history CSV's compute + exchange and update; DDP: forward, backward with its overlapped
allreduce, and Adam), without the run's first step; then the median over steps.

The bound of a configuration: its step if it took only
  - its wire bytes at the link rate: the larger of what the busiest node's eth0 sent and
    received per step (both directions are limited to the rate; a link with no limit adds
    nothing), plus
  - its kernels' fewest bytes at this machine's memcpy bandwidth: every worker's kernel
    bytes (they all run on this machine's cores) over the best memcpy bandwidth measured
    in the same run (one process, or one per core at once, whichever moved more).
Fewest kernel bytes per parameter and worker (4-byte floats, W workers; the counts of
kernels/cpu_kernels_benchmark.cc): the gradient reads p and writes g (8); warmup and Adam:
the sum of W runs of n/W (4 + 4/W) and the Adam update (read g, m, v, p, write m, v, p: 28);
compression: compress fused with the momentum update (5 floats and the signs, 20.125), the
aggregation of one chunk (W blocks, server error read/reread/written, result:
0.125 + 12/W + 0.125/W) and the decompress fused with the update (16.125). The MLP's
arithmetic (Fashion-MNIST) is not in the bound: it only counts bytes. A 0/1 Adam local step
sends nothing and its gradient is the workload's arithmetic, so its bound is per worker:
the step's measured gradient plus the fused local update's bytes (read g, v, m, p, acc,
write m, p, acc: 32 per parameter) at one process's memcpy bandwidth.

0/1 Adam (system zo): each kind of step is timed apart (medians): before var_freeze_step
"variance" (an exact allreduce) and "cgrad" (the gradient through the compressed
allreduce), after it "local" (nothing sent) and "sync". A run of ZO_RUN steps with
DeepSpeed's settings (ZeroOneSchedule's rules, config/zero_one_schedule.h) is then composed
from those times: ZO_RUN["var_freeze_step"] steps of the variance stage, the rest local
steps and syncs.
"""
import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys

RATE_BPS = {"100mbit": 100e6, "1gbit": 1e9, "10gbit": 10e9, "none": None}
RATE_X = {"100mbit": 0.1, "1gbit": 1.0, "10gbit": 10.0, "none": 100.0}  # Gbit/s on the plot
SYSTEM_NAME = {"adam": "onebit Adam", "peer": "1-bit Adam peer", "ps": "1-bit Adam ps",
               "psw": "1-bit Adam ps, warmup between the workers",
               "peer16": "1-bit Adam peer, bf16 warmup", "zo": "0/1 Adam peer",
               "ddp": "DDP + Adam", "ddp16": "DDP + Adam, fp16 hook"}
RATE_LABEL = {"100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", "10gbit": "10 Gbit/s", "none": "no limit"}
WARMUP_SHARE = 0.15
# The long 0/1 Adam run the report composes: 10,000 steps, var_freeze_step at 15% of them,
# DeepSpeed's var_update_scaler (16) and local_step_clipper (16), and local_step_scaler 100
# (DeepSpeed's 32,678 is for runs of hundreds of thousands of steps; 100 reaches the longest
# interval after 400 local steps, 5% of this run's).
ZO_RUN = {"steps": 10000, "var_freeze_step": 1500, "var_update_scaler": 16,
          "local_step_scaler": 100, "local_step_clipper": 16}


def zero_one_counts(steps, var_freeze_step, var_update_scaler, local_step_scaler,
                    local_step_clipper):
    """How many steps of each kind 0/1 Adam runs: ZeroOneSchedule::Next and Advance."""
    counts = {"variance": 0, "cgrad": 0, "local": 0, "sync": 0}
    var_interval, local_interval, var_updates, local_steps = 1, 1, 0, 0
    for t in range(1, steps + 1):
        if t <= var_freeze_step:
            if t % var_interval == 0:
                counts["variance"] += 1
                var_updates += 1
                if var_updates % var_update_scaler == 0:
                    var_interval *= 2
            else:
                counts["cgrad"] += 1
        else:
            counts["sync" if t % local_interval == 0 else "local"] += 1
            local_steps += 1
            if local_steps % local_step_scaler == 0:
                local_interval = min(local_interval * 2, local_step_clipper)
    return counts


def kernel_bytes_per_param(stage, w):
    grad = 8.0
    if stage == "warmup":
        return grad + 4.0 + 4.0 / w + 28.0
    if stage == "sync":
        return float("nan")  # not derived
    return grad + 20.125 + (0.125 + 12.0 / w + 0.125 / w) + 16.125


def whole_run_ms(warmup, compression):
    """A run's mean step with WARMUP_SHARE of it warmup, from the two stages' rows; NaN
    where either is missing."""
    if not warmup or not compression:
        return float("nan")
    return WARMUP_SHARE * warmup["step_ms"] + (1 - WARMUP_SHARE) * compression["step_ms"]


def ratio(x, y):
    """x / y as "1.23x", or "-" where either is missing (NaN) or y is 0."""
    return "-" if x != x or y != y or y == 0 else f"{x / y:.2f}x"


def pct(row):
    """A row's bound over its step as a percentage; '-' when unknown."""
    if not row or row["bound_over_step"] != row["bound_over_step"]:
        return "-"
    return f"{100 * row['bound_over_step']:.0f}%"


def median(xs):
    return statistics.median(xs) if xs else float("nan")


class Counters:
    """The sampler's link counters (tools/bench/sampler.py), interpolated in time."""

    def __init__(self, path):
        self.t, self.v, self.hwm = [], [], 0
        with open(path) as f:
            for line in f:
                x = line.split()
                if len(x) < 3:
                    continue
                self.t.append(float(x[0]))
                self.v.append([int(y) for y in x[1:-1]])
                self.hwm = max(self.hwm, int(x[-1]))
        if len(self.t) < 2:
            raise ValueError(f"{path}: fewer than 2 samples")

    def at(self, t):
        import bisect
        i = bisect.bisect_left(self.t, t)
        if i <= 0:
            return self.v[0]
        if i >= len(self.t):
            return self.v[-1]
        t0, t1 = self.t[i - 1], self.t[i]
        f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
        return [a + f * (b - a) for a, b in zip(self.v[i - 1], self.v[i])]

    def per_step(self, t_a, t_b, steps):
        """(tx per node, rx per node) per step between two times; NaN where the samples do
        not cover both times (the sampler starts late for a job whose steps are quick)."""
        if t_a < self.t[0] or t_b > self.t[-1]:
            n = len(self.v[0]) // 2
            return [float("nan")] * n, [float("nan")] * n
        a, b = self.at(t_a), self.at(t_b)
        d = [(y - x) / steps for x, y in zip(a, b)]
        return d[0::2], d[1::2]


def measured_steps(times, keep=None):
    """The steps of one stage that its figures use: all but the first (it sets up), of
    those the ones `keep` accepts (all by default). times: {step: [per worker]}."""
    steps = sorted(times)
    if len(steps) < 2:
        raise ValueError("a stage needs at least 2 steps (the first is not measured)")
    measured = [s for s in steps[1:] if keep is None or keep(s)]
    if not measured:
        raise ValueError("no step of the stage is kept")
    return measured


def stage_step_s(times, average=median, keep=None, measured=None):
    """A stage's step time (s): `average` of its measured steps' worker means (`measured`:
    those steps when the caller has them already)."""
    if measured is None:
        measured = measured_steps(times, keep)
    return average([statistics.mean(times[s]) for s in measured])


def stage_stats(times, ends, compute, average=median, keep=None):
    """times/ends/compute: {step: [per worker]}, the steps of one stage. Drops the first;
    of the rest keeps those `keep` accepts (all by default)."""
    steps = sorted(times)
    measured = measured_steps(times, keep)
    step = stage_step_s(times, average, measured=measured)
    comp = average([statistics.mean(compute[s]) for s in measured if compute.get(s)])
    t_a, t_b = statistics.mean(ends[steps[0]]), statistics.mean(ends[steps[-1]])
    return step, comp, t_a, t_b, len(measured)


def split_ms(rows, stage, steps):
    """Median over `steps` of the worker-mean compress/exchange/update split (ms), where the
    history CSV has it."""
    out = {}
    for part in ("compress", "exchange", "update"):
        per = {}
        for r in rows:
            if r["stage"] == stage and int(r["step"]) in steps and r.get(f"{part}_seconds"):
                per.setdefault(int(r["step"]), []).append(float(r[f"{part}_seconds"]))
        out[f"{part}_ms"] = 1e3 * median([statistics.mean(v) for v in per.values()])
    return out


def zero_one_kinds(rows, stage, times, ends, compute, sends_name, quiet_name, sends_much):
    """0/1 Adam's steps of one stage split by what they sent: {kind: stats as onebit_stages}."""
    sends = {}
    for r in rows:
        if r["stage"] == stage:
            sends.setdefault(int(r["step"]), []).append(float(r["bytes_sent"]))
    loud = {s for s, b in sends.items() if sends_much(max(b))}
    nan = float("nan")
    out = {}
    for name, keep in ((sends_name, lambda s: s in loud), (quiet_name, lambda s: s not in loud)):
        try:
            st = stage_stats(times, ends, compute, keep=keep)
        except ValueError:
            continue
        kept = {s for s in sorted(times)[1:] if keep(s)}
        out[name] = st + (0.0 if name == "local" else nan, nan, split_ms(rows, stage, kept))
    return out


def onebit_stages(rec, workers):
    """{stage: (step_s, compute_s, t_a, t_b, measured, sent/worker/step, received/worker/step)}"""
    rows = []
    for i in range(workers):
        with open(os.path.join(rec["dir"], f"worker-{i}.csv")) as f:
            rows += [r for r in csv.DictReader(f) if r["kind"] == "step"]
    summaries = [json.load(open(os.path.join(rec["dir"], f"worker-{i}.json")))
                 for i in range(workers)]
    out = {}
    for stage in ("warmup", "compression"):
        times, ends, compute = {}, {}, {}
        for r in rows:
            if r["stage"] != stage:
                continue
            s = int(r["step"])
            times.setdefault(s, []).append(float(r["seconds"]))
            ends.setdefault(s, []).append(float(r["unix_time"]))
            compute.setdefault(s, []).append(float(r["compute_seconds"]))
        if not times:
            continue
        sent = statistics.mean(x[f"bytes_sent_{stage}"] / max(1, x[f"{stage}_steps"]) for x in summaries)
        recv = statistics.mean(x[f"bytes_received_{stage}"] / max(1, x[f"{stage}_steps"])
                               for x in summaries)
        if rec["system"] == "zo":
            # Before var_freeze_step: variance updates send the fp32 gradient's ring share,
            # compressed steps ~N/8. After it: local steps send nothing, syncs do.
            kinds = ({"warmup": ("variance", "cgrad", lambda b: b > rec["params"]),
                      "compression": ("sync", "local", lambda b: b > 0)})[stage]
            out.update(zero_one_kinds(rows, stage, times, ends, compute, *kinds))
        if rec["system"] == "zo" and stage == "compression":
            st = stage_stats(times, ends, compute, average=statistics.mean)
        else:
            st = stage_stats(times, ends, compute)
        out[stage] = st + (sent, recv, split_ms(rows, stage, set(sorted(times)[1:])))
    return out


def ddp_stages(rec, workers):
    ranks = [json.load(open(os.path.join(rec["dir"], f"rank-{i}.json"))) for i in range(workers)]
    times, ends = {}, {}
    for r in ranks:
        for s, (sec, end) in enumerate(zip(r["step_seconds"], r["step_end_unix"])):
            times.setdefault(s, []).append(sec)
            ends.setdefault(s, []).append(end)
    step, _, t_a, t_b, measured = stage_stats(times, ends, {})
    # Forward, backward and Adam without the allreduce (model.no_sync), the last such step.
    comp = statistics.mean(r["compute_seconds"][-1] for r in ranks)
    nan = float("nan")
    return {"warmup": (step, comp, t_a, t_b, measured, nan, nan, {})}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    w = a.workers
    recs = [json.loads(line) for line in open(os.path.join(a.out, "raw.jsonl")) if line.strip()]
    mem = [r for r in recs if r["kind"] == "memcpy"]
    if not mem:
        sys.exit("report: no memcpy measurement in raw.jsonl")
    memcpy_gbps = max(max(r["single_gbps"], r["all_gbps"]) for r in mem)
    single_gbps = max(r["single_gbps"] for r in mem)

    rows = []
    for r in recs:
        if r["kind"] not in ("onebit", "ddp"):
            continue
        try:
            stages = (onebit_stages if r["kind"] == "onebit" else ddp_stages)(r, w)
            counters = Counters(r["sampler"])
        except (OSError, KeyError, ValueError, statistics.StatisticsError) as e:
            print(f"report: skipping {r.get('dir')}: {e}", file=sys.stderr)
            continue
        for stage, (step, comp, t_a, t_b, measured, sent, recv, split) in stages.items():
            if stage in ("local", "sync", "variance", "cgrad"):  # interleaved: no wire bytes
                tx = rx = [float("nan")]
            else:
                tx, rx = counters.per_step(t_a, t_b, measured)
            busiest = max(max(tx), max(rx))
            rate = RATE_BPS[r["rate"]]
            wire_s = busiest * 8 / rate if rate else 0.0  # no limit: no wire term
            if stage == "local":
                wire_s = 0.0  # nothing is sent
            kern_s = w * kernel_bytes_per_param(stage, w) * r["params"] / (memcpy_gbps * 1e9)
            if stage == "local":  # per worker: its gradient as measured, its update's bytes
                kern_s = comp + 32.0 * r["params"] / (single_gbps * 1e9)
            bound = wire_s + kern_s
            rows.append({
                "workload": r["workload"], "params": r["params"], "rate": r["rate"],
                "system": r["system"], "stage": stage, "steps_measured": measured,
                "step_ms": 1e3 * step, "compute_ms": 1e3 * comp,
                "payload_sent_per_worker_step": sent, "payload_received_per_worker_step": recv,
                "wire_tx_per_node_step": statistics.mean(tx),
                "wire_rx_per_node_step": statistics.mean(rx),
                "wire_busiest_per_step": busiest, "bound_wire_ms": 1e3 * wire_s,
                "bound_kernels_ms": 1e3 * kern_s, "bound_ms": 1e3 * bound,
                "bound_over_step": bound / step if step > 0 else float("nan"),
                "shard_peak_rss_mb": counters.hwm / 1024.0,
                "load": r["uptime"], "wall_s": r["wall"],
                "compress_ms": split.get("compress_ms", float("nan")),
                "exchange_ms": split.get("exchange_ms", float("nan")),
                "update_ms": split.get("update_ms", float("nan")),
            })

    fields = list(rows[0].keys()) if rows else []
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        for row in rows:
            wr.writerow(row)

    def get(wl, rate, system, stage):
        for row in rows:
            if (row["workload"], row["rate"], row["system"], row["stage"]) == (wl, rate, system, stage):
                return row
        return None

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    rates = [x for x in RATE_BPS if any(r["rate"] == x for r in rows)]
    md = []
    md.append(f"memcpy bandwidth (best of the run's measurements, the bound's baseline): "
              f"{memcpy_gbps:.2f} GB/s; all measurements: " +
              ", ".join(f"{m['label']}: {m['single_gbps']:.2f} (1 process) / {m['all_gbps']:.2f} "
                        f"({m['procs']} at once), load {m['uptime']}" for m in mem))
    ps_systems = ("ps", "psw")
    placements = sorted({r.get("shards", "separate") for r in recs if r.get("system") in ps_systems})
    per_node = sorted({int(r.get("shards_per_node", 1)) for r in recs
                       if r.get("system") in ps_systems})
    if placements:
        md.append("")
        md.append("ps shards: " + ", ".join(
            {"separate": "separate (on the control host, whose link is not limited)",
             "colocated": "colocated (shard i on worker i's node, behind its limited link)"}
            .get(p, p) for p in placements) +
            "".join(f"; {n} shards per node" for n in per_node if n > 1))
    md.append("")
    md.append("| workload | link | system | stage | step | gradient | payload sent/worker/step | "
              "wire out/node/step | bound (wire + kernels) | bound / step | load (1/5/15 min) |")
    md.append("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")

    def mb(x):
        return "-" if x != x else (f"{x / 1e6:.2f} MB" if x >= 1e6 else f"{x / 1e3:.1f} kB")

    def ms(x):
        return "-" if x != x else (f"{x / 1e3:.2f} s" if x >= 1e4 else f"{x:.1f} ms")

    for wl in workloads:
        for rate in rates:
            for system, stage in [("adam", "warmup"), ("peer", "warmup"), ("peer", "compression"),
                                  ("peer16", "warmup"), ("peer16", "compression"),
                                  ("ps", "warmup"), ("ps", "compression"), ("psw", "warmup"),
                                  ("psw", "compression"), ("zo", "variance"),
                                  ("zo", "cgrad"), ("zo", "local"), ("zo", "sync"),
                                  ("ddp", "warmup"), ("ddp16", "warmup")]:
                row = get(wl, rate, system, stage)
                if row is None:
                    continue
                name = SYSTEM_NAME[system]
                st = stage if system not in ("adam", "ddp", "ddp16") else "(every step)"
                md.append(f"| {wl} | {RATE_LABEL[rate]} | {name} | {st} | {ms(row['step_ms'])} | "
                          f"{ms(row['compute_ms'])} | {mb(row['payload_sent_per_worker_step'])} | "
                          f"{mb(row['wire_tx_per_node_step'])} | {ms(row['bound_ms'])} "
                          f"({ms(row['bound_wire_ms'])} + {ms(row['bound_kernels_ms'])}) | "
                          f"{pct(row)} | {row['load']} |")
    md.append("")
    md.append(f"End to end with {100 * WARMUP_SHARE:.0f}% warmup (computed from the measured "
              f"per-stage step times: {WARMUP_SHARE} x warmup step + {1 - WARMUP_SHARE:.2f} x "
              "compression step; Adam and DDP have one stage), per step, and DDP's over it:")
    md.append("")
    md.append("| workload | link | DDP | onebit Adam | 1-bit peer | 1-bit ps | peer vs DDP | ps vs DDP | "
              "peer warmup / DDP | ps warmup / DDP | ps warmup / peer warmup | compression bound/step (peer, ps) |")
    md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    e2e_rows = []
    for wl in workloads:
        for rate in rates:
            ddp = get(wl, rate, "ddp", "warmup")
            adam = get(wl, rate, "adam", "warmup")
            if not any(r["workload"] == wl and r["rate"] == rate for r in rows):
                continue
            e2e = {}
            for system in ("peer", "ps"):
                wu, co = get(wl, rate, system, "warmup"), get(wl, rate, system, "compression")
                e2e[system] = whole_run_ms(wu, co)
            d = ddp["step_ms"] if ddp else float("nan")


            pw = get(wl, rate, "peer", "warmup")
            sw = get(wl, rate, "ps", "warmup")
            pc = get(wl, rate, "peer", "compression")
            sc = get(wl, rate, "ps", "compression")
            nan = float("nan")
            md.append(
                f"| {wl} | {RATE_LABEL[rate]} | {ms(d)} | {ms(adam['step_ms'] if adam else nan)} | "
                f"{ms(e2e['peer'])} | {ms(e2e['ps'])} | {ratio(d, e2e['peer'])} | {ratio(d, e2e['ps'])} | "
                f"{ratio(pw['step_ms'] if pw else nan, d)} | {ratio(sw['step_ms'] if sw else nan, d)} | "
                f"{ratio(sw['step_ms'] if sw else nan, pw['step_ms'] if pw else nan)} | "
                f"{pct(pc)}, {pct(sc)} |")
            e2e_rows.append((wl, rate, d, e2e["peer"], e2e["ps"], adam["step_ms"] if adam else nan))
    whole = [(wl, rate) for wl in workloads for rate in rates
             if get(wl, rate, "peer16", "warmup") and get(wl, rate, "peer16", "compression")]
    if whole:
        md.append("")
        md.append(f"Whole run with the warmup's exchange in bf16, {100 * WARMUP_SHARE:.0f}% warmup "
                  f"({WARMUP_SHARE} x warmup step + {1 - WARMUP_SHARE:.2f} x compression step), "
                  "against DDP and DDP with its fp16 compression hook (one stage each):")
        md.append("")
        md.append("| workload | link | bf16 warmup step | compression step | whole run, per step | "
                  "DDP | DDP fp16 hook | vs DDP | vs DDP fp16 |")
        md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        nan = float("nan")
        for wl, rate in whole:
            wu, co = get(wl, rate, "peer16", "warmup"), get(wl, rate, "peer16", "compression")
            run = whole_run_ms(wu, co)
            d = (get(wl, rate, "ddp", "warmup") or {}).get("step_ms", nan)
            d16 = (get(wl, rate, "ddp16", "warmup") or {}).get("step_ms", nan)

            def vs(x):
                return "-" if x != x else f"{x / run:.1f}x"
            md.append(f"| {wl} | {RATE_LABEL[rate]} | {ms(wu['step_ms'])} | {ms(co['step_ms'])} | "
                      f"{ms(run)} | {ms(d)} | {ms(d16)} | {vs(d)} | {vs(d16)} |")
    zo_keys = sorted({(r["workload"], r["rate"]) for r in rows if r["system"] == "zo"},
                     key=lambda k: (workloads.index(k[0]), rates.index(k[1])))
    if zo_keys:
        md.append("")
        counts = zero_one_counts(**ZO_RUN)
        md.append("0/1 Adam: its local steps (nothing sent) against their bound (the step's "
                  "measured gradient and the fused local update's bytes at one process's memcpy "
                  f"bandwidth, {single_gbps:.1f} GB/s), and a "
                  f"run of {ZO_RUN['steps']:,} steps composed from the measured step of each kind "
                  f"(var_freeze_step {ZO_RUN['var_freeze_step']:,}, var_update_scaler "
                  f"{ZO_RUN['var_update_scaler']}, local_step_scaler {ZO_RUN['local_step_scaler']}, "
                  f"local_step_clipper {ZO_RUN['local_step_clipper']}: "
                  + ", ".join(f"{v:,} {k}" for k, v in counts.items()) + ") against DDP:")
        md.append("")
        md.append("| workload | link | local step | gradient | update | bound | bound / local | "
                  "sync | variance | cgrad | composed run, per step | DDP | vs DDP |")
        md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        nan = float("nan")
        for wl, rate in zo_keys:
            kind = {k: get(wl, rate, "zo", k) for k in counts}
            lo = kind["local"]
            ddp = get(wl, rate, "ddp", "warmup")
            run = (sum(counts[k] * kind[k]["step_ms"] for k in counts) / ZO_RUN["steps"]
                   if all(kind[k] for k in counts if counts[k]) else nan)
            d = ddp["step_ms"] if ddp else nan
            vs = "-" if d != d or run != run else f"{d / run:.1f}x"

            def at(k, field="step_ms"):
                return ms(kind[k][field]) if kind[k] else "-"
            md.append(
                f"| {wl} | {RATE_LABEL[rate]} | {at('local')} | {at('local', 'compute_ms')} | "
                f"{at('local', 'update_ms')} | {at('local', 'bound_ms')} | {pct(lo)} | "
                f"{at('sync')} | {at('variance')} | {at('cgrad')} | {ms(run)} | {ms(d)} | {vs} |")
    psw_keys = [(wl, rate) for wl in workloads for rate in rates if get(wl, rate, "psw", "warmup")]
    if psw_keys:
        md.append("")
        md.append("ps with the warmup between the workers (psw: onebit.exchange.warmup_over "
                  "workers) against the shards' warmup (ps), the peer warmup and DDP:")
        md.append("")
        md.append("| workload | link | psw warmup | ps warmup | peer warmup | DDP | psw / DDP | "
                  "ps / DDP | psw compression | ps compression |")
        md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        nan = float("nan")
        for wl, rate in psw_keys:
            def at(system, stage):
                row = get(wl, rate, system, stage)
                return row["step_ms"] if row else nan

            d = at("ddp", "warmup")
            md.append(f"| {wl} | {RATE_LABEL[rate]} | {ms(at('psw', 'warmup'))} | "
                      f"{ms(at('ps', 'warmup'))} | {ms(at('peer', 'warmup'))} | {ms(d)} | "
                      f"{ratio(at('psw', 'warmup'), d)} | {ratio(at('ps', 'warmup'), d)} | "
                      f"{ms(at('psw', 'compression'))} | {ms(at('ps', 'compression'))} |")
    ps_rows = [r for r in rows if r["system"] in ps_systems]
    if ps_rows:
        md.append("")
        md.append("ps mode: the largest peak resident memory (VmHWM) of a shard process, and the "
                  "fp32 chunk it serves (n/4 floats):")
        md.append("")
        md.append("| workload | link | system | stage | shard peak RSS | chunk |")
        md.append("|---|---|---|---|---:|---:|")
        for r in ps_rows:
            md.append(f"| {r['workload']} | {RATE_LABEL[r['rate']]} | {r['system']} | {r['stage']} | "
                      f"{r['shard_peak_rss_mb']:.0f} MB | {r['params'] / w * 4 / 2**20:.0f} MB |")
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))

    # Plots: per workload, three panels against the link rate (log-log), for the 1-bit
    # Adam runs (a run of only 0/1 Adam and DDP has its tables above and no plot).
    for wl in workloads:
        dat = os.path.join(a.out, f"{wl}.dat")
        cols = [("adam", "warmup"), ("peer", "warmup"), ("peer", "compression"), ("ps", "warmup"),
                ("ps", "compression"), ("ddp", "warmup"), ("psw", "warmup"), ("psw", "compression")]
        if not any(get(wl, rate, s, "compression") for rate in rates for s in ("peer", "ps")):
            continue
        with open(dat, "w") as f:
            f.write("# x_gbit " + " ".join(f"{s}_{t}_step {s}_{t}_bound" for s, t in cols) +
                    " e2e_ddp e2e_peer e2e_ps e2e_psw\n")
            for rate in rates:
                vals = [RATE_X[rate]]
                for s, t in cols:
                    row = get(wl, rate, s, t)
                    vals += [row["step_ms"] / 1e3, row["bound_ms"] / 1e3] if row else [math.nan, math.nan]
                e = next((x for x in e2e_rows if x[0] == wl and x[1] == rate), None)
                if e is None:
                    continue
                wu, co = get(wl, rate, "psw", "warmup"), get(wl, rate, "psw", "compression")
                e2e_psw = whole_run_ms(wu, co)
                vals += [e[2] / 1e3, e[3] / 1e3, e[4] / 1e3, e2e_psw / 1e3]
                f.write(" ".join("NaN" if v != v else f"{v:.6g}" for v in vals) + "\n")
        # column of (system, stage) step: 2 + 2*i, bound: 3 + 2*i
        c = {k: 2 + 2 * i for i, k in enumerate(cols)}
        png = os.path.join(a.out, f"{wl}.png")
        gp = os.path.join(a.out, f"{wl}.gp")
        xt = "set xtics (" + ", ".join(f"'{RATE_LABEL[r]}' {RATE_X[r]}" for r in rates) + ")"

        def line(key, title, color, dash=1, bound=False, point=7):
            col = c[key] + (1 if bound else 0)
            style = (f"with lines dt 2 lw 1.5 lc rgb '{color}'" if bound
                     else f"with linespoints lw 2 pt {point} lc rgb '{color}'")
            return f"'{dat}' using 1:{col} {style} title '{title}'"

        # ps with the warmup between the workers, where the run has it.
        psw = any(get(wl, rate, "psw", "warmup") for rate in rates)
        psw_warmup = (f", \\\n     {line(('psw', 'warmup'), '1-bit Adam warmup, ps (psw)', '#9467bd', point=9)}"
                      if psw else "")
        psw_e2e = (f", \\\n     '{dat}' using 1:{5 + 2 * len(cols)} with linespoints lw 2 pt 9 lc rgb '#9467bd' title '1-bit Adam, ps (psw)'"
                   if psw else "")
        psw_compression = (f", \\\n     {line(('psw', 'compression'), '1-bit Adam compression, ps (psw)', '#9467bd', point=9)}"
                           if psw else "")

        with open(gp, "w") as f:
            f.write(f"""set terminal pngcairo size 1500,500 font ',10'
set output '{png}'
set multiplot layout 1,3 title '{wl}: step time against the link rate, 4 nodes (dashed: the bound, wire bytes at the link rate + kernel bytes at memcpy speed)'
set logscale xy
set grid
{xt}
set xrange [0.07:140]
set xlabel 'link rate per node'
set ylabel 'seconds per step'
set key top right font ',9'
set title 'full-precision steps (warmup)'
plot {line(('ddp', 'warmup'), 'DDP + Adam (gloo)', '#d62728')}, \\
     {line(('adam', 'warmup'), 'onebit Adam', '#7f7f7f')}, \\
     {line(('peer', 'warmup'), '1-bit Adam warmup, peer', '#1f77b4')}, \\
     {line(('ps', 'warmup'), '1-bit Adam warmup, ps', '#2ca02c', point=5)}, \\
     {line(('ddp', 'warmup'), 'bound: DDP', '#d62728', bound=True)}, \\
     {line(('peer', 'warmup'), 'bound: peer warmup', '#1f77b4', bound=True)}, \\
     {line(('ps', 'warmup'), 'bound: ps warmup', '#2ca02c', bound=True)}{psw_warmup}
set title 'compression stage'
plot {line(('peer', 'compression'), '1-bit Adam compression, peer', '#1f77b4')}, \\
     {line(('ps', 'compression'), '1-bit Adam compression, ps', '#2ca02c', point=5)}, \\
     {line(('peer', 'compression'), 'bound: peer', '#1f77b4', bound=True)}, \\
     {line(('ps', 'compression'), 'bound: ps', '#2ca02c', bound=True)}{psw_compression}
set title 'end to end, {100 * WARMUP_SHARE:.0f}% warmup (from the measured stage steps)'
set ylabel 'mean seconds per step'
plot '{dat}' using 1:{2 + 2 * len(cols)} with linespoints lw 2 pt 7 lc rgb '#d62728' title 'DDP + Adam', \\
     '{dat}' using 1:{3 + 2 * len(cols)} with linespoints lw 2 pt 7 lc rgb '#1f77b4' title '1-bit Adam, peer', \\
     '{dat}' using 1:{4 + 2 * len(cols)} with linespoints lw 2 pt 5 lc rgb '#2ca02c' title '1-bit Adam, ps'{psw_e2e}
unset multiplot
""")
        res = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
        if res.returncode != 0:
            print(f"report: gnuplot failed for {wl}: {res.stderr}", file=sys.stderr)
        else:
            print(f"plot: {png}")


if __name__ == "__main__":
    main()
