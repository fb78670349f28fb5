"""Two onebit optimizers in one process, as a GAN's loop builds them: the second is refused
while the first is in its job (on rank 0 at construction, where the first runs the job's
coordinator; on the others when it would join), and the first job runs on to its end."""
import torch

import onebit.torch as ot

torch.manual_seed(0)
g, d = torch.nn.Linear(8, 4), torch.nn.Linear(4, 1)
first = ot.OneBitAdam(g.parameters(), lr=1e-3, freeze_step=2, config={"steps": 4})
try:
    second = ot.OneBitAdam(d.parameters(), lr=1e-3, freeze_step=2, config={"steps": 4})
    first.zero_grad()
    d(g(torch.randn(8, 8))).square().mean().backward()
    first.step()
    second.step()
    raise SystemExit("the second optimizer joined a job beside the first")
except ValueError as e:
    print(f"rank {ot.rank()}: refused: {e}", flush=True)
while not first.done:
    first.zero_grad()
    d(g(torch.randn(8, 8))).square().mean().backward()
    first.step()
print(f"rank {ot.rank()}: the first job ended", flush=True)
