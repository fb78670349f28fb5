"""A character-level transformer LM trained with 1-bit Adam: every process is one onebit
worker.

    torchrun --nproc_per_node=N train.py --config=job.json --result=OUT/onebit.json \
        --held_out_csv=OUT/onebit_held_out.csv

(run.sh uses onebit-run, torchrun's stand-in on one machine): each process finds its rank in
RANK/WORLD_SIZE and rank 0 runs the job's coordinator. Under onebit-launch (ONEBIT_CONFIG
set, --config optional) it runs as well.

The job config sets the steps, the seed, the per-worker batch and the optimizer; each rank
draws its own windows of the training text (common.batch), rank 0 measures the held-out loss
every --eval_every steps and at the end, and writes the result as JSON.
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
    parser.add_argument("--held_out_csv", required=True, help="rank 0's held-out loss (CSV)")
    parser.add_argument("--eval_every", type=int, default=50)
    args = parser.parse_args()
    if not args.config:
        parser.error("no --config (the job config: job.json) and no ONEBIT_CONFIG")
    job = ot.load_config(args.config)  # comments and trailing commas allowed
    seed, batch = job["seed"], job["train_micro_batch_size_per_gpu"]
    torch.set_num_threads(1)  # N workers share the machine's cores

    train, held_out, vocab = common.load_corpus()
    model = common.make_model(seed, len(vocab))
    # Configured as torch.optim is: the hyper-parameters as keyword arguments (here the
    # job.json's, which Adam over DDP reads too); the config gives the rest (exchange, steps).
    hp = job["optimizer"]["params"]
    opt = ot.OneBitAdam(model.parameters(), lr=hp["lr"], betas=tuple(hp["betas"]),
                        weight_decay=hp["weight_decay"], freeze_step=hp["freeze_step"],
                        config=args.config,
                        **({"eps": hp["eps"]} if "eps" in hp else {}))
    rank = opt.rank
    evals = []
    if rank == 0:
        print(f"{common.parameter_count(model)} parameters, vocabulary {len(vocab)}, "
              f"{len(train)} training and {len(held_out)} held-out characters, "
              f"{opt.world_size} workers x batch {batch} x {common.BLOCK}", flush=True)
        evals.append((0, common.held_out_loss(model, held_out)))
    start, losses = time.time(), []
    # The job's steps from where it stands: 1, or after the checkpoint a restarted job
    # resumed from (a batch is a function of its step).
    for step in range(opt.next_step, job["steps"] + 1):
        x, y = common.batch(train, seed, step, rank, batch)
        opt.zero_grad()
        loss = common.loss_of(model, x, y)
        loss.backward()
        opt.step(loss=loss)
        losses.append(loss.item())
        if rank == 0 and step % args.eval_every == 0 and not opt.done:
            evals.append((step, common.held_out_loss(model, held_out)))
            recent = losses[-args.eval_every:]
            print(f"step {step}: train loss {sum(recent) / len(recent):.4f}, held-out "
                  f"{evals[-1][1]:.4f} ({time.time() - start:.1f} s)", flush=True)
    seconds = time.time() - start
    if rank == 0:  # after .done the parameters hold the job's final model
        final = common.held_out_loss(model, held_out)
        evals.append((job["steps"], final))
        with open(args.held_out_csv, "w") as f:
            f.write("step,held_out_loss\n")
            f.writelines(f"{s},{v:.6f}\n" for s, v in evals)
        result = {"optimizer": "OneBitAdam (onebit)", "steps": job["steps"],
                  "workers": opt.world_size, "batch_per_worker": batch, "block": common.BLOCK,
                  "seed": seed, "parameters": common.parameter_count(model),
                  "held_out_loss": final, "held_out_bits_per_char": common.bits_per_char(final),
                  "final_train_loss_rank0_last50": sum(losses[-50:]) / len(losses[-50:]),
                  "train_seconds": seconds}
        with open(args.result, "w") as f:
            json.dump(result, f, indent=2)
        print(f"held-out loss {final:.4f} nats/char ({common.bits_per_char(final):.3f} bits) "
              f"after {job['steps']} steps ({seconds:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
