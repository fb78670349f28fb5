#!/usr/bin/env python3
"""Where a step's time goes on the wire, from a run's transport traces.

    python3 tools/bench/rounds.py RUN_DIR [--markdown]

RUN_DIR holds a job's worker-<i>.csv (onebit-worker --history_csv: every step's end time and
its split) and transport-<i>.csv (--transport_trace: every transport call's start and end in
peer mode, every push to a shard and its result in ps mode); tools/bench/run.sh writes both
for peer and ps runs (RUN_DIR = OUT/runs/<name>/onebit_adam).

Each call is put into the step whose window holds its start (a step's window ends at its
recorded unix_time and starts where the one before it ended). Per stage (warmup,
compression) and worker it prints, as medians over the stage's measured steps:

  step       the step's time (worker-<i>.csv)
  calls      transport calls in the step
  rounds     message rounds on the critical path: the longest chain of calls each of which
             started after the one before it ended (calls in flight together are one
             round: a direct all-gather's W-1 SendRecvs); a gloo AllToAll or AllGather of
             blocks over 256 KB sends its W-1 shifts one at a time and counts W-1
             (onebit's GlooTransport); a ps step's pushes are one round together
             (each waits for the one before to be written, not for an answer), and
             its results the next
  <op> ms    the time inside each kind of call
  wire ms    the time inside any call (overlapping calls counted once)
  off-wire   the step's time outside every call: gradient, compression, update, control

and then the calls of one step (the median one) as a timeline. For ps runs, also each
step's phases across the workers (seconds):

  start skew    between the first and the last worker's first push
  push phase    from the first push to the last shard's completion (a shard's completion:
                the first arrival of its result at any worker)
  result phase  from the last shard's completion to the last worker's end of the step
  end skew      between the first and the last worker's end of the step (the next step's
                start skew, give or take the gradient)
"""
import csv
import os
import statistics
import sys

ONE_AT_A_TIME_BLOCK = 256 << 10  # GlooTransport::kAllInFlightMaxBlockBytes


def follows(c, d):
    """Whether call c is a round after call d: it started after d ended. In ps mode a push
    waits for the one before it to be written (to this host's transport), never for a
    message from a shard, so a step's pushes are its first round; a result waits for its
    own push only (results do not wait for each other)."""
    c_op, d_op = c["op"].rstrip("!"), d["op"].rstrip("!")  # a failed call ("Push!") too
    if c_op == "Push":
        return False
    if c_op == "Result":
        return d_op == "Push" and d["to"] == c["from"] and d["end"] <= c["start"]
    return d["end"] <= c["start"]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def steps_of(rows):
    """[(step, stage, start, end, seconds)] of the rows of kind 'step', in order."""
    out, prev_end = [], None
    for r in rows:
        if r.get("kind") != "step" or not r.get("unix_time"):
            continue
        end = float(r["unix_time"])
        start = prev_end if prev_end is not None else end - float(r["seconds"])
        out.append((int(r["step"]), r["stage"], start, end, float(r["seconds"])))
        prev_end = end
    return out


def rounds_of(calls, world):
    """The longest chain of calls each of which started after the one before it ended (a
    call that overlaps another is in the same round: the W-1 SendRecvs of a direct
    all-gather are one round). A gloo AllToAll or AllGather of blocks over 256 KB takes
    its W-1 shifts one at a time: W-1."""
    calls = sorted(calls, key=lambda c: c["start"])
    depth = []
    for i, c in enumerate(calls):
        one_at_a_time = c["op"] in ("AllToAll", "AllGather") and c["block"] > ONE_AT_A_TIME_BLOCK
        own = (world - 1) if one_at_a_time else 1
        before = [depth[j] for j in range(i) if follows(c, calls[j])]
        depth.append(own + max(before, default=0))
    return max(depth, default=0)


def covered(calls):
    """Seconds inside at least one call."""
    total, cur_s, cur_e = 0.0, None, None
    for c in sorted(calls, key=lambda c: c["start"]):
        if cur_e is None or c["start"] > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = c["start"], c["end"]
        else:
            cur_e = max(cur_e, c["end"])
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def analyse(run_dir):
    workers = sorted(int(f[len("worker-"):-4]) for f in os.listdir(run_dir)
                     if f.startswith("worker-") and f.endswith(".csv"))
    world = len(workers)
    per_stage = {}  # stage -> list of (worker, step, seconds, calls)
    for w in workers:
        trace_path = os.path.join(run_dir, f"transport-{w}.csv")
        if not os.path.exists(trace_path):
            sys.exit(f"rounds: {trace_path} is missing (run the job with --transport_trace)")
        calls = [{"op": r["op"], "to": int(r["to"]), "from": int(r["from"]),
                  "block": int(r["block_bytes"]), "sent": int(r["sent"]),
                  "received": int(r["received"]),
                  "start": float(r["start_unix"]), "end": float(r["end_unix"])}
                 for r in read_csv(trace_path)]
        steps = steps_of(read_csv(os.path.join(run_dir, f"worker-{w}.csv")))
        # The first step of each stage connects or sets up; the bench leaves it out too.
        seen = set()
        for step, stage, start, end, seconds in steps:
            mine = [c for c in calls if start < c["start"] <= end]
            if stage not in seen:
                seen.add(stage)
                continue
            per_stage.setdefault(stage, []).append((w, step, start, end, seconds, mine))
    return world, per_stage


def summary(world, per_stage, markdown):
    ops = sorted({c["op"] for rows in per_stage.values() for r in rows for c in r[5]})
    head = ["stage", "steps", "step ms", "calls", "rounds"] + [f"{o} ms" for o in ops] + \
        ["wire ms", "off-wire ms"]
    lines = []
    for stage, rows in per_stage.items():
        med = lambda xs: statistics.median(xs) if xs else 0.0
        vals = [stage, str(len(rows)),
                f"{med([r[4] for r in rows]) * 1e3:.1f}",
                f"{med([len(r[5]) for r in rows]):g}",
                f"{med([rounds_of(r[5], world) for r in rows]):g}"]
        for o in ops:
            vals.append(f"{med([sum(c['end'] - c['start'] for c in r[5] if c['op'] == o) for r in rows]) * 1e3:.1f}")
        wire = [covered(r[5]) for r in rows]
        vals.append(f"{med(wire) * 1e3:.1f}")
        vals.append(f"{med([r[4] - x for r, x in zip(rows, wire)]) * 1e3:.1f}")
        lines.append(vals)
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
        for v in lines:
            print("| " + " | ".join(v) + " |")
    else:
        print("  ".join(head))
        for v in lines:
            print("  ".join(v))
    for stage, rows in per_stage.items():
        rows = sorted(rows, key=lambda r: r[4])
        w, step, start, end, seconds, calls = rows[len(rows) // 2]
        print(f"\n{stage}: worker {w}, step {step} ({seconds * 1e3:.1f} ms; "
              f"from the end of the step before, ms):")
        for c in sorted(calls, key=lambda c: c["start"]):
            peers = "".join(f" {k} {c[k]}" for k in ("to", "from") if c[k] >= 0)
            print(f"  {(c['start'] - start) * 1e3:8.1f} -> {(c['end'] - start) * 1e3:8.1f}  "
                  f"{c['op']}{peers}, {c['sent']} bytes out, {c['received']} in")
        print(f"  {(end - start) * 1e3:8.1f}  step ends")


def ps_phases(per_stage):
    """Per stage: [(step, start skew, push phase, result phase, end skew)] of the steps
    whose every worker pushed (ps runs; empty otherwise)."""
    out = {}
    for stage, rows in per_stage.items():
        by_step = {}
        for w, step, start, end, seconds, calls in rows:
            by_step.setdefault(step, []).append((end, calls))
        for step, ws in sorted(by_step.items()):
            firsts = [min((c["start"] for c in calls if c["op"] == "Push"), default=None)
                      for _, calls in ws]
            if len(ws) < 2 or None in firsts:
                continue
            done = {}
            for _, calls in ws:
                for c in calls:
                    if c["op"] == "Result":
                        done[c["from"]] = min(done.get(c["from"], c["end"]), c["end"])
            if not done:
                continue
            ends = [end for end, _ in ws]
            last_done = max(done.values())
            out.setdefault(stage, []).append(
                (step, max(firsts) - min(firsts), last_done - min(firsts), max(ends) - last_done,
                 max(ends) - min(ends)))
    return out


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    world, per_stage = analyse(argv[1])
    if not per_stage:
        sys.exit(f"rounds: no measured steps in {argv[1]}")
    summary(world, per_stage, "--markdown" in argv[2:])
    phases = ps_phases(per_stage)
    for stage, steps in phases.items():
        print(f"\n{stage}, ps phases across the workers (s): step, start skew, push phase, "
              f"result phase, end skew")
        for step, *vals in steps:
            print(f"  {step}  " + "  ".join(f"{v:.2f}" for v in vals))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
