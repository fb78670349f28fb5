"""A training script that replays a recorded gradient stream through onebit.torch (the
package's numerics against onebit-replay): worker r's gradient at step t is grads[t-1, r].

    stream_train.py CONFIG PARAMS.npy GRADS.npy OUT.npy OPTIMIZER [SPLIT]

The model is the initial parameters as tensors split at SPLIT (comma-separated offsets
inside (0, N): 1-bit LAMB's layers); rank 0 writes the final parameters to OUT.npy.
SECOND_GROUP=LR,WEIGHT_DECAY in the environment puts the tensors after the first into a
second param group with that lr and weight decay; OPT_KWARGS={...} (JSON) builds the
optimizer torch.optim's way, OPTIMIZER(params, config=CONFIG, **OPT_KWARGS);
ALSO_TORCH_DISTRIBUTED=1 runs a torch.distributed all_reduce first (env://);
LR_ZERO_AFTER=K steps a torch LambdaLR that makes the lr 0 after step K;
CLIP_EACH_STEP=NORM calls opt.clip_grad_norm_(NORM) before every step; LOOP_STEPS=K runs
a plain loop of K steps (for a job without steps) instead of `while not opt.done`;
LOAD_STATE=PATH and SAVE_STATE=PATH ({rank} in them) torch.load a state_dict before the
first step and torch.save the final one; KILL_AT=RANK:STEP:MARKER: that rank SIGKILLs
itself before that step, once (it creates the file MARKER), or raises a RuntimeError there
with RAISE_INSTEAD=1; WITH_BLOCK=1 runs the loop in `with opt:`; BACKWARD_SET_TO_NONE=1
gives each step's gradient through zero_grad(set_to_none=True) and a backward, as torch 2's
loops do, instead of writing .grad in place (BACKWARD_ACCUMULATES=1: a backward with no
zero_grad, as DeepSpeed's loops); LOSS_SCALED=1 runs that backward on
opt.scale(loss) (the config's fp16 loss scaling) and OVERFLOW_AT=RANK:STEP multiplies that
rank's loss by 1e38 at that step, so that its scaled gradient overflows, and prints whether
the step changed the parameters and how the loss scale moved. MICRO_BATCHES=K (for a
config with gradient_accumulation_steps K, whose step() calls are micro-batches) gives
micro-batch m the gradient grads[(m-1) // K], so that each optimizer step averages K
copies of the stream's gradient: exactly it. SET_BETAS=STEP:B1,B2 writes those betas into
every param group before that step, as a torch scheduler's momentum cycling does;
SET_WEIGHT_DECAY=STEP:GROUP:VALUE writes that group's weight_decay before that step (a
weight-decay schedule); RANK_LR=RANK:STEP:VALUE: that rank alone writes that lr into every
param group before that step (a schedule computed from one rank's own numbers).
"""
import contextlib
import json
import os
import signal
import sys

import numpy as np
import torch

import onebit.torch as ot


def check_state_dict(opt, n):
    """state_dict has the moments and this worker's error buffers; loading it at the same
    step changes no bit; another step is refused."""
    # Through torch.save and torch.load(weights_only=True), as users save optimizers.
    # Debian's torch 1.13 cannot load a Python float that way (its weights-only unpickler
    # lacks BINFLOAT; torch.optim.Adam's own state_dict fails the same), current PyTorch
    # can: there, every leaf is checked to be of the kinds it loads.
    import io  # noqa: PLC0415
    buffer = io.BytesIO()
    whole = opt.state_dict()
    assert_plain(whole)
    torch.save(whole, buffer)
    buffer.seek(0)
    whole = torch.load(buffer, weights_only=floats_load_weights_only())
    state = whole["param_groups"][0]["onebit"]
    assert state["step"] == opt.next_step - 1, state["step"]
    # torch.optim's layout: a state per parameter index, each group's indices.
    indices = [i for g in whole["param_groups"] for i in g["params"]]
    assert sorted(whole["state"]) == indices == list(range(len(opt.param_groups[0]["params"]) +
                                                           sum(len(g["params"]) for g in
                                                               opt.param_groups[1:]))), indices
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        entry = whole["state"][i]
        assert entry["step"].item() == state["step"], entry["step"]
        for name in ("exp_avg", "exp_avg_sq"):
            assert isinstance(entry[name], torch.Tensor) and entry[name].shape == p.shape, name
            assert torch.equal(entry[name], opt.state[p][name]), name
    assert sum(whole["state"][i]["exp_avg"].numel() for i in indices) == n
    assert set(state["errors"]) == {"worker_error", "server_error"}, state["errors"].keys()
    assert state["errors"]["worker_error"].abs().max() > 0  # the compression stage runs
    opt.load_state_dict(whole)
    whole["param_groups"][0]["onebit"] = dict(state, step=state["step"] - 1)
    try:
        opt.load_state_dict(whole)
    except ValueError as e:
        assert "the state is of step" in str(e), e
    else:
        raise AssertionError("a state of another step was loaded")
    print(f"rank {opt.rank}: state_dict checked at step {state['step']}", flush=True)


def floats_load_weights_only():
    import io  # noqa: PLC0415
    buffer = io.BytesIO()
    torch.save({"x": 0.5}, buffer)
    buffer.seek(0)
    try:
        return torch.load(buffer, weights_only=True) == {"x": 0.5}
    except Exception:  # noqa: BLE001 (torch 1.13: UnpicklingError)
        return False


def assert_plain(obj, where="state_dict()"):
    """Only what torch.load(weights_only=True) takes: tensors, Python scalars, strings,
    and lists, tuples and dicts of them (no numpy arrays)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, (str, int)), f"{where}: key {k!r}"
            assert_plain(v, f"{where}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            assert_plain(v, f"{where}[{i}]")
    else:
        assert obj is None or isinstance(obj, (torch.Tensor, bool, int, float, str)), \
            f"{where} is a {type(obj).__name__}"


def job_steps(config):
    """The job's steps, from its config file."""
    with open(config) as f:
        return json.load(f).get("steps", 600)


def main():
    config, params_path, grads_path, out_path, optimizer = sys.argv[1:6]
    split = [int(s) for s in sys.argv[6].split(",")] if len(sys.argv) > 6 and sys.argv[6] else []
    initial = np.load(params_path)
    grads = np.load(grads_path, mmap_mode="r")
    bounds = [0] + split + [initial.size]
    params = [torch.nn.Parameter(torch.from_numpy(initial[b:e].copy()))
              for b, e in zip(bounds, bounds[1:])]
    # Configured like torch.optim (OPT_KWARGS, JSON): keyword hyper-parameters, and a job
    # config without an optimizer block. The launcher's environment is readable before.
    kwargs = json.loads(os.environ.get("OPT_KWARGS", "{}"))
    print(f"before the optimizer: rank {ot.rank()} of {ot.world_size()}, local rank "
          f"{ot.local_rank()} of {ot.local_world_size()}", flush=True)
    if os.environ.get("ALSO_TORCH_DISTRIBUTED"):
        # The script's own collectives on MASTER_PORT, beside onebit's coordinator.
        import torch.distributed as dist  # noqa: PLC0415
        dist.init_process_group("gloo")  # as DDP scripts call it: all from the environment
        x = torch.ones(1) * (ot.rank() + 1)
        dist.all_reduce(x)
        print(f"torch.distributed all_reduce: {x.item():.0f}", flush=True)
        sampler = torch.utils.data.DistributedSampler(list(range(8)))  # no arguments
        print(f"DistributedSampler: rank {sampler.rank} of {sampler.num_replicas}", flush=True)
    second = os.environ.get("SECOND_GROUP")
    if kwargs:
        opt = getattr(ot, optimizer)(params, config=config, **kwargs)
    elif second:
        lr, decay = (float(x) for x in second.split(","))
        groups = [{"params": params[:1]},
                  {"params": params[1:], "lr": lr, "weight_decay": decay}]
        opt = getattr(ot, optimizer)(groups, config)
    else:
        opt = getattr(ot, optimizer)(params, config)
    # LOAD_STATE=PATH ({rank} in it: this rank's): torch.load a state_dict before the
    # first step, as a script resuming from torch.save does (a fresh job starts after it).
    load = os.environ.get("LOAD_STATE")
    if load:
        saved = torch.load(load.format(rank=ot.rank()))
        with torch.no_grad():  # the model's parameters, then the optimizer's state
            for p, q in zip(params, saved["params"]):
                p.copy_(q)
        opt.load_state_dict(saved["optimizer"])
    # LR_ZERO_AFTER=K: a torch lr_scheduler that sets lr 0 after step K (parameters then
    # stay where step K left them).
    zero_after = os.environ.get("LR_ZERO_AFTER")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 1.0 if t < int(zero_after) else 0.0) if zero_after else None
    check_state = os.environ.get("CHECK_STATE_AT")
    # LOOP_STEPS=K: a plain loop of K steps that never looks at opt.done (a job without
    # steps ends when every worker's loop did, at the script's exit).
    loop = os.environ.get("LOOP_STEPS")
    micro = int(os.environ.get("MICRO_BATCHES", "1"))
    steps = range(int(loop)) if loop else iter(lambda: opt.done, True)
    # WITH_BLOCK=1: the loop inside `with opt:` (its end closes the optimizer).
    with opt if os.environ.get("WITH_BLOCK") else contextlib.nullcontext():
        for _ in steps:
            t = opt.next_step
            set_betas = os.environ.get("SET_BETAS")
            if set_betas and t == int(set_betas.split(":")[0]):
                for group in opt.param_groups:
                    group["betas"] = tuple(float(b) for b in set_betas.split(":")[1].split(","))
            set_decay = os.environ.get("SET_WEIGHT_DECAY")
            if set_decay and t == int(set_decay.split(":")[0]):
                _, group, value = set_decay.split(":")
                opt.param_groups[int(group)]["weight_decay"] = float(value)
            rank_lr = os.environ.get("RANK_LR")
            if rank_lr and opt.rank == int(rank_lr.split(":")[0]) and \
                    t == int(rank_lr.split(":")[1]):
                for group in opt.param_groups:
                    group["lr"] = float(rank_lr.split(":")[2])
            if check_state and t == int(check_state):
                check_state_dict(opt, initial.size)
            kill_at = os.environ.get("KILL_AT")  # "RANK:STEP:MARKER": once, the marker says
            if kill_at:
                rank, step, marker = kill_at.split(":", 2)
                if opt.rank == int(rank) and t == int(step) and not os.path.exists(marker):
                    open(marker, "w").close()
                    if os.environ.get("RAISE_INSTEAD"):
                        raise RuntimeError(f"rank {rank}: an error of the script's before step {t}")
                    print(f"rank {rank}: killing itself before step {t}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            g = torch.from_numpy(np.array(grads[(t - 1) // micro, opt.rank]))
            overflow = os.environ.get("OVERFLOW_AT", "-1:-1").split(":")
            overflow_step = t == int(overflow[1])
            if overflow_step:
                before, scale_before = torch.cat([p.detach().reshape(-1) for p in params]), \
                    opt.loss_scale
            accumulates = os.environ.get("BACKWARD_ACCUMULATES")
            if os.environ.get("BACKWARD_SET_TO_NONE") or accumulates:
                # As torch 2's loops do: the gradients set to None, and backward writes tensors
                # of its own (d/dp sum(p * g) is g, exactly; with a power-of-two loss scale,
                # scale * g exactly). BACKWARD_ACCUMULATES: as DeepSpeed's loops, no zero_grad
                # at all (backward adds to .grad).
                if not accumulates:
                    opt.zero_grad(set_to_none=True)
                loss = sum((p * g[b:e]).sum() for p, b, e in zip(params, bounds, bounds[1:]))
                if overflow_step and opt.rank == int(overflow[0]):
                    loss = loss * 1e38
                (opt.scale(loss) if os.environ.get("LOSS_SCALED") else loss).backward()
            else:
                for p, b, e in zip(params, bounds, bounds[1:]):
                    p.grad.copy_(g[b:e])
            if os.environ.get("CLIP_EACH_STEP"):
                opt.clip_grad_norm_(float(os.environ["CLIP_EACH_STEP"]))
            opt.step(loss=0.0)
            if overflow_step:
                after = torch.cat([p.detach().reshape(-1) for p in params])
                print(f"rank {opt.rank}: step {t}: parameters unchanged: "
                      f"{torch.equal(before, after)}, loss scale {scale_before:g} -> "
                      f"{opt.loss_scale:g}", flush=True)
            if scheduler is not None:
                scheduler.step()
    if loop:
        opt.close()  # what the interpreter's exit would do; the final state below needs it
    # After the end: the final state (the worker is gone), equal to the final parameters.
    final = opt.state_dict()
    step = final["param_groups"][0]["onebit"]["step"]
    assert step == (int(loop) // micro if loop else job_steps(config)), (step, config)
    assert all(torch.equal(final["state"][i]["exp_avg"], opt.state[p]["exp_avg"])
               for i, p in enumerate(params)), "final state"
    save = os.environ.get("SAVE_STATE")  # torch.save the model and the final state_dict
    if save:
        torch.save({"params": [p.detach() for p in params], "optimizer": final},
                   save.format(rank=opt.rank))
    if opt.rank == 0:
        np.save(out_path, torch.cat([p.detach().reshape(-1) for p in params]).numpy())


if __name__ == "__main__":
    # FINALLY_FILE=PATH: each rank writes PATH-RANK in a finally block (a job's failure is
    # an OnebitError in every rank's script, so it runs on the peers of a failed rank too).
    finally_file = os.environ.get("FINALLY_FILE")
    try:
        main()
    finally:
        if finally_file:
            with open(f"{finally_file}-{os.environ.get('RANK', '?')}", "w") as f:
                f.write("finally ran\n")
