#!/usr/bin/env python3
"""Samples the emulated cluster's link counters and the shards' memory while a bench run
goes (root; started and stopped by tools/bench/run.sh).

    sampler.py OUT NODES [INTERVAL_S=0.1] [PREFIX=onebit]

Every INTERVAL_S it appends one line to OUT:

    unix_time tx_0 rx_0 tx_1 rx_1 ... shard_hwm_kb

tx_i/rx_i: the bytes node i sent and received, read on the bridge side of its link in this
namespace (what the node sends, its veth peer receives: the same count as the node's eth0,
without entering the namespace). shard_hwm_kb: the largest peak resident memory (VmHWM) of
any onebit-server process in the cluster's namespaces (PREFIX-ctl or a node's), 0 when none.
"""
import os
import signal
import sys
import time


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def netns_inode(name):
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def shard_hwm_kb(inodes):
    """The largest VmHWM of an onebit-server in one of the network namespaces `inodes`."""
    best = 0
    if not inodes:
        return 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "onebit-server":
                    continue
            if os.stat(f"/proc/{pid}/ns/net").st_ino not in inodes:
                continue
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        best = max(best, int(line.split()[1]))
        except (OSError, ValueError):
            continue
    return best


def main():
    out, nodes = sys.argv[1], int(sys.argv[2])
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    prefix = sys.argv[4] if len(sys.argv) > 4 else "onebit"
    links = [f"/sys/class/net/{prefix}v{i}/statistics" for i in range(nodes)]
    # The shards run on the control host, or beside the workers (run.sh --shards colocated).
    namespaces = {netns_inode(f"{prefix}-ctl")} | {netns_inode(f"{prefix}-node{i}")
                                                   for i in range(nodes)}
    namespaces.discard(None)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    last_mem = 0.0
    hwm = 0
    with open(out, "a", buffering=1) as f:
        while not stop:
            t = time.time()
            vals = []
            for link in links:
                vals += [read_int(f"{link}/rx_bytes"), read_int(f"{link}/tx_bytes")]
            if t - last_mem >= 0.5:  # /proc walks cost more than the counters
                hwm = max(hwm, shard_hwm_kb(namespaces))
                last_mem = t
            f.write(f"{t:.4f} " + " ".join(map(str, vals)) + f" {hwm}\n")
            time.sleep(interval)


if __name__ == "__main__":
    main()
