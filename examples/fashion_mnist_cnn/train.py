"""Fashion-MNIST CNN trained with 1-bit Adam: every process is one onebit worker.

    torchrun --nproc_per_node=N train.py --config=job.json --result=OUT/onebit.json

(run.sh uses onebit-run, torchrun's stand-in on one machine): each process finds its rank in
RANK/WORLD_SIZE and rank 0 runs the job's coordinator. Under onebit-launch (ONEBIT_CONFIG
set, --config optional) it runs as well.

The job config sets the steps, the seed, the per-worker batch and the optimizer; each rank
trains on its own slice of every global batch (common.batch_indices) and rank 0 evaluates the
final model on the 10,000 test images and writes the result as JSON.
"""
import argparse
import json
import os
import time

import torch

import common
import onebit.torch as ot


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=os.environ.get("ONEBIT_CONFIG"),
                        help="the job config (default: $ONEBIT_CONFIG, the one onebit-launch "
                        "runs, with its --steps/--freeze_step overrides)")
    parser.add_argument("--result", required=True, help="rank 0 writes its result JSON here")
    parser.add_argument("--print_every", type=int, default=100)
    args = parser.parse_args()
    if not args.config:
        parser.error("no --config (the job config: job.json) and no ONEBIT_CONFIG")
    job = ot.load_config(args.config)  # comments and trailing commas allowed
    seed, batch = job["seed"], job["train_micro_batch_size_per_gpu"]
    torch.set_num_threads(1)  # N workers share the machine's cores
    # onebit.device cuda: the model, the data and onebit's buffers live on the GPU; a
    # worker takes the GPU of its local rank, mod the GPUs there are (several may share one).
    device = torch.device("cpu")
    if job.get("onebit", {}).get("device", "cpu") == "cuda":
        device = torch.device("cuda", ot.local_rank() % torch.cuda.device_count())

    x, y = (t.to(device) for t in common.load("train"))
    model = common.make_model(seed).to(device)
    # Configured as torch.optim is: the hyper-parameters as keyword arguments (here the
    # job.json's, which Adam over DDP reads too); the config gives the rest (exchange, steps).
    hp = job["optimizer"]["params"]
    opt = ot.OneBitAdam(model.parameters(), lr=hp["lr"], betas=tuple(hp["betas"]),
                        weight_decay=hp["weight_decay"], freeze_step=hp["freeze_step"],
                        config=args.config,
                        **({"eps": hp["eps"]} if "eps" in hp else {}))
    rank, world = opt.rank, opt.world_size
    if rank == 0:
        print(f"{common.parameter_count(model)} parameters, {world} workers x batch {batch}",
              flush=True)
    start, losses = time.time(), []
    # The job's steps from where it stands: 1, or after the checkpoint a restarted job
    # resumed from (a batch is a function of its step, so a resumed run sees the batches of
    # an uninterrupted one).
    first = opt.next_step
    if rank == 0 and first > 1:
        print(f"the job resumed after step {first - 1}", flush=True)
    for step in range(first, job["steps"] + 1):
        idx = common.batch_indices(len(x), seed, step, rank, world, batch).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step(loss=loss)
        losses.append(loss.item())
        if rank == 0 and step % args.print_every == 0:
            recent = losses[-args.print_every:]
            print(f"step {step}: loss {sum(recent) / len(recent):.4f} "
                  f"({time.time() - start:.1f} s)", flush=True)
    seconds = time.time() - start
    if rank == 0:  # after .done the parameters hold the job's final model
        tx, ty = (t.to(device) for t in common.load("t10k"))
        accuracy, test_loss = common.evaluate(model, tx, ty)
        result = {"optimizer": "OneBitAdam (onebit)", "device": str(device),
                  "steps": job["steps"], "workers": world,
                  "batch_per_worker": batch, "seed": seed, "test_accuracy": accuracy,
                  "test_loss": test_loss, "train_seconds": seconds,
                  "final_train_loss_rank0_last100": sum(losses[-100:]) / len(losses[-100:])}
        with open(args.result, "w") as f:
            json.dump(result, f, indent=2)
        print(f"test accuracy {accuracy:.4f}, test loss {test_loss:.4f} after {job['steps']} "
              f"steps ({seconds:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
