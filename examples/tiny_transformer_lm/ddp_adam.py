"""The baseline: the same model, text, windows, seed and steps as train.py, with plain
torch.optim.Adam over DistributedDataParallel (torch.distributed, gloo on 127.0.0.1), the
job config's worker count as processes (torch.multiprocessing).

    /usr/bin/python3 ddp_adam.py --config=job.json --result=OUT/adam.json \
        --loss_csv=OUT/adam.csv --held_out_csv=OUT/adam_held_out.csv
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
    train, held_out, vocab = common.load_corpus()
    model = DistributedDataParallel(common.make_model(seed, len(vocab)))
    opt = torch.optim.Adam(model.parameters(), lr=hp.get("lr", 1e-3),
                           betas=tuple(hp.get("betas", (0.9, 0.999))), eps=hp.get("eps", 1e-8),
                           weight_decay=hp.get("weight_decay", 0.0))
    evals = [(0, common.held_out_loss(model.module, held_out))] if rank == 0 else []
    start, losses = time.time(), []
    for step in range(1, steps + 1):
        x, y = common.batch(train, seed, step, rank, batch)
        opt.zero_grad()
        loss = common.loss_of(model, x, y)
        loss.backward()  # DDP averages the gradients over the ranks (fp32 allreduce)
        opt.step()
        losses.append(loss.item())
        if rank == 0 and step % args.eval_every == 0 and step < steps:
            evals.append((step, common.held_out_loss(model.module, held_out)))
            recent = losses[-args.eval_every:]
            print(f"[adam] step {step}: train loss {sum(recent) / len(recent):.4f}, held-out "
                  f"{evals[-1][1]:.4f} ({time.time() - start:.1f} s)", flush=True)
    seconds = time.time() - start
    if rank == 0:
        final = common.held_out_loss(model.module, held_out)
        evals.append((steps, final))
        with open(args.loss_csv, "w") as f:
            f.write("step,loss\n")
            f.writelines(f"{i + 1},{v:.6f}\n" for i, v in enumerate(losses))
        with open(args.held_out_csv, "w") as f:
            f.write("step,held_out_loss\n")
            f.writelines(f"{s},{v:.6f}\n" for s, v in evals)
        result = {"optimizer": "torch.optim.Adam over DDP (gloo)", "steps": steps,
                  "workers": world, "batch_per_worker": batch, "block": common.BLOCK,
                  "seed": seed, "parameters": common.parameter_count(model.module),
                  "held_out_loss": final, "held_out_bits_per_char": common.bits_per_char(final),
                  "final_train_loss_rank0_last50": sum(losses[-50:]) / len(losses[-50:]),
                  "bytes_allreduced_per_worker_per_step": 4 * common.parameter_count(model),
                  "train_seconds": seconds}
        with open(args.result, "w") as f:
            json.dump(result, f, indent=2)
        print(f"[adam] held-out loss {final:.4f} nats/char ({common.bits_per_char(final):.3f} "
              f"bits) after {steps} steps ({seconds:.1f} s)", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the job config train.py uses (JSON)")
    parser.add_argument("--result", required=True, help="rank 0's result JSON")
    parser.add_argument("--loss_csv", required=True, help="rank 0's training loss per step")
    parser.add_argument("--held_out_csv", required=True, help="rank 0's held-out loss (CSV)")
    parser.add_argument("--steps", type=int, default=0, help="override the config's steps")
    parser.add_argument("--eval_every", type=int, default=50)
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
