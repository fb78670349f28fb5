"""The baseline: the same model, text, windows, seed and steps as train.py, with plain
torch.optim.Adam over DistributedDataParallel (torch.distributed, gloo on 127.0.0.1), the
job config's worker count as processes (torch.multiprocessing; the loop is ../ddp_lib.py).

    /usr/bin/python3 ddp_adam.py --config=job.json --result=OUT/adam.json \
        --loss_csv=OUT/adam.csv --held_out_csv=OUT/adam_held_out.csv
"""
import os
import sys

import common

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ddp_lib  # noqa: E402


class CharLm:
    """The character transformer on the training text, each rank its own windows; rank 0
    measures the held-out loss at the start, every --eval_every steps and at the end."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.train, self.held_out, vocab = common.load_corpus()
        self.model = common.make_model(ctx.seed, len(vocab))
        self.evals = [(0, common.held_out_loss(self.model, self.held_out))] if ctx.rank == 0 else []

    def loss(self, model, step):
        x, y = common.batch(self.train, self.ctx.seed, step, self.ctx.rank, self.ctx.batch)
        return common.loss_of(model, x, y)

    def progress(self, model, step, losses):
        every = self.ctx.args.eval_every
        if step % every != 0 or step >= self.ctx.steps:
            return None
        self.evals.append((step, common.held_out_loss(model, self.held_out)))
        return (f"train loss {ddp_lib.mean_last(losses, every):.4f}, "
                f"held-out {self.evals[-1][1]:.4f}")

    def result(self, model, run):
        final = common.held_out_loss(model, self.held_out)
        self.evals.append((self.ctx.steps, final))
        with open(self.ctx.args.held_out_csv, "w") as f:
            f.write("step,held_out_loss\n")
            f.writelines(f"{s},{v:.6f}\n" for s, v in self.evals)
        fields = {"block": common.BLOCK, "seed": self.ctx.seed,
                  "parameters": common.parameter_count(model), "held_out_loss": final,
                  "held_out_bits_per_char": common.bits_per_char(final),
                  "final_train_loss_rank0_last50": ddp_lib.mean_last(run.losses, 50),
                  "bytes_allreduced_per_worker_per_step": run.bytes_per_step,
                  "train_seconds": run.seconds}
        bits = common.bits_per_char(final)
        return fields, f"held-out loss {final:.4f} nats/char ({bits:.3f} bits)"


if __name__ == "__main__":
    ddp_lib.main(__doc__, CharLm, [
        ("--held_out_csv", {"required": True, "help": "rank 0's held-out loss (CSV)"}),
        ("--eval_every", {"type": int, "default": 50})])
