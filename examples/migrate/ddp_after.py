"""After: onebit's 1-bit Adam (docs/from-ddp.md shows the diff and how to run it)."""
import torch
import torch.distributed as dist
import onebit.torch as ot
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.manual_seed(0)  # the same data and initial model on every rank
dist.init_process_group("gloo")
x = torch.randn(4096, 32)
y = torch.sin(x @ torch.randn(32, 1) / 8)
data = TensorDataset(x, y)
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=64, sampler=sampler)
loss_fn = torch.nn.MSELoss()

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
initial = loss_fn(model(x), y).item()
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=20)

for epoch in range(2):  # 32 steps an epoch with 2 processes
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()

with torch.no_grad():
    final = loss_fn(model(x), y).item()  # the whole data set's loss
if dist.get_rank() == 0:
    print(f"initial loss {initial:.4f}, final loss {final:.4f}")
