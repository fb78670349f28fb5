#!/usr/bin/env python3
"""Peak memory of the workers of a PyTorch job against the memory model (tools/memory_model.py,
docs/performance.md "Memory"), as tools/bench_memory.sh measures the built-in workloads:
NODES x LOCAL PyTorch processes on loopback (two onebit-run groups, --nnodes 2), the
hierarchical exchange (local_size LOCAL, peer between the nodes), OneBitAdam with a short
warmup, at two model sizes. The slope of each worker's peak between the two sizes is bytes
per parameter; it removes the fixed part (Python, torch, gloo, threads).

    nice -n 19 tools/bench_memory_torch.py [--setups=A,B,C,A_none] [--sizes=16777216,25165824]
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

The model: n / 2^18 independent 512 x 512 weight matrices (no bias: 64 at 16 Mi, 96 at
24 Mi), each applied to the same 4 x 512 input; the loss sums the mean squares of the
outputs, so it touches every parameter. Activations are 4 x 512 per matrix, and backward's
own gradient of one matrix (added into its .grad) is 0.5 MiB (bf16) or 1 MiB (fp32) at
both sizes. That per-tensor scratch does not grow with n, so the slope is the optimizer's,
the exchange's and the package's buffers only. --sizes must be multiples of 2^18.

How the peak is read: each rank (the Python process IS the worker: the core runs in it on a
thread) reads VmHWM and VmRSS in /proc/self/status, and ru_maxrss from getrusage, at the
end of three phases, and resets the peak between them (5 > /proc/self/clear_refs, Linux
>= 4.0; where the kernel refuses, each phase's figure is the peak so far, and the script
warns):
  init   from the start to the worker's joining: torch's own tensors, the float32 copy of
         the parameters that Worker() takes (_FlatParams.current(), dropped before the
         worker starts), Trainer::Init, the binding of the tensors to the worker's buffers
  train  steps 1 to STEPS - 1 (backward, the exchange, the update)
  end    the last step, the worker's end (python/embedded.cc's after_run copies the final
         parameters and the state to the host for state_dict()), the package's unbind (the
         tensors take the final parameters) and the exit, read in an atexit handler
         registered before onebit is imported (so it runs after onebit's)
The worker's peak is the largest of the three: the process's VmHWM without the resets.
The model's phases (tools/memory_model.py --json, "phases") map onto them: init is the
larger of its join and init, train of warmup and compression, end of end and unbind.

The package and libonebit_core.so come from Bazel's runfiles of //tests:python_package_test
(bazel-bin/tests/python_package_test.runfiles/onebit/python on PYTHONPATH, as
python/tests/package_test.py runs them). BAZEL_FLAGS (e.g. --disk_cache=DIR) goes to the
build. Memory: setup B at 24 Mi peaks at about 1.7 GiB per worker, 14 GiB for the 8; the
default run (8 jobs) takes about 4 minutes on 2 cores.

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


def reset_peak():
    """Resets this process's VmHWM to its VmRSS (Linux >= 4.0: 5 > /proc/self/clear_refs);
    False where the kernel refuses. getrusage's ru_maxrss restarts with it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def train(argv):
    setup, n, out_dir, steps, freeze, local = (argv[0], int(argv[1]), argv[2], int(argv[3]),
                                               int(argv[4]), int(argv[5]))
    rank = int(os.environ["RANK"])
    marks = []  # (label, VmHWM, VmRSS)
    record = {"rank": rank, "setup": setup, "params": n, "ok": False, "phases": {},
              "resets": []}

    def mark(label):
        hwm, rss = proc_status()
        marks.append((label, hwm, rss))

    def phase(name):
        """The peak since the last reset is phase `name`'s; then the peak restarts."""
        import resource  # noqa: PLC0415
        mark(name)
        record["phases"][name] = {
            "vmhwm_bytes": marks[-1][1],
            "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        if name != "end":
            record["resets"].append(reset_peak())

    def write_at_exit():
        # Registered before onebit is imported: atexit runs it after onebit's own handlers.
        phase("end")
        record["marks"] = marks
        record["vmhwm_peak_bytes"] = max(p["vmhwm_bytes"] for p in record["phases"].values())
        record["ru_maxrss_peak_bytes"] = max(p["ru_maxrss_bytes"]
                                             for p in record["phases"].values())
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
            address, kept = opt._worker.gradient_buffer()  # noqa: SLF001
            record["gradient_buffer"] = kept
            record["param_buffer"] = opt._worker.param_buffer()[1]  # noqa: SLF001
            record["grad_views_buffer"] = (weights[0].grad is not None
                                           and weights[0].grad.data_ptr() == address)
            phase("init")  # Trainer::Init done, the tensors bound, current()'s copy freed
        if step == steps - 1:
            phase("train")  # steps 1 to steps - 1
        opt.zero_grad(set_to_none=set_to_none)
        loss = sum((x @ w).square().mean() for w in weights)
        loss.backward()
        opt.step(loss=loss)
        step += 1
        mark(f"step{step}")
    mark("done")
    record["steps"] = step
    record["ok"] = step == steps
    print(f"rank {rank}: {setup}, {n} parameters, {step} steps, gradient buffer "
          f"{record.get('gradient_buffer')}, .grad views it {record.get('grad_views_buffer')}",
          flush=True)


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
    if not all(all(x["resets"]) for x in peaks.values()):
        log("warning: /proc/self/clear_refs refused the peak's reset: each phase's peak is "
            "the process's peak so far")
    mean = statistics.mean(x["vmhwm_peak_bytes"] for x in peaks.values())
    log(f"{setup} at {n:,}: {took:.0f} s, gradient buffer {expect} on every rank, peak "
        f"{mean / 2**20:.1f} MiB per worker (mean)")
    return peaks


_MODEL = {}


def model(a, setup, n):
    """tools/memory_model.py --cpu_job --json for the setup at n parameters (cached)."""
    if (setup, n) not in _MODEL:
        _, shard, _, pdt, gdt = SETUPS[setup]
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools/memory_model.py"),
                            "--cpu_job", "--workload", "pytorch", "--param_dtype", pdt,
                            "--grad_dtype", gdt, "--shard_state", str(shard).lower(),
                            "--params", str(n), "--local_size", str(a.local), "--nodes",
                            str(a.nodes), "--freeze_step", str(a.freeze_step), "--steps",
                            str(a.steps), "--json"], check=True, capture_output=True, text=True)
        _MODEL[(setup, n)] = json.loads(r.stdout)
    return _MODEL[(setup, n)]


def model_peak(a, setup, n):
    return model(a, setup, n)["cpu_job_peak_bytes"]


# The script's phases in the model's (tools/memory_model.py PHASES).
MODEL_PHASES = {"init": ("join", "init"), "train": ("warmup", "compression"),
                "end": ("end", "unbind")}


def model_phase(a, setup, n, phase):
    """The model's CPU bytes at the peak of the script's `phase`."""
    phases = model(a, setup, n)["phases"]
    return max(phases[p]["cpu_bytes"] for p in MODEL_PHASES[phase] if p in phases)


def mark_of(x, label, column=1):
    """VmHWM (column 1) or VmRSS (2) at the mark `label`."""
    return next(m[column] for m in x["marks"] if m[0] == label)


PHASES = ("init", "train", "end")


def report(a, results, out):
    small, large = a.sizes
    dn = large - small
    lines = [
        f"Peak RSS of {a.nodes * a.local} PyTorch worker processes ({a.nodes} nodes x {a.local} "
        f"on loopback, {a.nodes} onebit-run groups; hierarchical, local_size {a.local}, peer "
        f"between the nodes, gloo), OneBitAdam, freeze_step {a.freeze_step}, {a.steps} steps, "
        f"{SIDE} x {SIDE} bf16/fp32 weight matrices (n / {PER_TENSOR} of them). A worker's "
        "peak is the largest VmHWM of its three phases (the peak is reset between them): init "
        "(start to the worker joined: Trainer::Init, the tensors bound), train (steps 1 to "
        f"{a.steps - 1}), end (the last step, the worker's end, exit). MiB = 2^20 bytes.", "",
        "| setup | params | peak per worker: mean (MiB) | min | max | model above the fixed "
        "part (MiB) | measured - model (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    slopes = {}
    for setup, per_size in results.items():
        for n in (small, large):
            p = [x["vmhwm_peak_bytes"] for x in per_size[n].values()]
            m = model_peak(a, setup, n)
            lines.append(f"| {setup} | {n:,} | {statistics.mean(p) / 2**20:.1f} | "
                         f"{min(p) / 2**20:.1f} | {max(p) / 2**20:.1f} | {m / 2**20:.1f} | "
                         f"{(statistics.mean(p) - m) / 2**20:.1f} |")
        ranks = sorted(per_size[small])

        def slope(f):
            return [(f(per_size[large][r]) - f(per_size[small][r])) / dn for r in ranks]

        s = {"peak": slope(lambda x: x["vmhwm_peak_bytes"]),
             "ru_maxrss": slope(lambda x: x["ru_maxrss_peak_bytes"]),
             "rss_before_last": slope(lambda x: mark_of(x, "train", 2))}
        for ph in PHASES:
            s[ph] = slope(lambda x, ph=ph: x["phases"][ph]["vmhwm_bytes"])
        s["model"] = (model_peak(a, setup, large) - model_peak(a, setup, small)) / dn
        for ph in PHASES:
            s["model_" + ph] = (model_phase(a, setup, large, ph)
                                - model_phase(a, setup, small, ph)) / dn
        s["fixed_mib"] = (statistics.mean(x["vmhwm_peak_bytes"] for x in per_size[small].values())
                          - model_peak(a, setup, small)) / 2**20
        slopes[setup] = s
    lines += ["",
              f"Slopes between {small:,} and {large:,} parameters, bytes per parameter per "
              "worker (the mean over the workers; their range in brackets for the peak). The "
              "model is tools/memory_model.py --cpu_job --workload pytorch --json with the "
              "setup's --param_dtype, --grad_dtype and --shard_state: its peak, and each "
              "phase's (init: the larger of its join and init phases; train: of warmup and "
              "compression; end: of end and unbind). RSS before the last step is what stays "
              "allocated while the job trains.", "",
              "| setup | slope of the peak | model | measured / model | init: measured, model "
              "| train: measured, model | end: measured, model | RSS before the last step |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def mean(v):
        return f"{statistics.mean(v):.2f}"

    def pair(s, ph):
        m = statistics.mean(s[ph])
        return f"{m:.2f}, {s['model_' + ph]:.2f} ({m / s['model_' + ph]:.3f})"

    for setup, s in slopes.items():
        meas = statistics.mean(s["peak"])
        lines.append(f"| {setup}: {DESCRIBE[setup]} | {mean(s['peak'])} ({min(s['peak']):.2f} "
                     f"to {max(s['peak']):.2f}) | {s['model']:.2f} | {meas / s['model']:.3f} | "
                     f"{pair(s, 'init')} | {pair(s, 'train')} | {pair(s, 'end')} | "
                     f"{mean(s['rss_before_last'])} |")
    gap = max(abs(statistics.mean(s["ru_maxrss"]) - statistics.mean(s["peak"]))
              for s in slopes.values())
    fixed = ", ".join(f"{k} {s['fixed_mib']:.0f}" for k, s in slopes.items())
    lines += ["",
              f"ru_maxrss (getrusage at the end of each phase) gives peak slopes within "
              f"{gap:.3f} B/param of VmHWM's. Fixed part (the peak at {small:,} minus the "
              f"model there), MiB per worker: {fixed}.",
              "Every rank of the bf16 sharded setups had opt._worker.gradient_buffer()[1] == "
              "\"bf16\" with .grad viewing it; the others \"fp32\"."]
    text = "\n".join(lines)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "results.csv"), "w") as f:
        f.write("setup,torch_dtype,shard_state,set_to_none,nodes,local_size,steps,freeze_step,"
                "params,rank,gradient_buffer,peak_bytes,ru_maxrss_peak_bytes,"
                "init_peak_bytes,train_peak_bytes,end_peak_bytes,rss_before_last_bytes,"
                "rss_after_model_bytes,rss_after_import_bytes,model_peak_bytes,"
                "model_init_bytes,model_train_bytes,model_end_bytes\n")
        for setup, per_size in results.items():
            dt, shard, none = SETUPS[setup][:3]
            for n in (small, large):
                for r in sorted(per_size[n]):
                    x = per_size[n][r]
                    ph = x["phases"]
                    f.write(f"{setup},{dt},{str(shard).lower()},{str(none).lower()},{a.nodes},"
                            f"{a.local},{a.steps},{a.freeze_step},{n},{r},"
                            f"{x['gradient_buffer']},{x['vmhwm_peak_bytes']},"
                            f"{x['ru_maxrss_peak_bytes']},{ph['init']['vmhwm_bytes']},"
                            f"{ph['train']['vmhwm_bytes']},{ph['end']['vmhwm_bytes']},"
                            f"{mark_of(x, 'train', 2)},{mark_of(x, 'model', 2)},"
                            f"{mark_of(x, 'imported', 2)},{model_peak(a, setup, n)},"
                            + ",".join(str(model_phase(a, setup, n, ph)) for ph in PHASES)
                            + "\n")
    with open(os.path.join(out, "slopes.json"), "w") as f:
        json.dump(slopes, f, indent=1)
    print(text)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "train":
        return train(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setups", default="A,B,C,A_none")
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
