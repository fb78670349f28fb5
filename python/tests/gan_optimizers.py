"""A GAN's two onebit optimizers, built as such scripts build them and not caught: every
rank refuses the second at construction, the job fails, and every rank exits 78 (before:
rank 0 refused it, rank 1 built both and blocked in the second one's step until killed)."""
import torch

import onebit.torch as ot

torch.manual_seed(0)
g, d = torch.nn.Linear(8, 4), torch.nn.Linear(4, 1)
opt_g = ot.OneBitAdam(g.parameters(), lr=1e-3, freeze_step=2, config={"steps": 4})
opt_d = ot.OneBitAdam(d.parameters(), lr=1e-3, freeze_step=2, config={"steps": 4})
for _ in range(4):
    opt_d.zero_grad()
    d(g(torch.randn(8, 8)).detach()).square().mean().backward()
    opt_d.step()
