"""What the examples' ddp_adam.py share: the baseline's loop, plain torch.optim.Adam over
DistributedDataParallel (torch.distributed, gloo on 127.0.0.1) in the job config's worker
count of processes (torch.multiprocessing). Adam's hyper-parameters, the seed, the per-worker
batch and the steps come from the job config that train.py reads.

An example's ddp_adam.py calls main() with its flags and a class that holds its model and data,
one instance per rank, built in that rank's process:

    Example(ctx)                         ctx: args, job, rank, world, seed, batch, steps;
                                         sets .model, every rank the same (it seeds)
    .loss(model, step)                   the rank's loss at step (1-based), through the DDP
                                         model
    .progress(model, step, losses)       rank 0, after each step: None, or what to print
    .result(model, run)                  rank 0, after the last step (run: losses, seconds,
                                         bytes_per_step, the gradient bytes one rank
                                         allreduces a step): the result's fields after
                                         optimizer, steps, workers and batch_per_worker,
                                         and what to print

Rank 0 writes the training loss of each of its steps to --loss_csv (step,loss) and the result
to --result (JSON).
"""
import argparse
import json
import socket
import time
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def _run(rank, world, port, job, steps, args, example):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    ctx = types.SimpleNamespace(args=args, job=job, rank=rank, world=world, seed=job["seed"],
                                batch=job["train_micro_batch_size_per_gpu"], steps=steps)
    ex = example(ctx)
    model = DistributedDataParallel(ex.model)
    hp = job["optimizer"]["params"]
    opt = torch.optim.Adam(model.parameters(), lr=hp.get("lr", 1e-3),
                           betas=tuple(hp.get("betas", (0.9, 0.999))), eps=hp.get("eps", 1e-8),
                           weight_decay=hp.get("weight_decay", 0.0))
    start, losses = time.time(), []
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = ex.loss(model, step)
        loss.backward()  # DDP averages the gradients over the ranks (fp32 allreduce)
        opt.step()
        losses.append(loss.item())
        if rank == 0:
            line = ex.progress(model.module, step, losses)
            if line is not None:
                print(f"[adam] step {step}: {line} ({time.time() - start:.1f} s)", flush=True)
    seconds = time.time() - start
    if rank == 0:
        with open(args.loss_csv, "w") as f:
            f.write("step,loss\n")
            f.writelines(f"{i + 1},{v:.6f}\n" for i, v in enumerate(losses))
        run = types.SimpleNamespace(losses=losses, seconds=seconds,
                                    bytes_per_step=4 * sum(p.numel() for p in model.parameters()))
        fields, line = ex.result(model.module, run)
        result = {"optimizer": "torch.optim.Adam over DDP (gloo)", "steps": steps,
                  "workers": world, "batch_per_worker": ctx.batch, **fields}
        with open(args.result, "w") as f:
            json.dump(result, f, indent=2)
        print(f"[adam] {line} after {steps} steps ({seconds:.1f} s)", flush=True)
    dist.destroy_process_group()


def mean_last(losses, n):
    """The mean of the last n losses (all of them, when there are fewer)."""
    return sum(losses[-n:]) / len(losses[-n:])


def main(doc, example, flags=()):
    """Parses the command line (the shared flags and `flags`: (name, keyword arguments) for
    add_argument) and runs `example` in the job's worker count of processes."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--config", required=True, help="the job config train.py uses (JSON)")
    parser.add_argument("--result", required=True, help="rank 0's result JSON")
    parser.add_argument("--loss_csv", required=True,
                        help="rank 0's training loss per step (CSV)")
    parser.add_argument("--steps", type=int, default=0, help="override the config's steps")
    for name, kwargs in flags:
        parser.add_argument(name, **kwargs)
    args = parser.parse_args()
    with open(args.config) as f:
        job = json.load(f)
    world = job["onebit"]["workers"]
    steps = args.steps or job["steps"]
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_run, args=(world, port, job, steps, args, example), nprocs=world, join=True)
