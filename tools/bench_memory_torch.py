#!/usr/bin/env python3
"""Peak memory of the workers of a PyTorch job against the memory model (tools/memory_model.py,
docs/performance.md "Memory"), as tools/bench_memory.sh measures the built-in workloads:
NODES x LOCAL PyTorch processes on loopback (two onebit-run groups, --nnodes 2), the
hierarchical exchange (local_size LOCAL, peer between the nodes), OneBitAdam with a short
warmup, at two model sizes. The slope of each worker's peak between the two sizes is bytes
per parameter; it removes the fixed part (Python, torch, gloo, threads).

    nice -n 19 tools/bench_memory_torch.py [--setups=A,B,C] [--sizes=16777216,25165824]
        [--nodes=2] [--local=4] [--steps=30] [--freeze_step=5]
        [--out=out/bench_memory_torch] [--python=/usr/bin/python3] [--no_build]

Setups (each at both sizes):
  A       bf16 model, shard_state true: the bf16 gradient buffer the .grad tensors view (the
          run checks opt._worker.gradient_buffer()[1] == "bf16" and that .grad views it)
  B       bf16 model, shard_state false: fp32 masters and an fp32 gradient buffer in the
          worker, the model's own bf16 parameters and .grad
  C       fp32 model, shard_state true (the reference for tools/bench_memory.sh's built-in
          measurement)
  A_none  A with opt.zero_grad(set_to_none=True): backward makes a fresh .grad each step and
          the package copies it into the buffer. The others zero in place (set_to_none=False),
          so backward accumulates into the .grad views.

The model: L independent 512 x 512 weight matrices (no bias), n / 2^18 of them (64 at 16 Mi,
96 at 24 Mi), each applied to the same 4 x 512 input; the loss sums the mean squares of the
outputs, so it touches every parameter. Activations are 4 x 512 per matrix, and backward's
own gradient of one matrix (added into its .grad) is 0.5 MiB (bf16) or 1 MiB (fp32) at
both sizes. That per-tensor scratch does not grow with n, so the slope is the optimizer's,
the exchange's and the package's buffers only. --sizes must be multiples of 2^18.

How the peak is read: each rank (the Python process IS the worker: the core runs in it on a
thread) records VmHWM and VmRSS from /proc/self/status after building the model, after
joining (Trainer::Init done, the tensors bound), after each step, and at the very end in an
atexit handler registered before onebit is imported (so it runs after onebit's own), with
ru_maxrss from getrusage(RUSAGE_SELF). The peak is that last VmHWM (the process's peak
RSS). The table also gives the slope of VmHWM before the last step (the training peak,
without what the worker allocates as it ends: python/embedded.cc's after_run copies the
final parameters and the state to the host for state_dict()).

The package and libonebit_core.so come from Bazel's runfiles of //tests:python_package_test
(bazel-bin/tests/python_package_test.runfiles/onebit/python on PYTHONPATH, as
python/tests/package_test.py runs them). BAZEL_FLAGS (e.g. --disk_cache=DIR) goes to the
build. Memory: setup B at 24 Mi peaks at about 1.1 GiB per worker, 9 GiB for the 8.

Results: a Markdown table on stdout and in OUT/results.md, every worker's peaks in
OUT/results.csv, each run's rank logs and per-rank JSON under OUT/<setup>-<size>/.
"""
import argparse
import atexit
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

SIDE = 512                # each weight matrix is SIDE x SIDE
PER_TENSOR = SIDE * SIDE  # 2^18 parameters
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNFILES = "bazel-bin/tests/python_package_test.runfiles/onebit"

# name: (torch dtype, shard_state, zero_grad's set_to_none, model --param_dtype, --grad_dtype)
SETUPS = {
    "A": ("bfloat16", True, False, "bf16", "bf16"),
    "B": ("bfloat16", False, False, "bf16", "fp32"),
    "C": ("float32", True, False, "fp32", "fp32"),
    "A_none": ("bfloat16", True, True, "bf16", "bf16"),
}
DESCRIBE = {
    "A": "bf16 model, shard_state true (bf16 gradient buffer)",
    "B": "bf16 model, shard_state false (fp32 masters, fp32 gradient buffer)",
    "C": "fp32 model, shard_state true",
    "A_none": "A with zero_grad(set_to_none=True)",
}


# ---- One rank: run by onebit-run as `bench_memory_torch.py train ...` ----

def proc_status():
    """(VmHWM, VmRSS) of this process in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out["VmHWM"], out["VmRSS"]


def train(argv):
    setup, n, out_dir, steps, freeze, local = (argv[0], int(argv[1]), argv[2], int(argv[3]),
                                               int(argv[4]), int(argv[5]))
    rank = int(os.environ["RANK"])
    marks = []  # (label, VmHWM, VmRSS)

    def mark(label):
        hwm, rss = proc_status()
        marks.append((label, hwm, rss))

    record = {"rank": rank, "setup": setup, "params": n, "ok": False}

    def write_at_exit():
        # Registered before onebit is imported: atexit runs it after onebit's own handlers.
        import resource  # noqa: PLC0415
        mark("exit")
        record["marks"] = marks
        record["ru_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        record["vmhwm_exit_bytes"] = marks[-1][1]
        with open(os.path.join(out_dir, f"peak-{rank}.json"), "w") as f:
            json.dump(record, f)

    atexit.register(write_at_exit)
    mark("start")
    import torch  # noqa: PLC0415
    import onebit.torch as ot  # noqa: PLC0415
    mark("imported")
    dtype_name, shard, set_to_none = SETUPS[setup][:3]
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(rank)
    # Made in their type (no float32 copy first): n / 2^18 matrices of 512 x 512.
    weights = [torch.nn.Parameter(torch.empty(SIDE, SIDE, dtype=dtype).uniform_(-0.04, 0.04))
               for _ in range(n // PER_TENSOR)]
    x = torch.randn(4, SIDE, generator=torch.Generator().manual_seed(100 + rank)).to(dtype)
    mark("model")
    config = {"steps": steps, "onebit": {"log_every": 1000, "exchange": {
        "mode": "hierarchical", "local_size": local, "inter": "peer"}}}
    opt = ot.OneBitAdam(weights, lr=1e-3, freeze_step=freeze, shard_state=shard, config=config)
    mark("optimizer")
    joined = False
    step = 0
    while not opt.done:
        if not joined:
            joined = True
            mark("joined")
            address, kept = opt._worker.gradient_buffer()  # noqa: SLF001
            record["gradient_buffer"] = kept
            record["param_buffer"] = opt._worker.param_buffer()[1]  # noqa: SLF001
            record["grad_views_buffer"] = (weights[0].grad is not None
                                           and weights[0].grad.data_ptr() == address)
        if step == steps - 1:
            mark("before_last")
        opt.zero_grad(set_to_none=set_to_none)
        loss = sum((x @ w).square().mean() for w in weights)
        loss.backward()
        opt.step(loss=loss)
        step += 1
        mark(f"step{step}")
    mark("end")
    record["steps"] = step
    record["grad_dtype_torch"] = str(weights[0].grad.dtype) if weights[0].grad is not None else None
    record["ok"] = step == steps
    print(f"rank {rank}: {setup}, {n} parameters, {step} steps, gradient buffer "
          f"{record.get('gradient_buffer')}, .grad views it {record.get('grad_views_buffer')}, "
          f"VmHWM {marks[-1][1] / 2**20:.1f} MiB", flush=True)


# ---- The driver ----

def log(msg):
    print(f"bench_memory_torch: {msg}", file=sys.stderr, flush=True)


def run_job(a, runfiles, setup, n, out):
    """One job of NODES x LOCAL ranks: two (or NODES) onebit-run groups on loopback."""
    d = os.path.join(out, f"{setup}-{n}")
    if os.path.isdir(d):
        for f in glob.glob(os.path.join(d, "*.json")) + glob.glob(os.path.join(d, "logs-*/*")):
            os.remove(f)
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(runfiles, "python"), OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "ONEBIT_COORDINATOR", "ONEBIT_RANK"):
        env.pop(k, None)
    port = subprocess.run([a.python, "-c", "from onebit.run import free_port_run; "
                           "print(free_port_run('127.0.0.1', 3))"], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()
    script = os.path.abspath(__file__)
    args = ["train", setup, str(n), d, str(a.steps), str(a.freeze_step), str(a.local)]
    procs = []
    started = time.time()
    for node in range(a.nodes):
        cmd = [a.python, "-m", "onebit.run", f"--nnodes={a.nodes}", f"--node_rank={node}",
               f"--nproc_per_node={a.local}", "--master_addr=127.0.0.1",
               f"--master_port={port}", f"--log_dir={d}/logs-node{node}", script, *args]
        with open(os.path.join(d, f"run-node{node}.log"), "w") as f:
            f.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
            f.flush()
            procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=a.timeout_s))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.terminate()
            codes.append("timeout")
    took = time.time() - started
    peaks = {}
    for f in glob.glob(os.path.join(d, "peak-*.json")):
        x = json.load(open(f))
        peaks[x["rank"]] = x
    workers = a.nodes * a.local
    bad = [r for r, x in peaks.items() if not x["ok"]]
    if codes != [0] * len(procs) or len(peaks) != workers or bad:
        log(f"the {setup} job of {n} parameters failed (onebit-run exits {codes}, "
            f"{len(peaks)} of {workers} peaks, not ok: {bad}); the ends of its logs:")
        for f in sorted(glob.glob(os.path.join(d, "logs-*/rank-*.log")))[:2]:
            with open(f) as g:
                log(f"{f}:\n" + "".join(g.readlines()[-15:]))
        sys.exit(1)
    expect = SETUPS[setup][4]
    wrong = [r for r, x in peaks.items() if x.get("gradient_buffer") != expect]
    if wrong:
        log(f"{setup}: ranks {wrong} keep a gradient buffer of "
            f"{peaks[wrong[0]].get('gradient_buffer')}, not {expect}")
        sys.exit(1)
    if expect == "bf16" and not all(x.get("grad_views_buffer") for x in peaks.values()):
        log(f"{setup}: the .grad tensors do not view the bf16 gradient buffer")
        sys.exit(1)
    mean = statistics.mean(x["vmhwm_exit_bytes"] for x in peaks.values())
    log(f"{setup} at {n:,}: {took:.0f} s, gradient buffer {expect} on every rank, peak "
        f"{mean / 2**20:.1f} MiB per worker (mean)")
    return peaks


def model_peak(a, setup, n):
    _, shard, _, pdt, gdt = SETUPS[setup]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools/memory_model.py"),
                        "--cpu_job", "--workload", "pytorch", "--param_dtype", pdt,
                        "--grad_dtype", gdt, "--shard_state", str(shard).lower(),
                        "--params", str(n), "--local_size", str(a.local), "--nodes",
                        str(a.nodes), "--freeze_step", str(a.freeze_step), "--steps",
                        str(a.steps), "--json"], check=True, capture_output=True, text=True)
    return json.loads(r.stdout)["cpu_job_peak_bytes"]


def mark_of(x, label):
    return next(hwm for name, hwm, _ in x["marks"] if name == label)


def report(a, results, out):
    small, large = a.sizes
    dn = large - small
    lines = [
        f"Peak RSS of {a.nodes * a.local} PyTorch worker processes ({a.nodes} nodes x {a.local} "
        f"on loopback, two onebit-run groups; hierarchical, local_size {a.local}, peer between "
        f"the nodes, gloo), OneBitAdam, freeze_step {a.freeze_step}, {a.steps} steps, "
        f"{SIDE} x {SIDE} weight matrices (n / {PER_TENSOR} of them). Peak = VmHWM at the "
        "process's exit (atexit, after onebit's). MiB = 2^20 bytes.", "",
        "| setup | params | peak per worker: mean (MiB) | min | max | model above the fixed part "
        "(MiB) | measured - model (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    slopes = {}
    for setup, per_size in results.items():
        for n in (small, large):
            p = [x["vmhwm_exit_bytes"] for x in per_size[n].values()]
            m = model_peak(a, setup, n)
            lines.append(f"| {setup} | {n:,} | {statistics.mean(p) / 2**20:.1f} | "
                         f"{min(p) / 2**20:.1f} | {max(p) / 2**20:.1f} | {m / 2**20:.1f} | "
                         f"{(statistics.mean(p) - m) / 2**20:.1f} |")
        ranks = sorted(per_size[small])
        s = {}
        for label in ("joined", "before_last", "exit"):
            key = "vmhwm_exit_bytes" if label == "exit" else None
            per_rank = []
            for r in ranks:
                lo = per_size[small][r][key] if key else mark_of(per_size[small][r], label)
                hi = per_size[large][r][key] if key else mark_of(per_size[large][r], label)
                per_rank.append((hi - lo) / dn)
            s[label] = per_rank
        s["ru_maxrss"] = [(per_size[large][r]["ru_maxrss_bytes"]
                           - per_size[small][r]["ru_maxrss_bytes"]) / dn for r in ranks]
        s["model"] = (model_peak(a, setup, large) - model_peak(a, setup, small)) / dn
        s["fixed"] = statistics.mean(
            x["vmhwm_exit_bytes"] for x in per_size[small].values()) - model_peak(a, setup, small)
        slopes[setup] = s
    lines += ["",
              f"Slopes between {small:,} and {large:,} parameters, bytes per parameter per "
              "worker (mean over the workers, their range in brackets). The model is "
              "tools/memory_model.py --cpu_job --workload pytorch with the setup's "
              "--param_dtype, --grad_dtype and --shard_state.", "",
              "| setup | slope of the peak (B/param) | model (B/param) | measured / model | "
              "slope of VmHWM before the last step | slope of VmHWM after joining | "
              "fixed part (MiB) |",
              "|---|---:|---:|---:|---:|---:|---:|"]

    def fmt(v):
        return f"{statistics.mean(v):.2f} ({min(v):.2f} to {max(v):.2f})"

    for setup, s in slopes.items():
        meas = statistics.mean(s["exit"])
        lines.append(f"| {setup}: {DESCRIBE[setup]} | {fmt(s['exit'])} | {s['model']:.2f} | "
                     f"{meas / s['model']:.3f} | {fmt(s['before_last'])} | {fmt(s['joined'])} | "
                     f"{s['fixed'] / 2**20:.0f} |")
    gap = max(abs(statistics.mean(s["ru_maxrss"]) - statistics.mean(s["exit"]))
              for s in slopes.values())
    lines += ["", f"ru_maxrss (getrusage at exit) gives slopes within {gap:.3f} B/param of "
              "VmHWM at exit.",
              "Every rank of A and A_none checked opt._worker.gradient_buffer()[1] == \"bf16\" "
              "and that .grad views it; B and C keep \"fp32\"."]
    text = "\n".join(lines)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "results.csv"), "w") as f:
        f.write("setup,torch_dtype,shard_state,set_to_none,nodes,local_size,steps,freeze_step,"
                "params,rank,gradient_buffer,vmhwm_exit_bytes,ru_maxrss_bytes,"
                "vmhwm_before_last_bytes,vmhwm_joined_bytes,vmhwm_model_bytes,"
                "vmhwm_imported_bytes\n")
        for setup, per_size in results.items():
            dt, shard, none = SETUPS[setup][:3]
            for n in (small, large):
                for r in sorted(per_size[n]):
                    x = per_size[n][r]
                    f.write(f"{setup},{dt},{str(shard).lower()},{str(none).lower()},{a.nodes},"
                            f"{a.local},{a.steps},{a.freeze_step},{n},{r},"
                            f"{x['gradient_buffer']},{x['vmhwm_exit_bytes']},"
                            f"{x['ru_maxrss_bytes']},{mark_of(x, 'before_last')},"
                            f"{mark_of(x, 'joined')},{mark_of(x, 'model')},"
                            f"{mark_of(x, 'imported')}\n")
    with open(os.path.join(out, "slopes.json"), "w") as f:
        json.dump(slopes, f, indent=1)
    print(text)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        return train(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setups", default="A,B,C")
    ap.add_argument("--sizes", default="16777216,25165824")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--local", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--freeze_step", type=int, default=5)
    ap.add_argument("--out", default="out/bench_memory_torch")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="the Python with torch (Debian's: torch 1.13, the package's test stack)")
    ap.add_argument("--timeout_s", type=int, default=1200, help="per job")
    ap.add_argument("--no_build", action="store_true")
    a = ap.parse_args()
    setups = a.setups.split(",")
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        ap.error(f"--setups: unknown {unknown}; known {', '.join(SETUPS)}")
    a.sizes = [int(s) for s in a.sizes.split(",")]
    if len(a.sizes) != 2 or a.sizes[1] <= a.sizes[0] or any(s % PER_TENSOR for s in a.sizes):
        ap.error(f"--sizes=SMALL,LARGE with LARGE > SMALL, both multiples of {PER_TENSOR}")
    if min(a.sizes) // a.local < 1 << 22:
        log(f"warning: {min(a.sizes)} / {a.local} < 4 Mi: the reduce-scatter's segment rows "
            "differ between the sizes, and the slope counts them")
    os.chdir(ROOT)
    if not a.no_build:
        log("building //tests:python_package_test (its runfiles hold the package and the core)")
        subprocess.run(["bazel", "build", *shlex.split(os.environ.get("BAZEL_FLAGS", "")),
                        "//tests:python_package_test"], check=True, stdout=subprocess.DEVNULL)
    runfiles = os.path.realpath(RUNFILES)
    if not os.path.isfile(os.path.join(runfiles, "python/libonebit_core.so")):
        sys.exit(f"bench_memory_torch: no {RUNFILES}/python/libonebit_core.so: build "
                 "//tests:python_package_test (or leave out --no_build)")
    os.makedirs(a.out, exist_ok=True)
    out = os.path.realpath(a.out)
    results = {}
    for setup in setups:
        results[setup] = {}
        for n in a.sizes:
            log(f"{setup} ({DESCRIBE[setup]}): {a.nodes * a.local} workers ({a.nodes} nodes x "
                f"{a.local}), {n:,} parameters, {a.steps} steps, freeze_step {a.freeze_step}")
            results[setup][n] = run_job(a, runfiles, setup, n, out)
    report(a, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
