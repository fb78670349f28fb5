"""The baseline: the same model, data, batches, seed and steps as train.py, with plain
torch.optim.Adam over DistributedDataParallel (torch.distributed, gloo on 127.0.0.1), the
job config's worker count as processes (torch.multiprocessing).

    /usr/bin/python3 ddp_adam.py --config=job.json --result=OUT/adam.json --loss_csv=OUT/adam.csv
"""
import argparse
import json
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import common


def run(rank, world, port, job, steps, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    seed, batch = job["seed"], job["train_micro_batch_size_per_gpu"]
    hp = job["optimizer"]["params"]
    x, y = common.load("train")
    model = DistributedDataParallel(common.make_model(seed))
    opt = torch.optim.Adam(model.parameters(), lr=hp.get("lr", 1e-3),
                           betas=tuple(hp.get("betas", (0.9, 0.999))), eps=hp.get("eps", 1e-8),
                           weight_decay=hp.get("weight_decay", 0.0))
    start, losses = time.time(), []
    for step in range(1, steps + 1):
        idx = common.batch_indices(len(x), seed, step, rank, world, batch)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()  # DDP averages the gradients over the ranks (fp32 allreduce)
        opt.step()
        losses.append(loss.item())
        if rank == 0 and step % args.print_every == 0:
            recent = losses[-args.print_every:]
            print(f"[adam] step {step}: loss {sum(recent) / len(recent):.4f} "
                  f"({time.time() - start:.1f} s)", flush=True)
    seconds = time.time() - start
    if rank == 0:
        with open(args.loss_csv, "w") as f:
            f.write("step,loss\n")
            f.writelines(f"{i + 1},{v:.6f}\n" for i, v in enumerate(losses))
        tx, ty = common.load("t10k")
        accuracy, test_loss = common.evaluate(model.module, tx, ty)
        result = {"optimizer": "torch.optim.Adam over DDP (gloo)", "steps": steps,
                  "workers": world, "batch_per_worker": batch, "seed": seed,
                  "test_accuracy": accuracy, "test_loss": test_loss, "train_seconds": seconds,
                  "bytes_allreduced_per_worker_per_step": 4 * common.parameter_count(model),
                  "final_train_loss_rank0_last100": sum(losses[-100:]) / len(losses[-100:])}
        with open(args.result, "w") as f:
            json.dump(result, f, indent=2)
        print(f"[adam] test accuracy {accuracy:.4f}, test loss {test_loss:.4f} after {steps} "
              f"steps ({seconds:.1f} s)", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the job config train.py uses (JSON)")
    parser.add_argument("--result", required=True, help="rank 0's result JSON")
    parser.add_argument("--loss_csv", required=True, help="rank 0's loss per step (CSV)")
    parser.add_argument("--steps", type=int, default=0, help="override the config's steps")
    parser.add_argument("--print_every", type=int, default=100)
    args = parser.parse_args()
    with open(args.config) as f:
        job = json.load(f)
    world = job["onebit"]["workers"]
    steps = args.steps or job["steps"]
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(world, port, job, steps, args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
