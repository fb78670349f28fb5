"""onebit's optimizers for PyTorch models (torch.optim.Optimizer subclasses).

    opt = onebit.torch.OneBitAdam(model.parameters(), "job.json")
    for batch in data:
        opt.zero_grad()
        loss = loss_fn(model(batch))
        loss.backward()
        opt.step(loss=loss)          # the exchange and the update, in C++
        if opt.done:                 # the coordinator ended the job
            break

The job config is the same JSON (or a dict of it) that onebit-launch and onebit-worker read;
its optimizer block must name this class's type. The process finds its job from the
environment that onebit-launch (or compose, or Kubernetes) sets:

    ONEBIT_COORDINATOR    host:port of the coordinator (required, or coordinator=...)
    ONEBIT_RANK           the rank to ask for (default: the next free one)
    ONEBIT_HOST           this process's address for gloo and /metrics (default 127.0.0.1)
    ONEBIT_METRICS_PORT   the /metrics port (default 0: a free one)
    ONEBIT_SUMMARY_FILE   where to write the worker's JSON summary at the end
    ONEBIT_HISTORY_CSV    every step as CSV
    ONEBIT_MEMBER_TOKEN   the coordinator's member token, where it asks for one

MEMORY: the parameters are ONE flat float32 buffer, the optimizer's own; each parameter
tensor views its slice (no copies either way), and so do the gradients (their own flat
buffer, which the C++ side copies once per step). Every worker must start from the same
parameters: seed the model alike (torch.manual_seed) on every process.
"""

import atexit
import json
import os
import sys
import tempfile
import weakref

import numpy as np
import torch

__all__ = ["OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adam", "OnebitError"]


class OnebitError(RuntimeError):
    """The worker stopped: the job failed, or it recovers (exit with `exit_code`)."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


def _exit_with_the_workers_code(kind, value, tb, _previous=sys.excepthook):
    """An OnebitError nobody caught ends the script with the code the coordinator asked
    for (75: the job recovers, restart me), as onebit-worker would exit."""
    _previous(kind, value, tb)
    if isinstance(value, OnebitError):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(value.exit_code)


sys.excepthook = _exit_with_the_workers_code


def _core():
    try:
        import _onebit_core  # noqa: PLC0415 (built by Bazel: bazel-bin/python)
    except ImportError as e:
        raise ImportError(
            "onebit's extension _onebit_core is not on the path: build it with "
            "`bazel build //python:_onebit_core.so` and put bazel-bin/python on PYTHONPATH "
            "(onebit-launch does)") from e
    return _onebit_core


def _load_config(config):
    """(the config as a dict, the path of a JSON file holding it)."""
    if isinstance(config, dict):
        f = tempfile.NamedTemporaryFile("w", prefix="onebit-job-", suffix=".json", delete=False)
        with f:
            json.dump(config, f)
        return config, f.name
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        # The C++ side parses it (with comments and trailing commas, as DeepSpeed's files
        # have them); here only the optimizer block is read, leniently.
        with open(path) as f:
            text = f.read()
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = {}
        return parsed, path
    raise TypeError(f"config must be a dict or a path to a JSON file, not {type(config).__name__}")


def _cuda_view(address, n, device):
    class _Memory:
        __cuda_array_interface__ = {
            "shape": (n,), "typestr": "<f4", "data": (address, False), "version": 2}
    return torch.as_tensor(_Memory(), device=device)


class _OnebitOptimizer(torch.optim.Optimizer):
    _type = None  # the job config's optimizer.type

    def __init__(self, params, config, *, coordinator=None, timeout_s=600.0):
        parsed, path = _load_config(config)
        block = parsed.get("optimizer", {}) if isinstance(parsed, dict) else {}
        job_type = block.get("type")
        if job_type is not None and job_type != self._type:
            raise ValueError(f"the job config's optimizer is {job_type}, not {self._type}: "
                             f"use onebit.torch.{job_type}")
        hp = block.get("params", {})
        defaults = {"lr": hp.get("lr", 1e-3), "betas": tuple(hp.get("betas", (0.9, 0.999))),
                    "eps": hp.get("eps", 1e-8), "weight_decay": hp.get("weight_decay", 0.0)}
        super().__init__(params, defaults)
        self._params = [p for group in self.param_groups for p in group["params"]]
        self._check_params()
        self._device = self._params[0].device
        sizes = [p.numel() for p in self._params]
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        hyper_groups = self._hyper_groups(defaults)
        initial = torch.cat([p.detach().reshape(-1).cpu() for p in self._params]).numpy()
        coordinator = coordinator or os.environ.get("ONEBIT_COORDINATOR")
        if not coordinator:
            raise ValueError("no coordinator: set ONEBIT_COORDINATOR (onebit-launch does) or "
                             "pass coordinator='host:port'")
        self._timeout = float(timeout_s)
        self._worker = _core().Worker(
            config=path, coordinator=coordinator, initial=np.ascontiguousarray(initial),
            groups=self._offsets, host=os.environ.get("ONEBIT_HOST", "127.0.0.1"),
            metrics_port=int(os.environ.get("ONEBIT_METRICS_PORT", "0")),
            rank=int(os.environ.get("ONEBIT_RANK", "-1")),
            summary_file=os.environ.get("ONEBIT_SUMMARY_FILE", ""),
            history_csv=os.environ.get("ONEBIT_HISTORY_CSV", ""),
            cuda_device=(self._device.index or 0) if self._device.type == "cuda" else 0,
            member_token_file=os.environ.get("ONEBIT_MEMBER_TOKEN_FILE", ""),
            hyper_groups=hyper_groups)
        self.done = False
        self._worker.start()
        self._next = self._wait()
        if not self.done:
            self._bind()
        worker = weakref.ref(self._worker)
        atexit.register(lambda: worker() is not None and worker().close("the script exited"))

    # ---- what the job says ----
    @property
    def rank(self):
        return self._worker.rank

    @property
    def world_size(self):
        return self._worker.world_size

    @property
    def next_step(self):
        """The step the next step() call completes (-1 once done)."""
        return self._next

    # ---- the training loop ----
    def step(self, closure=None, loss=None):
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.done:
            raise OnebitError("the job is over for this worker (see .done)", 0)
        for i, p in enumerate(self._params):
            grad = p.grad
            if grad is None:
                raise ValueError(f"parameter {i} ({tuple(p.shape)}) has no gradient: every "
                                 "parameter must take part in the loss (or leave the optimizer)")
            if grad.is_sparse:
                raise ValueError(f"parameter {i} has a sparse gradient; onebit needs dense ones")
            view = self._grad_views[i]
            if grad.data_ptr() != view.data_ptr():  # zero_grad(set_to_none=True), or replaced
                view.copy_(grad.reshape(view.shape))
                p.grad = view
        if self._device.type == "cuda":
            torch.cuda.current_stream(self._device).synchronize()
        value = 0.0 if loss is None else float(loss)
        self._worker.supply(self._next, value)
        self._next = self._wait()
        return loss

    def state_dict(self):
        """The optimizer's state between two steps, as copies: {"onebit": {"step",
        "freeze_step", "tensors" (params, exp_avg, exp_avg_sq, and an optimizer's own, by
        name), "scalars", "errors" (this worker's worker_error, and server_error in peer
        mode), "trainer" (fp16's loss scaler)}, "param_groups": the hyper-parameters}."""
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        return {"onebit": self._worker.state_dict(), "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Puts back a state_dict() of the step the job is at (the coordinator decides the
        steps; a job resumes from its checkpoint.dir, which every worker and shard writes).
        ValueError, and no change, for another step or a state that does not fit."""
        self._worker.load_state_dict(state_dict["onebit"])

    def close(self, why="closed by the script"):
        """Stops the worker: the job hears of it (the trainer fails with `why`)."""
        self._worker.close(why)

    # ---- internals ----
    def _hyper_groups(self, job):
        """Each param group's (begin, end, lr / the job's lr, weight_decay) in the flat
        buffer, or [] when every group has the job's. A group's lr is a fixed multiple of the
        job's, so the config's scheduler moves every group alike; betas and eps are the job's
        for all (the momentum is one flat exchange)."""
        groups, begin, same = [], 0, True
        for i, group in enumerate(self.param_groups):
            for key in ("betas", "eps"):
                value = tuple(group[key]) if key == "betas" else group[key]
                if value != job[key]:
                    raise ValueError(
                        f"param group {i} sets {key}={group[key]}, the job config {job[key]}: "
                        f"every group steps with the job's {key} (the momentum is one flat "
                        "exchange); only lr and weight_decay may differ per group")
            lr, decay = float(group["lr"]), float(group["weight_decay"])
            if lr < 0 or decay < 0:
                raise ValueError(f"param group {i}: lr and weight_decay must be >= 0, got "
                                 f"lr={lr}, weight_decay={decay}")
            if job["lr"] == 0 and lr != 0:
                raise ValueError(f"param group {i} sets lr={lr} while the job config's lr is 0: "
                                 "a group's lr is a multiple of the job's")
            scale = 1.0 if job["lr"] == 0 else lr / job["lr"]
            end = begin + sum(p.numel() for p in group["params"])
            if end == begin:
                raise ValueError(f"param group {i} has no parameters")
            groups.append((begin, end, scale, decay))
            same = same and lr == job["lr"] and decay == job["weight_decay"]
            begin = end
        return [] if same else groups

    def _check_params(self):
        if not self._params:
            raise ValueError("no parameters to optimize")
        device = self._params[0].device
        for i, p in enumerate(self._params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameter {i} is a {type(p).__name__}, not a tensor")
            if p.dtype != torch.float32:
                raise ValueError(f"parameter {i} is {p.dtype}; onebit's parameters are float32 "
                                 "(mixed precision is the config's fp16/bf16 block)")
            if p.is_sparse:
                raise ValueError(f"parameter {i} is sparse")
            if not p.is_contiguous():
                raise ValueError(f"parameter {i} is not contiguous")
            if p.device != device:
                raise ValueError(f"parameter {i} is on {p.device}, parameter 0 on {device}")
            if not p.requires_grad:
                raise ValueError(f"parameter {i} does not require a gradient")

    def _wait(self):
        try:
            step = self._worker.wait_for_step(self._timeout)
        except Exception as e:
            self._unbind()
            code = self._worker.exit_code_after_failure()
            raise OnebitError(f"onebit worker stopped: {e}", code) from e
        if step < 0:
            self.done = True
            self._unbind(final=True)
        return step

    def _bind(self):
        n = self._offsets[-1]
        if self._worker.cuda:
            flat = _cuda_view(self._worker.params_address(), n, self._device)
            grad = _cuda_view(self._worker.gradient_address(), n, self._device)
        else:
            flat = torch.from_numpy(self._worker.params())
            grad = torch.from_numpy(self._worker.gradient())
        self._grad_views = []
        with torch.no_grad():
            for p, begin, end in zip(self._params, self._offsets, self._offsets[1:]):
                p.data = flat[begin:end].view(p.shape)
                view = grad[begin:end].view(p.shape)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                self._grad_views.append(view)

    def _unbind(self, final=False):
        # The C++ buffers go with the worker: the tensors get memory of their own.
        with torch.no_grad():
            if final:
                last = torch.from_numpy(self._worker.final_params().copy()).to(self._device)
            for p, begin, end in zip(self._params, self._offsets, self._offsets[1:]):
                p.data = last[begin:end].view(p.shape).clone() if final else \
                    torch.full(p.shape, float("nan"), device=self._device)
                p.grad = None


class OneBitAdam(_OnebitOptimizer):
    """1-bit Adam (DeepSpeed's OneBitAdam): the job config's optimizer.type "OneBitAdam"."""
    _type = "OneBitAdam"


class ZeroOneAdam(_OnebitOptimizer):
    """0/1 Adam: optimizer.type "ZeroOneAdam"."""
    _type = "ZeroOneAdam"


class OneBitLamb(_OnebitOptimizer):
    """1-bit LAMB (each parameter tensor is one of LAMB's layers): "OneBitLamb"."""
    _type = "OneBitLamb"


class Adam(_OnebitOptimizer):
    """Adam with a full-precision exchange every step (the baseline): "Adam"."""
    _type = "Adam"
