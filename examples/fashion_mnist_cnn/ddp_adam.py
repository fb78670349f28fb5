"""The baseline: the same model, data, batches, seed and steps as train.py, with plain
torch.optim.Adam over DistributedDataParallel (torch.distributed, gloo on 127.0.0.1), the
job config's worker count as processes (torch.multiprocessing; the loop is ../ddp_lib.py).

    /usr/bin/python3 ddp_adam.py --config=job.json --result=OUT/adam.json --loss_csv=OUT/adam.csv
"""
import os
import sys

import torch

import common

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ddp_lib  # noqa: E402


class FashionMnist:
    """The CNN on the training images, each rank its slice of every global batch."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.x, self.y = common.load("train")
        self.model = common.make_model(ctx.seed)

    def loss(self, model, step):
        c = self.ctx
        idx = common.batch_indices(len(self.x), c.seed, step, c.rank, c.world, c.batch)
        return torch.nn.functional.cross_entropy(model(self.x[idx]), self.y[idx])

    def progress(self, model, step, losses):
        every = self.ctx.args.print_every
        return f"loss {ddp_lib.mean_last(losses, every):.4f}" if step % every == 0 else None

    def result(self, model, run):
        tx, ty = common.load("t10k")
        accuracy, test_loss = common.evaluate(model, tx, ty)
        fields = {"seed": self.ctx.seed, "test_accuracy": accuracy, "test_loss": test_loss,
                  "train_seconds": run.seconds,
                  "bytes_allreduced_per_worker_per_step": run.bytes_per_step,
                  "final_train_loss_rank0_last100": ddp_lib.mean_last(run.losses, 100)}
        return fields, f"test accuracy {accuracy:.4f}, test loss {test_loss:.4f}"


if __name__ == "__main__":
    ddp_lib.main(__doc__, FashionMnist, [("--print_every", {"type": int, "default": 100})])
