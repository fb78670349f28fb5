"""A small MLP trained by 1-bit Adam with the warmup exchange overlapping backward() (or
not), as a torch user writes the loop: two micro-batches per step, the first inside
opt.no_sync(); zero_grad(set_to_none=True) on even steps, in place on odd ones.

    python3 -m onebit.run --nproc_per_node=2 --master_port=0 overlap_train.py OUT.npy MODE [ps]

MODE: on (overlap, 0.25 MB buckets), off (overlap=False), twice (the first micro-batch
outside no_sync: a second gradient for a parameter already sent), modified (the gradients
clipped in place with torch.nn.utils.clip_grad_norm_ after backward, on step 3). With
"ps" the job runs a shard on the node (exchange.servers "per_node", so its warmup goes
between the workers). Rank 0 writes the final parameters to OUT.npy.
"""
import contextlib
import sys

import numpy as np
import torch
import torch.nn.functional as F

import onebit.torch as ot

STEPS = 10


def main():
    out, mode = sys.argv[1], sys.argv[2]
    config = {"steps": STEPS}
    if sys.argv[3:] == ["ps"]:
        config["onebit"] = {"exchange": {"mode": "ps", "servers": "per_node"}}
    torch.manual_seed(0)
    # 64-512-512-10: 0.25 MB buckets (65,536 floats) from the end give two, [the last
    # two layers] and [the first], each above the trainer's 16,384-float merge threshold.
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 10))
    opt = ot.OneBitAdam(model.named_parameters(), lr=1e-3, freeze_step=6,
                        overlap=mode != "off", bucket_cap_mb=0.25, config=config)
    print(f"rank {opt.rank} of {opt.world_size}", flush=True)  # joined: step 1 overlaps too
    g = torch.Generator().manual_seed(100 + opt.rank)
    while not opt.done:
        step = opt.next_step
        opt.zero_grad(set_to_none=step % 2 == 0)
        for micro in range(2):
            x = torch.randn(16, 64, generator=g)
            y = torch.randint(0, 10, (16,), generator=g)
            loss = F.cross_entropy(model(x), y)
            quiet = opt.no_sync() if micro == 0 and mode != "twice" else contextlib.nullcontext()
            with quiet:
                loss.backward()
        if mode == "modified" and step == 3:  # a gradient replaced after it went
            last = list(model.parameters())[-1]
            last.grad = last.grad * 0.5
        if mode == "clipped" and step == 3:  # torch's clipping, in place
            torch.nn.utils.clip_grad_norm_(model.parameters(), float(sys.argv[3]))
        opt.step(loss=loss)
    if opt.rank == 0:
        np.save(out, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy())


if __name__ == "__main__":
    main()
