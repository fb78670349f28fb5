#!/usr/bin/env python3
"""PyTorch DDP with Adam over gloo: the baseline a user would otherwise pick.

One process per worker (the bench starts each in its network namespace):

    ddp_baseline.py --rank R --world W --master ADDR:PORT --workload synthetic \
        --parameters N --steps S --out result.json

Workloads, matched to onebit's (worker/workloads/):
  synthetic      onebit's quadratic bowl: worker r's gradient at step t is
                 g_i = (p_i - target_i) + noise * u_i, u uniform with variance 1, and the
                 loss 0.5 * mean (p - target)^2. onebit computes target_i and u_i from a hash
                 of (seed, step, rank, i) inside one fused SIMD loop (read p, write g); here
                 both are drawn once into memory (torch's generator costs ~10x onebit's loop)
                 and the noise of a chunk rotates between chunks from step to step. The
                 gradient is formed by a custom autograd function in a few vectorised passes
                 (p - target, its dot product, + noise * u): more memory passes than onebit's
                 one loop, no random numbers per step. Its cost is measured (--compute_steps)
                 and reported beside onebit's.
                 The parameters are split into tensors of --chunk elements (like a model's
                 layers), so DDP buckets them (25 MB buckets, its default) and starts the
                 allreduce of a bucket while the backward of the others still runs.
  fashion_mnist  the MLP of onebit's demo: 784-256-128-10, ReLU, softmax cross entropy,
                 --micro_batch examples per worker and step, from Debian's
                 dataset-fashion-mnist.
Adam: torch.optim.Adam (lr 1e-3, betas 0.9/0.999, eps 1e-8), single-threaded like a onebit
worker (torch.set_num_threads(1)).

Communication hooks (--comm_hook), torch's own (torch.distributed.algorithms.ddp_comm_hooks):
  fp16, bf16     fp16_compress_hook, bf16_compress_hook: the buckets in 16 bits on the wire.
  powersgd       powerSGD_hook: each matrix of a bucket as two rank --powersgd_rank factors,
                 vectors allreduced whole; error feedback and warm start (torch's defaults).
  batched_powersgd
                 batched_powerSGD_hook: each bucket as one square matrix. In torch 1.13 and
                 2.15 it hands _orthogonalize a 2-D matrix where that asserts a batch (3-D),
                 and every compressed step fails with a bare AssertionError; the matrix is
                 given a batch dimension here, as examples/gpt/train.py does.
Both PowerSGD hooks allreduce the whole gradient until --powersgd_start steps have run
(PowerSGDState.start_powerSGD_iter), as 1-bit Adam warms up. Over gloo they hang as soon
as DDP has two buckets (torch 1.13 and 2.15 alike; pytorch/pytorch#58467: each bucket's
hook issues its next collective from the previous one's callback, so the ranks can issue
them in different orders), so with them DDP makes one bucket (first bucket and cap of
10 GB): the allreduce no longer overlaps the backward. With --matrix_cols C the
synthetic workload's chunks are matrices of C columns (where C divides them), so that
powerSGD_hook has matrices to compress; the gradient is the same either way.

Timing: --compute_steps steps under model.no_sync() (no allreduce: the compute and the
optimizer alone) and then --steps steps of DDP; each step's wall time is written, and the
bench drops the first DDP step (it builds the buckets and connects).
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

SQRT3 = math.sqrt(3.0)


class BowlGrad(torch.autograd.Function):
    """loss = 0.5 * sum (p - target)^2; d loss / d p = (p - target) + noise * u."""

    @staticmethod
    def forward(ctx, p, target, u, noise):
        d = p - target
        ctx.save_for_backward(d, u)
        ctx.noise = noise
        flat = d.view(-1)
        return 0.5 * torch.dot(flat, flat)

    @staticmethod
    def backward(ctx, grad_out):
        d, u = ctx.saved_tensors
        g = d.add_(u, alpha=ctx.noise)  # d is not needed after this
        if grad_out.item() != 1.0:
            g.mul_(grad_out)
        return g, None, None, None


class Synthetic(nn.Module):
    def __init__(self, n, chunk, seed, rank, noise, cols=0):
        super().__init__()
        sizes = [min(chunk, n - i) for i in range(0, n, chunk)]
        shapes = [(s // cols, cols) if cols and s % cols == 0 else (s,) for s in sizes]
        self.chunks = nn.ParameterList([nn.Parameter(torch.zeros(*sh)) for sh in shapes])
        self.n, self.noise = n, noise
        # The target (the same on every worker) and this worker's noise are drawn once, one
        # tensor per parameter chunk; at step t chunk j takes the noise of chunk (j + t) mod
        # J, so the noise changes from step to step at the cost of one read. (onebit hashes
        # both from (seed, step, rank, i) inside its gradient loop; torch's generator costs
        # about ten times that loop, which would make DDP's step mostly random numbers.)
        g = torch.Generator()
        g.manual_seed(seed)
        self.targets = [torch.rand(*sh, generator=g).mul_(2).sub_(1) for sh in shapes]
        g.manual_seed(seed * 1000003 + 7919 * (rank + 1))
        self.noises = [torch.rand(chunk, generator=g).mul_(2 * SQRT3).sub_(SQRT3)
                       for _ in sizes]

    def forward(self, step):
        total = 0.0
        k = len(self.chunks)
        for j, p in enumerate(self.chunks):
            u = self.noises[(j + step) % k][:p.numel()].view_as(p)
            total = total + BowlGrad.apply(p, self.targets[j], u, self.noise)
        return total / self.n


def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class FashionMnist:
    def __init__(self, root, micro_batch, rank, world, seed):
        images = read_idx(os.path.join(root, "train-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(root, "train-labels-idx1-ubyte.gz"))
        self.x = torch.from_numpy(images.reshape(len(images), -1).astype("float32") / 255.0)
        self.y = torch.from_numpy(labels.astype("int64"))
        self.b, self.rank, self.world = micro_batch, rank, world
        self.gen = torch.Generator()
        self.gen.manual_seed(seed)
        self.perm = torch.randperm(len(self.y), generator=self.gen)
        self.pos = 0
        self.model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                   nn.Linear(128, 10))

    def batch(self):
        global_b = self.b * self.world
        if self.pos + global_b > len(self.perm):
            self.perm = torch.randperm(len(self.y), generator=self.gen)
            self.pos = 0
        idx = self.perm[self.pos + self.rank * self.b:self.pos + (self.rank + 1) * self.b]
        self.pos += global_b
        return self.x[idx], self.y[idx]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="ADDR:PORT of rank 0's store")
    ap.add_argument("--workload", choices=["synthetic", "fashion_mnist"], required=True)
    ap.add_argument("--parameters", type=int, default=1000000)
    ap.add_argument("--chunk", type=int, default=1 << 20)
    ap.add_argument("--noise", type=float, default=1.0)
    ap.add_argument("--micro_batch", type=int, default=64)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compute_steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout_s", type=int, default=900)
    ap.add_argument("--comm_hook", choices=["none", "fp16", "bf16", "powersgd", "batched_powersgd"],
                    default="none", help="one of torch's DDP communication hooks (above)")
    ap.add_argument("--powersgd_rank", type=int, default=4)
    ap.add_argument("--powersgd_start", type=int, default=2,
                    help="steps of plain allreduce before PowerSGD compresses (at least 2)")
    ap.add_argument("--matrix_cols", type=int, default=0,
                    help="synthetic: chunks as matrices of this many columns (0: vectors)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not (0 <= a.rank < a.world):
        sys.exit(f"ddp_baseline: rank {a.rank} not in [0, {a.world})")
    if a.parameters < 1:
        sys.exit("ddp_baseline: --parameters must be >= 1")
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    import datetime
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=a.timeout_s))
    if a.workload == "synthetic":
        module = Synthetic(a.parameters, a.chunk, a.seed, a.rank, a.noise, a.matrix_cols)
        data = None
    else:
        data = FashionMnist(a.data, a.micro_batch, a.rank, a.world, a.seed)
        module = data.model
    n = sum(p.numel() for p in module.parameters())
    ddp_args = {}
    if a.comm_hook.endswith("powersgd"):  # one bucket: see the module's docstring
        dist._DEFAULT_FIRST_BUCKET_BYTES = 10 << 30
        ddp_args["bucket_cap_mb"] = 10 << 10
    model = nn.parallel.DistributedDataParallel(module, **ddp_args)
    if a.comm_hook in ("fp16", "bf16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, getattr(default_hooks, f"{a.comm_hook}_compress_hook"))
    elif a.comm_hook in ("powersgd", "batched_powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        if a.powersgd_start < 2:
            sys.exit("ddp_baseline: --powersgd_start must be >= 2 (torch's PowerSGDState)")
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=a.powersgd_rank,
            start_powerSGD_iter=a.powersgd_start, random_seed=a.seed)
        hook = powerSGD_hook.powerSGD_hook
        if a.comm_hook == "batched_powersgd":
            hook = powerSGD_hook.batched_powerSGD_hook
            orthogonalize = powerSGD_hook._orthogonalize  # noqa: SLF001
            powerSGD_hook._orthogonalize = lambda m, epsilon=0: orthogonalize(  # noqa: SLF001
                m.unsqueeze(0) if m.dim() == 2 else m, epsilon)
        model.register_comm_hook(state, hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = nn.CrossEntropyLoss()

    def step(t):
        opt.zero_grad(set_to_none=False)
        if data is None:
            loss = model(t)
        else:
            x, y = data.batch()
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    compute, steps, losses, ends = [], [], [], []
    for t in range(1, a.compute_steps + 1):
        start = time.perf_counter()
        with model.no_sync():
            step(t)
        compute.append(time.perf_counter() - start)
    dist.barrier()
    for t in range(a.compute_steps + 1, a.compute_steps + a.steps + 1):
        start = time.perf_counter()
        losses.append(step(t))
        steps.append(time.perf_counter() - start)
        ends.append(time.time())
        if a.rank == 0:
            print(f"ddp step {t - a.compute_steps}/{a.steps}: {steps[-1] * 1e3:.1f} ms, "
                  f"loss {losses[-1]:.5g}", flush=True)
    dist.barrier()
    with open(a.out, "w") as f:
        json.dump({"rank": a.rank, "world": a.world, "workload": a.workload, "parameters": n,
                   "compute_seconds": compute, "step_seconds": steps, "step_end_unix": ends,
                   "loss": losses, "comm_hook": a.comm_hook,
                   "powersgd_rank": a.powersgd_rank, "powersgd_start": a.powersgd_start,
                   "torch": torch.__version__}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
