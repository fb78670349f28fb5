#!/usr/bin/env python3
"""The CUDA kernel benchmark's results (check.sh's bench.json) as a Markdown table for
BENCHMARKS.md: every kernel against the device-to-device copy of the same run, per byte
it must move (vs_copy_passes where the kernel reports it: the two-pass compressions and
the server aggregations; else vs_copy), with the 0.85 target marked (it holds at the full
size; the smaller sizes, `/n=`, are listed but not held to it). Given the earlier commit's
results of the same call (bench_before.json), a column for each and the change.

    tools/gpu/bench_table.py OUT/bench.json [OUT/bench_before.json] [--target 0.85]
"""
import argparse
import json
import sys


def load(path):
    """{kernel name: (vs_copy, vs_copy_passes or None)} and the copy's GB/s of one run."""
    try:
        with open(path) as f:
            data = json.load(f)
        benchmarks = data["benchmarks"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"bench_table.py: {path}: not a benchmark JSON ({e})")
    ratios, copy_gbps = {}, None
    for b in benchmarks:
        if b.get("run_type") != "iteration" or "vs_copy" not in b:
            continue
        name = b["name"].removesuffix("/manual_time")
        if name == "DeviceToDeviceCopy":
            copy_gbps = b.get("GB/s")
            continue
        ratios[name] = (b["vs_copy"], b.get("vs_copy_passes"))
    if not ratios:
        raise SystemExit(f"bench_table.py: {path}: no kernel with a vs_copy counter (a run "
                         "without a GPU measures nothing)")
    return ratios, copy_gbps


def ratio(r, other=None):
    """Per byte of the passes where r (and `other`, when compared) have it."""
    if r is None:
        return None
    passes = r[1] is not None and (other is None or other[1] is not None)
    return r[1] if passes else r[0]


def cell(value, target, held):
    if value is None:
        return "-"
    text = f"{value:.3f}"
    return f"**{text}**" if held and value < target else text


def held(name):
    return "/n=" not in name


def table(after, before, target):
    ratios, copy_gbps = after
    lines = []
    if copy_gbps:
        line = f"copy: {copy_gbps / 1e3:.2f} TB/s"
        if before and before[1]:
            line += f" (the earlier binary's run: {before[1] / 1e3:.2f} TB/s)"
        lines += [line, ""]
    if before:
        lines += ["| kernel | before | after | change |", "|---|---:|---:|---:|"]
        names = list(ratios) + [n for n in before[0] if n not in ratios]
        for name in names:
            a_pair, b_pair = ratios.get(name), before[0].get(name)
            a, b = ratio(a_pair, b_pair), ratio(b_pair, a_pair)
            change = f"{a / b - 1:+.1%}" if a is not None and b else "-"
            h = held(name)
            lines.append(f"| {name} | {cell(b, target, h)} | {cell(a, target, h)} | {change} |")
    else:
        lines += ["| kernel | vs copy |", "|---|---:|"]
        lines += [f"| {n} | {cell(ratio(r), target, held(n))} |" for n, r in ratios.items()]
    below = sorted(n for n, r in ratios.items() if held(n) and ratio(r) < target)
    lines += ["", f"below {target}: " + (", ".join(below) if below else "none")]
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("after", help="bench.json")
    parser.add_argument("before", nargs="?", help="bench_before.json (same call)")
    parser.add_argument("--target", type=float, default=0.85)
    args = parser.parse_args(argv)
    before = load(args.before) if args.before else None
    print(table(load(args.after), before, args.target))


if __name__ == "__main__":
    main(sys.argv[1:])
