"""Where a GPU worker's step goes: the model's compute, then onebit's optimizer
step split into compression, PCIe copies, the exchange and the update, with the bytes that
crossed PCIe per step, against torch.optim.AdamW (fused where the device's PyTorch has it)
on the same model in the same process.

    python3 tools/gpu/step_bench.py --model gpt2 --device cuda --result gpt2_w1.json \\
        --config '{"optimizer": {"params": {"comm_backend_name": "nccl"}}}'

Launched torchrun-style for several workers (python3 -m onebit.run ...); every rank uses
the same GPU (cuda:0) unless --gpu_per_rank: "4 workers sharing the GPU". Models: those of
examples/gpt/gpt.py (tiny, small, gpt2 = GPT-2 small's 124M, 1b = 1.07B), synthetic tokens.

Per step it times, with the device synchronised: compute (zero_grad, forward, backward)
and the optimizer's step() as the script sees it. The worker's own split of each step
(compress, exchange, update, device_copy; from its summary file) and its PCIe bytes
(Backend::host_transfers: what the optimizer step copied between GPU and host) come per
stage. Rank 0 writes --result (JSON) and prints a table; it first runs --adamw_steps of
AdamW on a copy of the model (the baseline, alone on the device: the other ranks wait for
rank 0 to start the job; freed before onebit starts).

With one worker, 1-bit Adam's compression stage compresses nothing (there is nothing to
exchange: the step is the frozen-variance update), so the compression-stage work is
measured with two or more workers (sharing the GPU through gloo or the shards).
"""
import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "examples", "gpt"))
import gpt  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(gpt.SIZES), default="gpt2")
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--gpu_per_rank", action="store_true",
                   help="rank r on cuda:LOCAL_RANK (default: every rank on cuda:0)")
    p.add_argument("--batch", type=int, default=1, help="windows per worker and step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--freeze_step", type=int, default=10)
    p.add_argument("--adamw_steps", type=int, default=15, help="0: no AdamW baseline")
    p.add_argument("--amp", choices=("none", "bf16"), default="bf16")
    # With the variance frozen after 10 steps on random tokens, eps 1e-8 let GPT-2's
    # near-zero-variance parameters blow up (NaN at step 17 on an H100): a timing run,
    # not a recipe, so the eps the trainer's own advice names.
    p.add_argument("--eps", type=float, default=1e-5, help="OneBitAdam's eps")
    p.add_argument("--config", default="{}", help="job config (JSON text) merged into onebit's")
    p.add_argument("--label", default="", help="a name for this run in the result")
    p.add_argument("--result", help="rank 0: the result as JSON")
    p.add_argument("--profile_steps", type=int, default=0,
                   help="profile K compression steps from the middle of the stage with "
                        "torch.profiler (left out of the script's timings, not of the worker's "
                        "split): step()'s kernels and copies by device time per step")
    return p.parse_args()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_after_first(values):
    """The median, leaving out the first value (set-up) when there are others."""
    rest = values[1:] if len(values) > 1 else values
    return statistics.median(rest) if rest else float("nan")


def compute_step(model, x, y, autocast):
    with autocast:
        loss = gpt.loss_of(model, x, y)
    loss.backward()
    return loss


def adamw_baseline(model, data, args, device, autocast):
    """Median seconds of compute and of AdamW's step() over --adamw_steps steps."""
    fused = device.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0,
                            **({"fused": True} if fused else {}))
    compute, stepped = [], []
    for step in range(1, args.adamw_steps + 1):
        x, y = data(step)
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        compute_step(model, x, y, autocast)
        sync(device)
        t1 = time.perf_counter()
        opt.step()
        sync(device)
        t2 = time.perf_counter()
        compute.append(t1 - t0)
        stepped.append(t2 - t1)
    return {"name": "torch.optim.AdamW" + (" (fused)" if fused else ""),
            "compute_s": median_after_first(compute), "step_s": median_after_first(stepped),
            "steps": args.adamw_steps}


def add_profile(prof, device, profiled):
    """Adds the profiler's events into profiled["device"] and profiled["host"] (name ->
    [calls, microseconds]). Device: on a GPU its activities (kernels, copies) by their
    device time; the operators that launched them are left out, since their "self device
    time" counts the same kernels again (torch 2.11: OneBitAdam.step's row held every kernel
    the C++ worker launched). Host: the operators and the runtime's calls (cudaLaunchKernel,
    cudaStreamSynchronize) by self CPU time, and step()'s phases (onebit.torch's
    "onebit.step: ..." ranges) by their whole CPU time: where the host's part of a step goes."""
    from torch.autograd import DeviceType  # noqa: PLC0415
    for e in prof.key_averages():
        if e.device_type != DeviceType.CPU:
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0.0)
            rows = profiled["device"] if device.type == "cuda" else None
        elif e.key.startswith("onebit.step: "):
            us, rows = e.cpu_time_total, profiled["host"]
        else:
            us, rows = e.self_cpu_time_total, profiled["host"]
        if rows is not None and us > 0:
            row = rows.setdefault(e.key, [0, 0.0])
            row[0] += e.count
            row[1] += us


def profile_rows(rows, steps, limit=40):
    """The largest `limit` rows as [{name, calls_per_step, ms_per_step}]."""
    top = sorted(rows.items(), key=lambda kv: -kv[1][1])[:limit]
    return [{"name": name, "calls_per_step": calls / steps, "ms_per_step": us / 1e3 / steps}
            for name, (calls, us) in top]


def print_profile(title, events, limit=25):
    print(title, flush=True)
    for e in events[:limit]:
        print(f"    {e['ms_per_step']:9.3f} ms  {e['calls_per_step']:6.1f} calls  "
              f"{e['name'][:100]}", flush=True)


def merge(a, b):
    for k, v in b.items():
        a[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return a


def main():
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        device = torch.device(f"cuda:{local_rank if args.gpu_per_rank else 0}")
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    size = gpt.SIZES[args.model]
    train, _ = gpt.synthetic_corpus(size.vocab, tokens=1 << 20, seed=1)

    def data(step):
        x, y = gpt.batch(train, size.block, 1, step, rank, args.batch)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.amp == "bf16"
                else torch.autocast(device.type, enabled=False))
    model = gpt.make_model(size, 1).to(device)
    n = gpt.parameter_count(model)
    result = {"label": args.label, "model": args.model, "parameters": n, "workers": world,
              "device": str(device), "batch": args.batch, "block": size.block, "amp": args.amp,
              "steps": args.steps, "freeze_step": args.freeze_step, "eps": args.eps,
              "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    if rank == 0:
        print(f"{args.label or 'step_bench'}: {n:,} parameters ({args.model}), {world} "
              f"worker(s) on {result['gpu']}", flush=True)
    # The baseline on rank 0 alone: the other ranks wait for it in onebit's rendezvous.
    if rank == 0 and args.adamw_steps > 0:
        baseline = copy.deepcopy(model)
        result["adamw"] = adamw_baseline(baseline, data, args, device, autocast)
        del baseline
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"  {result['adamw']['name']}: step {result['adamw']['step_s'] * 1e3:.2f} ms, "
              f"compute {result['adamw']['compute_s'] * 1e3:.1f} ms", flush=True)

    import onebit.torch as ot  # noqa: PLC0415
    summary_dir = tempfile.mkdtemp(prefix="onebit-step-bench-")
    os.environ["ONEBIT_SUMMARY_FILE"] = os.path.join(summary_dir, "worker-{rank}.json")
    config = merge({"steps": args.steps}, json.loads(args.config))
    opt = ot.OneBitAdam(model.parameters(), lr=1e-4, eps=args.eps,
                        freeze_step=args.freeze_step, config=config)
    stages = {"warmup": {"compute": [], "step": []}, "compression": {"compute": [], "step": []}}
    # The profiled steps sit in the middle of the compression stage: the last step also
    # ends the job (the final parameters and state copied out), which no other step does.
    first_profiled = last_profiled = None
    if args.profile_steps > 0:
        room = args.steps - args.freeze_step - args.profile_steps
        if room < 2:
            raise SystemExit("--profile_steps: leave a compression step before the profiled "
                             "ones and one after them")
        first_profiled = args.freeze_step + 1 + room // 2
        last_profiled = first_profiled + args.profile_steps - 1
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    # name -> [calls, microseconds] over the profiled steps' step()
    profiled = {"device": {}, "host": {}}
    while not opt.done:
        step = opt.next_step
        profiling = first_profiled is not None and first_profiled <= step <= last_profiled
        x, y = data(step)
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = compute_step(model, x, y, autocast)
        sync(device)
        t1 = time.perf_counter()
        if profiling:  # step() alone, not the compute; not timed
            with torch.profiler.profile(activities=activities) as prof:
                opt.step(loss=loss)
                sync(device)
            add_profile(prof, device, profiled)
            continue
        opt.step(loss=loss)
        sync(device)
        t2 = time.perf_counter()
        stage = stages["warmup" if step <= args.freeze_step else "compression"]
        stage["compute"].append(t1 - t0)
        stage["step"].append(t2 - t1)
    if first_profiled is not None:
        result["profile"] = {
            "steps": args.profile_steps,
            "events": profile_rows(profiled["device"], args.profile_steps),
            "host_events": profile_rows(profiled["host"], args.profile_steps)}
    opt.close()
    with open(os.path.join(summary_dir, f"worker-{rank}.json")) as f:
        summary = json.load(f)
    result["onebit"] = {"config": config, "exchange": summary["exchange"]}
    for name, times in stages.items():
        steps = summary[f"{name}_steps"]
        split = summary[f"split_{name}"]
        per_step = {k: v / steps for k, v in split.items()} if steps else {}
        down = summary[f"device_bytes_to_host_{name}"] / max(steps, 1)
        up = summary[f"device_bytes_from_host_{name}"] / max(steps, 1)
        result["onebit"][name] = {
            "steps": steps,
            "compute_s": median_after_first(times["compute"]),
            "optimizer_step_s": median_after_first(times["step"]),
            "worker_split_s": per_step,  # the worker's mean per step
            # The optimizer's own work: compression, the copies, the update (not the wait
            # for the network or the other workers).
            "optimizer_work_s": sum(per_step.get(k, 0.0) for k in ("compress", "update", "device_copy")),
            "pcie_bytes_to_host": down, "pcie_bytes_from_host": up,
            "pcie_bytes_per_fp32_tensor": (down + up) / (4 * n),
        }
    if "adamw" in result:
        c = result["onebit"]["compression"]
        base = result["adamw"]["step_s"]
        result["compression_work_over_adamw"] = c["optimizer_work_s"] / base
        result["compression_step_over_adamw"] = c["optimizer_step_s"] / base
    if rank == 0:
        for name in ("warmup", "compression"):
            r = result["onebit"][name]
            s = r["worker_split_s"]
            print(f"  onebit {name:11s}: compute {r['compute_s'] * 1e3:8.1f} ms  step() "
                  f"{r['optimizer_step_s'] * 1e3:8.2f} ms = compress {s.get('compress', 0) * 1e3:.2f}"
                  f" + exchange {s.get('exchange', 0) * 1e3:.2f} + update "
                  f"{s.get('update', 0) * 1e3:.2f} ms (PCIe copies {s.get('device_copy', 0) * 1e3:.2f}"
                  f" ms of those); PCIe {r['pcie_bytes_to_host'] / 1e6:.2f} MB down, "
                  f"{r['pcie_bytes_from_host'] / 1e6:.2f} MB up per step "
                  f"({r['pcie_bytes_per_fp32_tensor']:.4f} of one fp32 tensor)", flush=True)
        if "compression_work_over_adamw" in result:
            print(f"  compression-stage optimizer work / AdamW step: "
                  f"{result['compression_work_over_adamw']:.2f}x (step() as the script sees it: "
                  f"{result['compression_step_over_adamw']:.2f}x)", flush=True)
        if "profile" in result:
            prof = result["profile"]
            steps = args.profile_steps
            if prof["events"]:
                print_profile(f"  step() of {steps} compression steps under torch.profiler, by "
                              "self device time per step:", prof["events"])
            print_profile("  the host's part of the same steps (the profiler's records slow it): "
                          "step()'s phases by CPU time, the rest by self CPU time, per step:",
                          prof["host_events"])
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
