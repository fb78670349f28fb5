"""torch.amp.GradScaler as torch.optim users write it (scale, unscale_, clip, step,
update), on two ranks with overlap off, rank 1's loss made inf at step OVERFLOW: every
rank skips that step (its parameters stay), and every rank's scaler halves its scale,
rank 0's too, whose own gradient was finite (the workers' verdict, as ShardedGradScaler's).

    grad_scaler.py OVERFLOW
"""
import sys

import torch

import onebit.torch as ot

overflow = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=5, overlap=False,
                    config={"steps": 12})
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
g = torch.Generator().manual_seed(ot.rank())
halved, still, losses = [], [], []
while not opt.done:
    t = opt.next_step
    opt.zero_grad()
    x = torch.randn(64, 8, generator=g)
    loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
    losses.append(loss.item())
    if t == overflow and ot.rank() == 1:
        loss = loss * float("inf")
    before, params = scaler.get_scale(), [p.detach().clone() for p in model.parameters()]
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)  # the usual clip after unscale_
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() < before:
        halved.append(t)
    if all(torch.equal(a, b) for a, b in zip(params, model.parameters())):
        still.append(t)
digest = sum(p.double().sum().item() for p in model.parameters())
print(f"rank {ot.rank()}: halved {halved}, unchanged {still}, loss {losses[0]:.3f} -> "
      f"{losses[-1]:.3f}, digest {digest:.9f}", flush=True)
