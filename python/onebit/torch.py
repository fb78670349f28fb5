"""onebit's optimizers for PyTorch models (torch.optim.Optimizer subclasses), built and
launched the way torch.optim and torchrun are:

    import onebit.torch as ot
    sampler = DistributedSampler(data, num_replicas=ot.world_size(), rank=ot.rank())
    opt = ot.OneBitAdam(model.parameters(), lr=3e-4, freeze_step=1000)
    for batch in loader:
        opt.zero_grad()
        loss = loss_fn(model(batch))
        loss.backward()
        opt.step(loss=loss)          # the exchange and the update, in C++
    # Without `steps` the job ends when every worker's loop has (here, at the script's
    # exit, or opt.close(), or the end of a `with` block); with `steps` opt.done turns true
    # after the last one.

    torchrun --nproc_per_node=4 train.py      (or srun; or onebit-launch on one machine)

HYPER-PARAMETERS are keyword arguments, as in torch.optim.Adam: lr, betas, eps,
weight_decay (decoupled, as torch.optim.AdamW's and DeepSpeed's: decoupled_weight_decay is
True, and False is refused), bias_correction (on by default, as in torch's Adam, unless a job config with
an optimizer block is given: its default is off, as docs/algorithms.md says), and each type's own
(freeze_step; ZeroOneAdam's var_freeze_step, var_update_scaler, local_step_scaler,
local_step_clipper; OneBitLamb's max_coeff, min_coeff, coeff_beta, factor_max,
factor_min, factor_threshold). `config` (a path or a dict of the job config JSON that
onebit-launch and onebit-worker read; default $ONEBIT_CONFIG) gives the rest: exchange
mode, steps, checkpoints, freezing, security. Keyword arguments win over its optimizer
block. Without a config: peer mode over gloo (for CPU and CUDA tensors alike; NCCL needs
optimizer.params.comm_backend_name "nccl"), a static freeze, the world size from the
launcher, and the parameter count from the model.

THE JOB is found from the launcher's environment (onebit/env.py): torchrun's RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, Slurm's SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID and SLURM_JOB_NODELIST, or onebit's ONEBIT_* (which win). With no
ONEBIT_COORDINATOR, rank 0 runs the job's coordinator inside its own process on
MASTER_PORT + 1 (REST on MASTER_PORT + 2; MASTER_PORT stays free for torch.distributed),
and the other ranks find it there. Also read:

    ONEBIT_COORDINATOR    host:port of a running coordinator (onebit-launch, compose and
                          Kubernetes set it); then no coordinator is embedded
    ONEBIT_HOST           this process's address for gloo and /metrics (default: the
                          address that reaches MASTER_ADDR; 127.0.0.1 on one machine)
    ONEBIT_METRICS_PORT   the /metrics port (default 0: a free one)
    ONEBIT_SUMMARY_FILE   where to write the worker's JSON summary at the end ({rank} in
                          it: the launcher's rank, so that each process has its own)
    ONEBIT_HISTORY_CSV    every step as CSV ({rank} likewise)
    ONEBIT_MEMBER_TOKEN   the coordinator's member token, where it asks for one
    ONEBIT_FAULT          POINT:STEP (kill_in_exchange, kill_before_commit): the worker
                          kills its own process there, as onebit-worker's --fault (tests;
                          onebit-launch --fault=workerI:POINT:STEP sets it once)

SAVING: state_dict() has torch.optim's layout ("state" by parameter index, "param_groups"
with "params"; onebit's step, freeze step and error buffers in param_groups[0]["onebit"]).
torch.save(opt.state_dict(), f) between steps or after the end; to resume, build the
optimizer, opt.load_state_dict(torch.load(f)) before the first step (the model's
parameters loaded beside it), and the fresh job starts after the saved step (every worker
loading a state of the same step). torch.distributed.checkpoint round-trips it too.
opt.state[p] reads one parameter's state as torch.optim.Adam's (copies: read-only).

MEMORY: the parameters are ONE flat float32 buffer, the optimizer's own; each float32
parameter tensor views its slice (a bfloat16 or float16 one keeps its memory, and the
buffer holds its float32 master) (no copies either way; new memory for one after the first step is
an error: copy into it instead), and so do the gradients (their own flat buffer, which
the trainer reads in place). Every worker must start from the same parameters: seed the
model alike (torch.manual_seed) on every process. One optimizer at a time per process;
jobs one after another (close the last one first) are each rank's n-th optimizer, with
the same config on every rank (one that differs fails the job, naming the key).

MIXED PRECISION: bf16 autocast needs nothing, and nor does a model in bfloat16 or float16.
fp16 loss scaling: torch.amp.GradScaler as with torch.optim, or the job config's fp16
block (DeepSpeed's) with opt.scale(loss).backward(); either way every worker skips an
overflowed step alike. MICRO-BATCHES: `with opt.no_sync():` as with DDP, or the config's
gradient_accumulation_steps K (step() after each micro-batch, as DeepSpeed's
engine.step()). SCHEDULES: a torch lr_scheduler's lr and betas take effect at the next
step(), and so does each group's weight_decay (a weight-decay schedule); eps is fixed when
the optimizer is built. MOMENTUM MASKS: a param
group's exp_avg_mask, as DeepSpeed's (0 where the momentum is masked; broadcast to each of
the group's parameters), becomes the config's onebit.momentum_mask.ranges.

OVERLAP (CPU tensors, peer mode: on by default; overlap=False or the config's
onebit.exchange.overlap turn it off): as DDP does, the warmup's full-precision exchange
starts during backward(). The parameters are grouped in reverse order into buckets (the
first up to 1 MB, the others up to bucket_cap_mb, 25 by default, as DDP's), and each
bucket goes to the exchange as soon as backward has finished all its gradients. So, as
with DDP: a gradient is final when backward() returns. Accumulating several backward()
calls per step needs `with opt.no_sync():` around all but the last (a second gradient for
a parameter already sent is an error naming it), and a gradient changed after backward()
(clipping it in place: use opt.clip_grad_norm_) is an error at step().
"""

# The optimizers' families live in private modules (onebit/_optimizer.py names them); this
# module is their public face, and the four optimizer types live here. _KEYWORDS and
# _CONFIG_FILLED_IN are here for the API reference, which prints them with this module.
from onebit._errors import OnebitError, ScriptError, ScriptRuntimeError, ScriptValueError
from onebit._job import _CONFIG_FILLED_IN, _KEYWORDS, OPEN_ENDED_STEPS, load_config  # noqa: F401
from onebit._optimizer import _OnebitOptimizer
from onebit.env import local_rank, local_world_size, rank, world_size

__all__ = ["OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adam", "OnebitError", "ScriptError",
           "ScriptValueError", "ScriptRuntimeError", "load_config",
           "rank", "world_size", "local_rank", "local_world_size"]


class OneBitAdam(_OnebitOptimizer):
    """1-bit Adam (DeepSpeed's OneBitAdam): the job config's optimizer.type "OneBitAdam"."""
    _type = "OneBitAdam"
    _own = ("freeze_step", "update_clip")


class ZeroOneAdam(_OnebitOptimizer):
    """0/1 Adam: optimizer.type "ZeroOneAdam"."""
    _type = "ZeroOneAdam"
    _own = ("var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper",
            "update_clip")


class OneBitLamb(_OnebitOptimizer):
    """1-bit LAMB (each parameter tensor is one of LAMB's layers): "OneBitLamb"."""
    _type = "OneBitLamb"
    _states = ("exp_avg_sq_fresh",)
    _own = ("freeze_step", "max_coeff", "min_coeff", "coeff_beta", "factor_max", "factor_min",
            "factor_threshold")


class Adam(_OnebitOptimizer):
    """Adam with a full-precision exchange every step (the baseline): "Adam"."""
    _type = "Adam"
    _own = ("freeze_step", "update_clip")
