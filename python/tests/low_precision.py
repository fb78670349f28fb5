"""A model in bfloat16 or float16 without autocast (model.to(dtype)), trained by two ranks:
onebit keeps the float32 master copy, the parameters keep their type and take the master's
value after every step, and the state is float32.

    low_precision.py DTYPE       (bfloat16 or float16)
"""
import sys

import torch

import onebit.torch as ot

dtype = getattr(torch, sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                            torch.nn.Linear(16, 1)).to(dtype)
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=5, config={"steps": 30})
g = torch.Generator().manual_seed(ot.rank())
losses, synced = [], True
while not opt.done:
    opt.zero_grad()
    x = torch.randn(64, 8, generator=g).to(dtype)
    loss = (model(x).float() - x.float().sum(1, keepdim=True)).square().mean()
    loss.backward()
    losses.append(loss.item())
    opt.step(loss=loss)
    if not opt.done:  # the parameters are the master, rounded
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        synced = synced and torch.equal(flat, opt._worker.params().to(dtype))
types = sorted({str(p.dtype) for p in model.parameters()})
state = opt.state[model[0].weight]["exp_avg"].dtype
print(f"rank {ot.rank()}: parameters {types}, state {state}, synced {synced}, loss "
      f"{losses[0]:.3f} -> {sum(losses[-5:]) / 5:.3f}", flush=True)
