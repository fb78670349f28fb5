"""A small MLP trained by 1-bit Adam on one node of two workers, exchange "hierarchical",
with the optimizer state sharded across them or not (the shard_state keyword):

    python3 -m onebit.run --nproc_per_node=2 --master_port=0 sharded_state.py MODE DIR [DTYPE]

MODE: sharded or whole: 12 steps, compressing after step 5. After step 8 each rank saves
state_dict() and state_dict(full=True) to DIR/MODE-rank{r}-{own,full}.pt and the model
to DIR/model-rank{r}.pt, then loads them back (the sharded ranks both; the whole ranks
their own, then the sharded job's gathered state where DIR has it). resume: a fresh
sharded job that loads DIR/sharded-rank{r}-own.pt and the model before its first step,
and trains steps 9 to 12. Rank 0 writes the final parameters to DIR/MODE.npy. DTYPE
(float32 by default; bfloat16) is the model's: onebit keeps the float32 master copy.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import onebit.torch as ot

STEPS, SAVED = 12, 8


def load(path):
    # weights_only on torch 2 (torch 1.13's refuses the Python floats of any state dict).
    return torch.load(path, weights_only=not torch.__version__.startswith("1."))


def main():
    mode, out = sys.argv[1], sys.argv[2]
    dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "float32")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    # 3-16-16-4: 404 elements; the two workers' ranges split 2.weight.
    model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 4)).to(dtype)
    if mode == "resume":
        model.load_state_dict(load(os.path.join(out, f"model-rank{rank}.pt")))
    config = {"steps": STEPS,
              "onebit": {"exchange": {"mode": "hierarchical", "local_size": 2}}}
    opt = ot.OneBitAdam(model.named_parameters(), lr=1e-2, freeze_step=5, weight_decay=0.01,
                        shard_state=mode != "whole", config=config)
    if mode == "resume":
        opt.load_state_dict(load(os.path.join(out, f"sharded-rank{rank}-own.pt")))
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(8, 3, generator=g), torch.randint(0, 4, (8,), generator=g))
               for _ in range(STEPS)]  # step t's is batches[t - 1], wherever the job starts
    while not opt.done:
        step = opt.next_step
        if step == SAVED + 1 and mode != "resume":
            save(opt, model, mode, out, rank)
        x, y = batches[step - 1]
        opt.zero_grad()
        F.cross_entropy(model(x.to(dtype)).float(), y).backward()
        opt.step()
    assert opt.done
    if mode == "sharded":  # the node has left: nothing to gather from
        try:
            opt.state_dict(full=True)
        except RuntimeError as e:
            print(f"rank {rank}: after the end: {e}", flush=True)
    if rank == 0:
        np.save(os.path.join(out, mode + ".npy"), torch.cat(
            [p.detach().reshape(-1).float() for p in model.parameters()]).numpy())


def save(opt, model, mode, out, rank):
    """After step SAVED: both state_dicts saved, loaded back, and opt.state read."""
    own, full = opt.state_dict(), opt.state_dict(full=True)
    paths = {kind: os.path.join(out, f"{mode}-rank{rank}-{kind}.pt") for kind in ("own", "full")}
    torch.save(own, paths["own"])
    torch.save(full, paths["full"])
    torch.save(model.state_dict(), os.path.join(out, f"model-rank{rank}.pt"))
    shard = own["param_groups"][0]["onebit"].get("shard")
    if shard is not None:
        print(f"rank {rank}: own [{shard['begin']}, {shard['end']}), whole "
              f"{sorted(own['state'])}, partial {sorted(shard['partial'])}", flush=True)
    names = [n for n, _ in model.named_parameters()]
    for i, p in enumerate(model.parameters()):
        try:
            opt.state[p]
            print(f"rank {rank}: opt.state[{names[i]}] served", flush=True)
        except KeyError as e:
            print(f"rank {rank}: opt.state[{names[i]}] refused: {e}", flush=True)
    # Every rank of the node loads at the same step (a sharded load is a collective).
    opt.load_state_dict(load(paths["own"]))
    if mode == "sharded":
        opt.load_state_dict(load(paths["full"]))
    gathered = os.path.join(out, f"sharded-rank{rank}-full.pt")
    if mode == "whole" and os.path.exists(gathered):
        opt.load_state_dict(load(gathered))
        print(f"rank {rank}: loaded the sharded job's gathered state", flush=True)


if __name__ == "__main__":
    main()
