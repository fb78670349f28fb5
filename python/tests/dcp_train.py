"""torch.distributed.checkpoint with onebit's optimizer, as a torch 2 script uses it.

    dcp_train.py first CKPT STEPS    train STEPS steps, then dcp.save the model and
                                     get_optimizer_state_dict (also torch.save'd: CKPT.ref)
    dcp_train.py resume CKPT STEPS   a fresh job: the templates, dcp.load,
                                     set_model/optimizer_state_dict; then train to STEPS

Each step's data comes from (rank, step), so the steps after a resume see what an
unbroken run would. Prints what the test reads: the loaded state against the saved one,
and each rank's parameter digest at the end.
"""
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)

import onebit.torch as ot

phase, ckpt, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")  # the script's own, on MASTER_PORT, beside onebit's
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=5, config={"steps": steps})
rank = dist.get_rank()
if phase == "resume":
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])
    ref = torch.load(ckpt + ".ref", weights_only=True)
    loaded = opt.state_dict()  # before the first step: the state loaded
    same = all(torch.equal(loaded["state"][i][k], ref[name][k])
               for i, name in enumerate(ref) for k in ("exp_avg", "exp_avg_sq"))
    print(f"rank {rank}: loaded step {loaded['param_groups'][0]['onebit']['step']}, "
          f"moments as saved: {same}", flush=True)
losses = []
while not opt.done:
    t = opt.next_step
    g = torch.Generator().manual_seed(1000 * rank + t)
    opt.zero_grad()
    x = torch.randn(64, 8, generator=g)
    loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
    loss.backward()
    losses.append(loss.item())
    opt.step(loss=loss)
if phase == "first":
    osd = get_optimizer_state_dict(model, opt)
    dcp.save({"model": get_model_state_dict(model), "optim": osd}, checkpoint_id=ckpt)
    if rank == 0:
        torch.save({k: {n: v for n, v in e.items() if n != "step"} for k, e in osd["state"].items()},
                   ckpt + ".ref")
    print(f"rank {rank}: saved step {osd['param_groups'][0]['onebit']['step']}, state of "
          f"{', '.join(sorted(osd['state']))}", flush=True)
digest = sum(p.double().sum().item() for p in model.parameters())
print(f"rank {rank}: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
      f"digest {digest:.9f}", flush=True)
dist.barrier()
dist.destroy_process_group()
