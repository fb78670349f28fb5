#!/usr/bin/env python3
"""Will onebit help my job? The step-time model of docs/will-it-help.md.

    tools/will_it_help.py --params 1.3e9 --nodes 8 --link 10gbit --compute 0.9
    tools/will_it_help.py --check results/bench/2026-11-24/results.csv

A data-parallel step is compute, then the exchange of the gradient over each node's link.
With N parameters, W nodes and R bytes per second per node:

    DDP (fp32 ring allreduce):   C + 2 (W-1)/W * 4 N / R
    1-bit Adam, warmup steps:    the same (full precision)
    1-bit Adam, compressed:      C + 2 (W-1)/W * N/8 / R    (1 bit per element, 32x less)

A run with a fraction f of warmup steps takes f * DDP + (1 - f) * compressed per step.
C is the compute of one step on one node: forward, backward and the optimizer.

--check reads a recorded bench run (its results.csv) and compares the model's whole-run
ratio with the measured one, row by row, for the links that bound the step.
"""
import argparse
import csv
import sys

RATES = {"mbit": 1e6 / 8, "gbit": 1e9 / 8}


def parse_rate(text):
    """'100mbit' or '10gbit' to bytes per second."""
    for unit, scale in RATES.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"link rate {text!r}: write it as 100mbit or 10gbit")


def ring_bytes(params, nodes, bytes_per_element):
    """Bytes each node sends for one ring allreduce (reduce-scatter, then all-gather)."""
    return 2 * (nodes - 1) / nodes * params * bytes_per_element


def predict(params, nodes, rate, compute, warmup=0.15):
    """Seconds per step for DDP, 1-bit Adam's compressed step, and the whole-run ratio."""
    ddp = compute + ring_bytes(params, nodes, 4) / rate
    compressed = compute + ring_bytes(params, nodes, 1 / 8) / rate
    run = warmup * ddp + (1 - warmup) * compressed
    return {"ddp_s": ddp, "compressed_s": compressed, "whole_run": ddp / run,
            "compute_share": compute / ddp}


def verdict(ratio):
    if ratio >= 2:
        return "yes: the network bounds the step; onebit pays"
    if ratio >= 1.2:
        return "somewhat: compute and the network share the step"
    return "no: compute bounds the step; use DDP"


def check(path, warmup, tolerance):
    """Model against a recorded run: the peer mode and DDP rows of the link-bound rates.

    A row passes when the model promises at most 10% more than was measured and, at
    100 Mbit/s, falls short of it by at most `tolerance`. At 1 Gbit/s on a small machine,
    DDP's ring runs below its wire bound (its CPU work counts), so the model only has to
    stay under the measured ratio there.
    """
    rows = list(csv.DictReader(open(path)))
    key = lambda r: (r["workload"], r["rate"])
    ddp = {key(r): r for r in rows if r["system"] == "ddp"}
    peer = {(key(r), r["stage"]): r for r in rows if r["system"] == "peer"}
    failures, lines = 0, []
    for k, d in sorted(ddp.items()):
        if k[1] not in ("100mbit", "1gbit") or (k, "compression") not in peer:
            continue  # faster links: the machine's cores, not the link, bound the step
        c, w = peer[(k, "compression")], peer[(k, "warmup")]
        measured = float(d["step_ms"]) / (
            warmup * float(w["step_ms"]) + (1 - warmup) * float(c["step_ms"]))
        # The compute of a compressed step: its time less its wire's share of the bound.
        compute = max(float(c["step_ms"]) - float(c["bound_wire_ms"]), 0) / 1e3
        # The node count from the warmup's bytes: each node sends 2 (W-1)/W of the gradient.
        share = float(w["payload_sent_per_worker_step"]) / (4 * float(d["params"]))
        nodes = round(2 / (2 - share))
        model = predict(float(d["params"]), nodes, parse_rate(k[1]), compute, warmup)
        off = model["whole_run"] / measured - 1
        ok = off <= 0.10 and (k[1] != "100mbit" or off >= -tolerance)
        failures += not ok
        lines.append(f"{k[0]:8} {nodes:2} nodes {k[1]:8} measured {measured:5.2f}x  model "
                     f"{model['whole_run']:5.2f}x  ({off:+.0%}) {'ok' if ok else 'OFF'}")
    return lines, failures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, help="parameters in the model")
    p.add_argument("--nodes", type=int, help="nodes (machines) in the job")
    p.add_argument("--link", help="each node's link: 100mbit, 10gbit, ...")
    p.add_argument("--compute", type=float,
                   help="seconds of one step's compute on one node (forward, backward, optimizer)")
    p.add_argument("--warmup", type=float, default=0.15,
                   help="the share of steps before the freeze (default 0.15)")
    p.add_argument("--check", metavar="RESULTS_CSV",
                   help="compare the model with a recorded run of tools/bench/run.sh")
    p.add_argument("--tolerance", type=float, default=0.25,
                   help="--check: the largest relative error allowed (default 0.25)")
    a = p.parse_args()
    if not 0 <= a.warmup < 1:
        p.error("--warmup is a share of the steps: 0 <= f < 1")
    if a.check:
        lines, failures = check(a.check, a.warmup, a.tolerance)
        print("\n".join(lines))
        if not lines:
            sys.exit(f"{a.check}: no link-bound rows with DDP and peer mode")
        sys.exit(1 if failures else 0)
    if None in (a.params, a.nodes, a.link, a.compute):
        p.error("give --params, --nodes, --link and --compute (or --check)")
    if a.nodes < 2 or a.params <= 0 or a.compute < 0:
        p.error("--nodes must be at least 2, --params above 0, --compute at least 0")
    try:
        rate = parse_rate(a.link)
    except ValueError as e:
        p.error(str(e))
    m = predict(a.params, a.nodes, rate, a.compute, a.warmup)
    print(f"DDP step:                {m['ddp_s']:.3f} s (compute {m['compute_share']:.0%})")
    print(f"1-bit Adam, compressed:  {m['compressed_s']:.3f} s")
    print(f"whole run, {a.warmup:.0%} warmup: {m['whole_run']:.2f}x faster than DDP")
    print(f"will onebit help? {verdict(m['whole_run'])}")


if __name__ == "__main__":
    main()
