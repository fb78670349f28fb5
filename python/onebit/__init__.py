"""onebit for PyTorch: 1-bit Adam, 0/1 Adam and 1-bit LAMB as torch.optim optimizers.

Each training process is a onebit worker: it registers with the job's coordinator, trains in
its leases, exchanges compressed momentum over gloo, NCCL or the parameter-server shards,
serves /metrics and takes part in checkpoints, exactly as onebit-worker does. The
optimizers live in onebit.torch; `onebit-launch --config job.json -- python3 train.py`
starts the coordinator, the shards and N copies of the script (docs/pytorch.md, "Train your own
model").
"""

__all__ = ["torch"]
