"""A model in bfloat16 or float16 without autocast (model.to(dtype)), trained by two ranks:
onebit keeps the float32 master copy, the parameters keep their type and take the master's
value after every step, and the state is float32. EXCHANGE "hier" runs the hierarchical
exchange (one node of two workers), "sharded" the same with shard_state: the worker then
keeps the low-precision parameters, which the model's view, and a bfloat16 model's .grad
tensors view its bfloat16 gradient buffer (a float16 model's stay its own). A digest of the parameters
after every step, for comparing runs bit for bit.

    low_precision.py DTYPE [EXCHANGE]      (bfloat16 or float16; flat, hier or sharded)
"""
import hashlib
import sys

import torch

import onebit.torch as ot

dtype = getattr(torch, sys.argv[1])
exchange = sys.argv[2] if len(sys.argv) > 2 else "flat"
config = {"steps": 30}
if exchange != "flat":
    config["onebit"] = {"exchange": {"mode": "hierarchical", "local_size": 2,
                                     "shard_state": exchange == "sharded"}}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                            torch.nn.Linear(16, 1)).to(dtype)
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=5, config=config)
g = torch.Generator().manual_seed(ot.rank())
losses, synced, digest = [], True, hashlib.sha256()
while not opt.done:
    opt.zero_grad()
    x = torch.randn(64, 8, generator=g).to(dtype)
    loss = (model(x).float() - x.float().sum(1, keepdim=True)).square().mean()
    loss.backward()
    losses.append(loss.item())
    opt.step(loss=loss)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest.update(flat.view(torch.int16).numpy().tobytes())
    if opt.done:
        continue
    if exchange == "sharded":  # the parameters view the worker's own
        address, kept = opt._worker.param_buffer()
        synced = synced and model[0].weight.data_ptr() == address and kept == {
            torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        grad_address, grad_kept = opt._worker.gradient_buffer()
        if dtype == torch.bfloat16:  # so do the gradients
            synced = (synced and grad_kept == "bf16" and model[0].weight.grad.dtype == dtype
                      and model[0].weight.grad.data_ptr() == grad_address)
        else:
            synced = synced and grad_kept == "fp32"
    else:  # the parameters are the master, rounded
        synced = synced and torch.equal(flat, opt._worker.params().to(dtype))
types = sorted({str(p.dtype) for p in model.parameters()})
state = (opt.state[model[0].weight]["exp_avg"].dtype if exchange != "sharded"
         else torch.float32)  # a sharded state_dict is the package's own test
print(f"rank {ot.rank()}: parameters {types}, state {state}, synced {synced}, loss "
      f"{losses[0]:.3f} -> {sum(losses[-5:]) / 5:.3f}, digest {digest.hexdigest()}",
      flush=True)
