"""Trains the GPT-style model of gpt.py with one optimizer, launched the way torchrun
launches (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; one process per worker):

    torchrun --nproc_per_node=4 examples/gpt/train.py --optimizer onebit_adam --steps 300

Optimizers (the same model, data, seed, lr, betas and eps for each):
    onebit_adam     onebit.torch.OneBitAdam: full-precision warmup, then 1-bit momentum
    zero_one_adam   onebit.torch.ZeroOneAdam (0/1 Adam: 1-bit, variance freezing, local steps)
    ddp_adam        torch.optim.Adam over DistributedDataParallel (gloo on CPU, NCCL on GPU)
    ddp_fp16        the same with DDP's fp16 compression hook
    ddp_powersgd    the same with DDP's PowerSGD hook (rank --powersgd_rank, vanilla
                    allreduce until --freeze_step, as onebit's warmup)
    adamw           torch.optim.AdamW in one process (fused where PyTorch has it): the
                    single-GPU baseline

Rank 0 writes --csv (step, seconds since the first step began, loss, stage) and --result
(JSON: losses, held-out loss, time, step times per stage). Progress every --log_every steps.
"""
import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402

OPTIMIZERS = ("onebit_adam", "zero_one_adam", "ddp_adam", "ddp_fp16", "ddp_powersgd", "adamw")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--optimizer", choices=OPTIMIZERS, required=True)
    p.add_argument("--size", choices=sorted(gpt.SIZES), default="small")
    p.add_argument("--block", type=int, default=0,
                   help="tokens of context (default: the size's; fewer for GPT-2 on a CPU)")
    p.add_argument("--data", choices=("gcide", "synthetic"), default="gcide")
    p.add_argument("--limit_bytes", type=int, default=0, help="read only this much of the corpus")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=2, help="windows per worker and step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.99))
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--update_clip", type=float, default=None,
                   help="onebit: the bound on each element's frozen-variance update "
                        "(default: the package's, 2; 0: none)")
    p.add_argument("--schedule", choices=("constant", "cosine"), default="constant",
                   help="cosine: lr rises linearly over --warmup_steps, then falls along a "
                   "cosine to 10%% of --lr at the last step (a torch LambdaLR, for every "
                   "optimizer)")
    p.add_argument("--warmup_steps", type=int, default=20)
    p.add_argument("--freeze_step", type=int, default=45,
                   help="1-bit Adam's warmup steps (also 0/1 Adam's var_freeze_step and "
                   "PowerSGD's start)")
    p.add_argument("--local_step_scaler", type=int, default=60,
                   help="0/1 Adam: steps after var_freeze_step before local steps start")
    p.add_argument("--local_step_clipper", type=int, default=4,
                   help="0/1 Adam: the longest run of local steps")
    p.add_argument("--powersgd_rank", type=int, default=4)
    p.add_argument("--powersgd_hook", choices=("layerwise", "batched", "synchronous"),
                   default="layerwise",
                   help="ddp_powersgd: torch's powerSGD_hook (one low-rank pair per "
                   "matrix), its batched_powerSGD_hook (the whole bucket as one square "
                   "matrix), or this script's synchronous_powersgd_hook (powerSGD_hook's "
                   "algorithm with blocking collectives: torch 1.13's hooks over gloo "
                   "crashed on the emulated cluster)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (each rank its LOCAL_RANK's GPU)")
    p.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none",
                   help="autocast of the forward and backward (the parameters stay float32); "
                        "fp16 with loss scaling: onebit's (the config's fp16 block, "
                        "opt.scale(loss)) or torch's GradScaler for the others. fp16 autocast "
                        "needs CUDA: on the CPU the model computes in fp32, the loss scaled")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--log_every", type=int, default=20)
    p.add_argument("--csv", help="rank 0: every step's loss and time")
    p.add_argument("--result", help="rank 0: the result as JSON")
    p.add_argument("--overlap", choices=("auto", "on", "off"), default="auto",
                   help="onebit: the warmup exchange during backward (auto: on for CPU "
                   "tensors in peer mode)")
    p.add_argument("--config", help="onebit: a job config (path) for the rest (exchange mode, ...)")
    p.add_argument("--save", help="at the end, each rank torch.saves the model, the optimizer "
                   "and the step to this path ({rank} in it: the rank's own file)")
    p.add_argument("--resume", help="torch.load such a file before the first step and go on "
                   "from its step to --steps ({rank} in it: the rank's own file)")
    return p.parse_args()


def launcher():
    """(rank, world size, local rank) from torchrun's variables (one process: 0, 1, 0)."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def batch_matrices(module):
    """torch 1.13's (and 2.15's) batched_powerSGD_hook hands _orthogonalize one 2-D matrix, and
    _orthogonalize asserts a batch of them (3-D): every compressed step fails with a bare
    AssertionError. Give the 2-D matrix a batch dimension (a view: the orthogonalisation
    writes in place, through it)."""
    orthogonalize = module._orthogonalize  # noqa: SLF001
    if getattr(orthogonalize, "batches_matrices", False):
        return

    def batched(matrices, epsilon=0):
        return orthogonalize(matrices.unsqueeze(0) if matrices.dim() == 2 else matrices, epsilon)

    batched.batches_matrices = True
    module._orthogonalize = batched  # noqa: SLF001


def synchronous_powersgd_hook(rank, start_iter, seed, min_compression_rate=2.0):
    """A DDP communication hook with torch's powerSGD_hook algorithm (Vogels et al. 2019:
    error feedback, warm-started Q, one power iteration per step; vectors and matrices
    that would not shrink min_compression_rate-fold are allreduced whole; plain allreduce
    before start_iter), whose collectives block in the hook instead of running from
    future callbacks: over torch 1.13's gloo the callbacks' collectives crossed messages
    on the emulated cluster (gloo enforce `op.preamble.length <= op.nbytes`)."""
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (  # noqa: PLC0415
        _orthogonalize)
    state = {"iter": 0, "error": {}, "q": {}, "rng": torch.Generator().manual_seed(seed)}

    def done(tensor):
        fut = torch.futures.Future()
        fut.set_result(tensor)
        return fut

    def hook(process_group, bucket):
        world = dist.get_world_size(process_group)
        buffer = bucket.buffer()
        index = bucket.index()
        if bucket.is_last():
            state["iter"] += 1
        if state["iter"] <= start_iter:
            dist.all_reduce(buffer, group=process_group)
            return done(buffer.div_(world))
        if index in state["error"]:
            buffer.add_(state["error"][index])
        before = buffer.clone()
        matrices, whole = [], []
        for grad in bucket.gradients():
            m = grad.view(grad.shape[0], -1) if grad.dim() > 1 else None
            if m is not None and m.numel() > min_compression_rate * rank * sum(m.shape):
                matrices.append(m)
            else:
                whole.append(grad)
        if whole:
            flat = torch.cat([g.reshape(-1) for g in whole])
            dist.all_reduce(flat, group=process_group)
            flat.div_(world)
            offset = 0
            for g in whole:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        if matrices:
            if index not in state["q"]:  # the same random Q on every worker (same seed)
                state["q"][index] = [torch.randn(m.shape[1], rank, generator=state["rng"])
                                     for m in matrices]
            qs = state["q"][index]
            for q in qs:
                _orthogonalize(q.unsqueeze(0))
            ps = torch.cat([(m @ q).reshape(-1) for m, q in zip(matrices, qs)])
            dist.all_reduce(ps, group=process_group)
            offset, p_list = 0, []
            for m in matrices:
                p = ps[offset:offset + m.shape[0] * rank].view(m.shape[0], rank)
                _orthogonalize(p.unsqueeze(0))
                p_list.append(p)
                offset += p.numel()
            new_q = torch.cat([(m.t() @ p).reshape(-1) for m, p in zip(matrices, p_list)])
            dist.all_reduce(new_q, group=process_group)
            new_q.div_(world)
            offset = 0
            for i, (m, p) in enumerate(zip(matrices, p_list)):
                q = new_q[offset:offset + m.shape[1] * rank].view(m.shape[1], rank)
                offset += q.numel()
                torch.matmul(p, q.t(), out=m)
                qs[i] = q.clone()
        state["error"][index] = before - buffer
        return done(buffer)

    return hook


def build_optimizer(args, model, device, world):
    """(optimizer, the model to call, a function of the step giving its stage name)."""
    common = dict(lr=args.lr, betas=tuple(args.betas), eps=args.eps)
    if args.optimizer in ("onebit_adam", "zero_one_adam"):
        import onebit.torch as ot  # noqa: PLC0415
        common["overlap"] = {"auto": None, "on": True, "off": False}[args.overlap]
        if args.update_clip is not None:
            common["update_clip"] = args.update_clip
        config = args.config
        if args.amp == "fp16":  # onebit's loss scaling, agreed by every worker
            config = ot.load_config(args.config)
            config["fp16"] = dict(config.get("fp16", {}), enabled=True)
        if args.optimizer == "onebit_adam":
            opt = ot.OneBitAdam(model.parameters(), freeze_step=args.freeze_step,
                                config=config, **common)
        else:
            opt = ot.ZeroOneAdam(model.parameters(), var_freeze_step=args.freeze_step,
                                 local_step_scaler=args.local_step_scaler,
                                 local_step_clipper=args.local_step_clipper,
                                 config=config, **common)
        return opt, model, lambda t: "warmup" if t <= args.freeze_step else "compression"
    if args.optimizer == "adamw":
        if world != 1:
            raise SystemExit("--optimizer adamw is the one-process baseline (WORLD_SIZE 1)")
        fused = device.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames
        opt = torch.optim.AdamW(model.parameters(), weight_decay=0.0,
                                **({"fused": True} if fused else {}), **common)
        print(f"torch.optim.AdamW{' (fused)' if fused else ''}", flush=True)
        return opt, model, lambda t: "all"
    import torch.distributed as dist  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: PLC0415
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    # PowerSGD over gloo: one bucket (its hook hung here whenever DDP made several;
    # pytorch/pytorch#58467). DDP's first bucket has its own cap (1 MB), raised too.
    bucket_mb = 25
    if args.optimizer == "ddp_powersgd":
        bucket_mb = 1024
        dist._DEFAULT_FIRST_BUCKET_BYTES = bucket_mb << 20  # noqa: SLF001
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=bucket_mb)
    stage = lambda t: "all"  # noqa: E731
    if args.optimizer == "ddp_fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: PLC0415
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.optimizer == "ddp_powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook  # noqa: PLC0415
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=max(2, args.freeze_step), random_seed=args.seed)
        hook = powerSGD_hook.powerSGD_hook
        if args.powersgd_hook == "batched":
            hook = powerSGD_hook.batched_powerSGD_hook
            batch_matrices(powerSGD_hook)
        elif args.powersgd_hook == "synchronous":
            state = None
            hook = synchronous_powersgd_hook(args.powersgd_rank, max(2, args.freeze_step),
                                             args.seed)
        ddp.register_comm_hook(state, hook)
        stage = lambda t: "warmup" if t <= max(2, args.freeze_step) else "powersgd"  # noqa: E731
    return torch.optim.Adam(model.parameters(), **common), ddp, stage


def main():
    args = parse_args()
    rank, world, local_rank = launcher()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{local_rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    size = gpt.SIZES[args.size]
    if args.block:
        size = dataclasses.replace(size, block=args.block)
    if args.data == "gcide":
        train, held_out = gpt.load_corpus(limit_bytes=args.limit_bytes or None)
        if size.vocab != 256:
            raise SystemExit(f"--size {args.size} has a vocabulary of {size.vocab}: the corpus "
                             "is bytes (256); use --data synthetic")
    else:
        train, held_out = gpt.synthetic_corpus(size.vocab, seed=args.seed)
    model = gpt.make_model(size, args.seed).to(device)
    opt, forward, stage_of = build_optimizer(args, model, device, world)
    scheduler = None
    if args.schedule == "cosine":
        def factor(done):  # LambdaLR's argument: the steps taken so far
            t = done + 1
            if t <= args.warmup_steps:
                return t / args.warmup_steps
            progress = (t - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    n = gpt.parameter_count(model)
    if rank == 0:
        print(f"{args.optimizer}: {n:,} parameters ({args.size}), {world} workers x batch "
              f"{args.batch} x {size.block} tokens, {args.steps} steps, {device}", flush=True)
    onebit = args.optimizer in ("onebit_adam", "zero_one_adam")
    precision = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    if precision == torch.float16 and device.type != "cuda":
        precision = None  # CPU autocast takes bf16 only; the loss scaling still runs
        if rank == 0:
            print("--amp fp16 on the CPU: the model computes in fp32, the loss is scaled",
                  flush=True)
    autocast = (torch.autocast(device.type, dtype=precision) if precision is not None
                else torch.autocast(device.type, enabled=False))
    # torch's loss scaling for DDP and AdamW (their gradients are averaged before the
    # scaler looks, so every worker skips alike); onebit scales through opt.scale.
    # torch.amp.GradScaler where torch has it (2.3+); torch.cuda.amp's is deprecated there.
    scaler_type = (functools.partial(torch.amp.GradScaler, "cuda")
                   if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler)
    scaler = scaler_type(enabled=args.amp == "fp16" and device.type == "cuda" and not onebit)
    first = 1
    if args.resume:
        # As with torch.optim: the model and the optimizer loaded before the first step (a
        # onebit job then starts after the saved step).
        saved = torch.load(args.resume.format(rank=rank), map_location=device)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(saved["scheduler"])
        first = saved["step"] + 1
        if rank == 0:
            print(f"resumed from {args.resume.format(rank=rank)} after step {saved['step']}",
                  flush=True)
    if onebit:
        # Where the job stands: a job that a launcher restarted resumes after its last
        # checkpoint (onebit.checkpoint.dir), and the script follows: its batches are a
        # function of the step, and the lr schedule is brought to that step.
        joined = opt.next_step
        if scheduler is not None and joined > first:
            with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()"
                warnings.simplefilter("ignore", UserWarning)
                for _ in range(joined - first):
                    scheduler.step()
        if rank == 0 and joined > first:
            print(f"the job resumed after step {joined - 1}", flush=True)
        first = joined
    rows, start = [], None
    for step in range(first, args.steps + 1):
        x, y = gpt.batch(train, size.block, args.seed, step, rank, args.batch)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        began = time.perf_counter()
        if start is None:
            start = began
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = gpt.loss_of(forward, x, y)
        if onebit:
            (opt.scale(loss) if args.amp == "fp16" else loss).backward()
            opt.step(loss=loss)
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        if scheduler is not None:
            scheduler.step()
        value = loss.item()  # also waits for the device
        now = time.perf_counter()
        rows.append((step, now - start, now - began, value, stage_of(step)))
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            recent = [r[3] for r in rows[-args.log_every:]]
            print(f"step {step}: loss {statistics.mean(recent):.4f} ({now - start:.1f} s, "
                  f"{rows[-1][2] * 1e3:.0f} ms/step)", flush=True)
    seconds = rows[-1][1]
    if onebit:
        opt.close()  # the job ends after the last step every worker ran; the final model
    if args.save:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "step": args.steps}, args.save.format(rank=rank))
    if rank == 0:
        final = gpt.held_out_loss(model, held_out, size.block, device=device)
        stages = {}
        for _, _, dt, _, stage in rows[1:]:  # the first step sets up
            stages.setdefault(stage, []).append(dt)
        result = {
            "optimizer": args.optimizer, "size": args.size, "parameters": n, "workers": world,
            "batch": args.batch, "block": size.block, "steps": args.steps, "device": str(device),
            "amp": args.amp, "seconds": seconds, "held_out_loss": final,
            "train_loss_last20": statistics.mean(r[3] for r in rows[-20:]),
            "median_step_s": {k: statistics.median(v) for k, v in stages.items()},
            "steps_per_s": {k: 1 / statistics.median(v) for k, v in stages.items()},
            "freeze_step": args.freeze_step, "lr": args.lr, "betas": list(args.betas),
            "eps": args.eps, "schedule": args.schedule, "warmup_steps": args.warmup_steps,
            "overlap": args.overlap,
        }
        if args.optimizer == "ddp_powersgd":
            result["powersgd"] = {"rank": args.powersgd_rank, "hook": args.powersgd_hook}
        if args.optimizer in ("onebit_adam", "zero_one_adam"):
            import onebit.torch as ot  # noqa: PLC0415
            exchange = ot.load_config(args.config).get("onebit", {}).get("exchange", {})
            result["warmup_dtype"] = exchange.get("warmup_dtype", "fp32")
        if args.optimizer == "zero_one_adam":
            result["local_step_scaler"] = args.local_step_scaler
            result["local_step_clipper"] = args.local_step_clipper
        result["torch"] = torch.__version__
        if args.csv:
            with open(args.csv, "w") as f:
                f.write("step,seconds,step_seconds,loss,stage\n")
                f.writelines(f"{s},{t:.4f},{dt:.4f},{v:.5f},{st}\n" for s, t, dt, v, st in rows)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f, indent=1)
        print(f"{args.optimizer}: held-out loss {final:.4f}, last-20 train loss "
              f"{result['train_loss_last20']:.4f}, {seconds:.1f} s, steps/s "
              + ", ".join(f"{k} {v:.2f}" for k, v in result["steps_per_s"].items()), flush=True)
    if args.optimizer.startswith("ddp"):
        import torch.distributed as dist  # noqa: PLC0415
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
