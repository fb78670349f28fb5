"""A training script that replays a recorded gradient stream through onebit.torch (the
package's numerics against onebit-replay): worker r's gradient at step t is grads[t-1, r].

    stream_train.py CONFIG PARAMS.npy GRADS.npy OUT.npy OPTIMIZER [SPLIT]

The model is the initial parameters as tensors split at SPLIT (comma-separated offsets
inside (0, N): 1-bit LAMB's layers); rank 0 writes the final parameters to OUT.npy.
"""
import sys

import numpy as np
import torch

import onebit.torch as ot


def main():
    config, params_path, grads_path, out_path, optimizer = sys.argv[1:6]
    split = [int(s) for s in sys.argv[6].split(",")] if len(sys.argv) > 6 and sys.argv[6] else []
    initial = np.load(params_path)
    grads = np.load(grads_path, mmap_mode="r")
    bounds = [0] + split + [initial.size]
    params = [torch.nn.Parameter(torch.from_numpy(initial[b:e].copy()))
              for b, e in zip(bounds, bounds[1:])]
    opt = getattr(ot, optimizer)(params, config)
    while not opt.done:
        t = opt.next_step
        g = torch.from_numpy(np.array(grads[t - 1, opt.rank]))
        for p, b, e in zip(params, bounds, bounds[1:]):
            p.grad.copy_(g[b:e])
        opt.step(loss=0.0)
    if opt.rank == 0:
        np.save(out_path, torch.cat([p.detach().reshape(-1) for p in params]).numpy())


if __name__ == "__main__":
    main()
