"""Before: DeepSpeed's 1-bit Adam (docs/from-deepspeed.md shows the diff and how to run it)."""
import os

import deepspeed
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ds_config.json")
torch.manual_seed(0)  # the same data and initial model on every rank
deepspeed.init_distributed()
x = torch.randn(4096, 32)
y = torch.sin(x @ torch.randn(32, 1) / 8)
data = TensorDataset(x, y)
sampler = DistributedSampler(data)
loss_fn = torch.nn.MSELoss()

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
initial = loss_fn(model(x), y).item()
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
batch_size = engine.train_micro_batch_size_per_gpu()
loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
device = engine.device  # a GPU: DeepSpeed's 1-bit Adam runs on GPUs only

for epoch in range(2):  # 32 optimizer steps an epoch with 2 processes
    sampler.set_epoch(epoch)
    for xb, yb in loader:  # 2 micro-batches a step (gradient_accumulation_steps)
        loss = loss_fn(engine(xb.to(device)), yb.to(device))
        engine.backward(loss)
        engine.step()

with torch.no_grad():
    final = loss_fn(engine(x.to(device)), y.to(device)).item()  # the whole data set's loss
if dist.get_rank() == 0:
    print(f"initial loss {initial:.4f}, final loss {final:.4f}")
