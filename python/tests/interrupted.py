"""Ctrl-C on rank 1 at step 3 (SIGINT to itself): an interrupt ends the job on every rank,
where a raising script's job would recover (exit 75) and a launcher would restart it."""
import os
import signal

import torch

import onebit.torch as ot

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = ot.OneBitAdam(model.parameters(), lr=1e-3, freeze_step=2, config={"steps": 50})
while not opt.done:
    if ot.rank() == 1 and opt.next_step == 3:
        os.kill(os.getpid(), signal.SIGINT)
    opt.zero_grad()
    model(torch.randn(8, 8)).square().mean().backward()
    opt.step()
