"""Two jobs one after the other in one script, as pretraining then fine-tuning: the body
trains with a first optimizer, then a new head with a second one on the frozen body. Rank 0
keeps the first job's coordinator up a while after its end, so rank 1's second optimizer
reaches it first: it must wait for the second job's coordinator, not join (or fail) the
first. Prints each job's end and the head's final parameters."""
import time

import torch

import onebit.torch as ot

torch.manual_seed(0)
body, head = torch.nn.Linear(8, 4), torch.nn.Linear(4, 1)


def train(params, model, steps):
    with ot.OneBitAdam(params, lr=1e-2, freeze_step=2, config={"steps": steps}) as opt:
        data = torch.Generator().manual_seed(ot.rank())
        while not opt.done:
            opt.zero_grad()
            model(torch.randn(8, 8, generator=data)).square().mean().backward()
            opt.step()
        if ot.rank() == 0:
            time.sleep(2)  # this job's coordinator stays up, over, while rank 1 goes on


train(body.parameters(), body, 4)
print(f"rank {ot.rank()}: the first job ended", flush=True)
body.requires_grad_(False)
train(head.parameters(), torch.nn.Sequential(body, head), 6)
print(f"rank {ot.rank()}: the second job ended", flush=True)
print(f"rank {ot.rank()}: head {[round(v, 6) for v in head.bias.tolist() + head.weight.view(-1).tolist()]}",
      flush=True)
