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

import atexit
import bisect
import collections.abc
import contextlib
import copy
import hashlib
import json
import os
import sys
import tempfile
import weakref

import torch

from onebit import env as _env
from onebit.env import local_rank, local_world_size, rank, world_size

__all__ = ["OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adam", "OnebitError", "ScriptError",
           "ScriptValueError", "ScriptRuntimeError", "load_config",
           "rank", "world_size", "local_rank", "local_world_size"]


class _Unset:
    """A keyword argument the caller did not give (its repr is the API reference's)."""

    def __repr__(self):
        return "unset"


_UNSET = _Unset()

# The hyper-parameters the optimizers take as keyword arguments: the job config's
# optimizer.params keys. A keyword wins over the config's optimizer block; with neither,
# `default` applies (a str is a rule in words). The constructor takes the defaults of lr,
# betas, eps, weight_decay and bias_correction from here; the job config applies the
# others' (config/job_config_schema.cc). The API reference (docs/api.md) prints this table,
# and its test checks each default against docs/config.md (`config_default`, where the job
# config's own default differs) and each type's keys against its Types column.
_Keyword = collections.namedtuple("_Keyword", "default meaning config_default",
                                  defaults=(None,))
_KEYWORDS = {
    "lr": _Keyword(1e-3, "The learning rate. A torch lr_scheduler may move it before any "
                         "step()."),
    "betas": _Keyword((0.9, 0.999), "Adam's (beta1, beta2), the same for every param group. "
                                    "A schedule may move them (OneCycleLR's momentum "
                                    "cycling)."),
    "eps": _Keyword(1e-8, "Added to the denominator outside the square root. It is fixed when "
                          "the optimizer is built: a change in param_groups is a ValueError."),
    "weight_decay": _Keyword(0.0, "Decoupled weight decay, as torch.optim.AdamW's: "
                                  "lr * weight_decay * p joins the update, outside the "
                                  "compressed momentum. Each param group may have and schedule "
                                  "its own."),
    "bias_correction": _Keyword(
        True, "Adam's bias correction, on by default as in torch's Adam. Under a job config "
              "with an optimizer block, the block's value applies, off by default "
              "(docs/algorithms.md).", config_default=False),
    "freeze_step": _Keyword(
        "automatic (OneBitAdam, OneBitLamb)", "The last warmup step: OneBitAdam and OneBitLamb compress from the next "
                     "one. Without it the config's onebit.freeze block decides. Without that "
                     "block too, the coordinator freezes when the variance settles. Adam "
                     "accepts it and never freezes.", config_default=100000),
    "update_clip": _Keyword(2.0, "The bound on each element's m/(sqrt(v)+eps) on the steps "
                                 "whose variance is frozen; weight decay is added after it. It "
                                 "keeps elements whose variance froze near 0 from moving by "
                                 "scale/eps. 0 turns it off, as in DeepSpeed. Adam never "
                                 "freezes, so it has no effect there."),
    "var_freeze_step": _Keyword(100000, "The last step that may update the variance: the end "
                                        "of 0/1 Adam's variance stage."),
    "var_update_scaler": _Keyword(16, "kappa: the variance steps before the interval between "
                                      "them doubles."),
    "local_step_scaler": _Keyword(32678, "The local stage's steps before local_step_interval "
                                         "(the interval between sync steps) doubles."),
    "local_step_clipper": _Keyword(16, "H: the largest local_step_interval."),
    "max_coeff": _Keyword(10.0, "The trust ratio's upper clamp."),
    "min_coeff": _Keyword(0.01, "The trust ratio's lower clamp; above 0 and at most "
                                "max_coeff."),
    "coeff_beta": _Keyword(0.9, "The factor of the trust ratio's running average; in [0, 1)."),
    "factor_max": _Keyword(4.0, "The upper clamp of the compression stage's fresh-variance "
                                "factor; at least 1."),
    "factor_min": _Keyword(0.5, "The lower clamp of the compression stage's fresh-variance "
                                "factor; above 0 and at most 1."),
    "factor_threshold": _Keyword(0.1, "How far a tensor's fresh-variance factor may move in one "
                                      "step, as a fraction of its last value."),
}

# The parameter types onebit trains: float32 ones view its flat buffer; bfloat16 and float16
# ones keep their memory, and the buffer holds their float32 master copy.
_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The steps of a job without `steps` (config/job_config.h's kOpenEndedSteps): it runs until
# its workers' training loops end, and ends after the step where they all did.
OPEN_ENDED_STEPS = 1 << 40
_FIRST_BUCKET_BYTES = 1 << 20  # DDP's first bucket: the last layers go out soon
_BUILT = weakref.WeakSet()  # this process's optimizers: one at a time may be in a job
# This process's optimizers that made a job: each rank's n-th is the same job, told apart
# from the others by its key (RegisterRequest.job_key), so that a rank on to the next job
# waits out the last one's coordinator at MASTER_PORT + 1 instead of joining it.
_JOBS_MADE = 0


def _phase(name):
    """step()'s phase `name` as a range torch.profiler shows ("onebit.step: ..."; how
    tools/gpu/step_bench.py --profile_steps splits the host's part of a step); nothing
    while no profiler runs (a range costs ~6 us a step, a check 0.1 us)."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(f"onebit.step: {name}")
    return contextlib.nullcontext()


def _per_rank(path):
    """A path from the environment with {rank} replaced by this process's rank."""
    return path.replace("{rank}", str(rank()))


def _after_accumulation(p, fn):
    """Calls fn() each time backward has accumulated p's gradient into p.grad (torch's
    post-accumulate hook where it has one, >= 2.1; before, a hook on p's AccumulateGrad
    node, which must be kept alive: returned)."""
    def hook(*_):
        fn()  # and None: torch 2 refuses a hook that returns anything else

    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(hook)
    with torch.enable_grad():
        node = p.expand_as(p).grad_fn.next_functions[0][0]
    node.register_hook(hook)
    return node


def _buckets(sizes, first_cap, cap):
    """Parameter indices in reverse order (as backward finishes them), grouped into
    buckets of at least first_cap floats (the first) and cap (the others) where they
    reach it: a list of index lists."""
    buckets, current, total, limit = [], [], 0, first_cap
    for i in reversed(range(len(sizes))):
        current.append(i)
        total += sizes[i]
        if total >= limit:
            buckets.append(current)
            current, total, limit = [], 0, cap
    if current:
        buckets.append(current)
    return buckets


class ScriptError(Exception):
    """onebit's own check of the training script failed (a second optimizer, a parameter
    without a gradient, a gradient changed after it was sent, ...): no restart fixes it.
    Caught, it is the script's to handle; uncaught, the job fails on every rank and this
    process exits 78 ("do not restart"), as does every other rank. Raised as
    ScriptValueError or ScriptRuntimeError, so `except ValueError`/`RuntimeError` still
    catch them."""


class ScriptValueError(ScriptError, ValueError):
    """A ScriptError that is a ValueError: the script asks what the optimizer cannot do (a
    second optimizer in the job, a parameter without a gradient, ...)."""


class ScriptRuntimeError(ScriptError, RuntimeError):
    """A ScriptError that is a RuntimeError: the script did something at the wrong time (a
    gradient changed after it went to the exchange, a parameter given memory of its own)."""


class OnebitError(RuntimeError):
    """The worker stopped: the job failed (exit_code 78: do not restart), or it recovers
    (75: restart me), or this worker hit an error of its own (1).

    Uncaught, it ends the script with its exit_code, as onebit-worker would exit.

    Args:
        message: Why the worker stopped, in the coordinator's words where it gave them.
        exit_code: The exit code the job's verdict asks of this process (the attribute of
            the same name): 78, 75 or 1.
    """

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


def _exit_with_the_workers_code(kind, value, tb):
    """An OnebitError nobody caught ends the script with the code the coordinator asked
    for (75: the job recovers, restart me; 78: the job failed, do not restart), as
    onebit-worker would exit."""
    _previous_excepthook[0](kind, value, tb)
    if isinstance(value, OnebitError):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(value.exit_code)
    what = f"the script raised {kind.__name__}: {value}"
    if isinstance(value, (ScriptError, KeyboardInterrupt)):
        # No restart fixes it (a Ctrl-C is the user's word): the job fails on every rank.
        for opt in list(_BUILT):
            if not (opt._closed or opt._done):
                opt.close(what, restartable=False)
            opt._close_coordinator()
        if isinstance(value, ScriptError):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(78)
        return  # KeyboardInterrupt: Python's own exit (130)
    _uncaught.append(what)


# The script's uncaught exception (the end-of-script close names it, and lets the job
# recover from it, as from a lost process: a restart may fix it).
_uncaught = []


_previous_excepthook = [None]


def _die_with_the_launcher():
    """A rank a launcher started (torchrun, onebit-run, srun: RANK or the like is set) gets
    SIGTERM when the launcher dies, so that a SIGKILLed launcher leaves no orphans that
    train on (Linux's PR_SET_PDEATHSIG; elsewhere nothing). Once, at the first optimizer."""
    if _previous_excepthook[0] is not None or not sys.platform.startswith("linux"):
        return
    if not any(os.environ.get(v) for v in ("RANK", "ONEBIT_RANK", "SLURM_PROCID")):
        return
    import ctypes  # noqa: PLC0415
    import signal  # noqa: PLC0415
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _install_excepthook():
    """Puts _exit_with_the_workers_code before the script's own sys.excepthook, once the
    first optimizer is built: importing onebit.torch changes nothing global."""
    if _previous_excepthook[0] is None:
        _previous_excepthook[0] = sys.excepthook
        sys.excepthook = _exit_with_the_workers_code


# The Debian packages of the shared libraries the extension loads (the wheel's METADATA
# says the same, as Requires-External), to name the one to install when a library is missing.
_DEBIAN_PACKAGES = {
    "libabsl": "libabsl20220623", "libgrpc++": "libgrpc++1.51", "libgrpc.": "libgrpc29",
    "libgpr": "libgrpc29", "libupb": "libgrpc29", "libaddress_sorting": "libgrpc29",
    "libprotobuf": "libprotobuf32", "libgloo": "libgloo0",
    "libprometheus-cpp-core": "libprometheus-cpp-core1.0",
    "libprometheus-cpp-pull": "libprometheus-cpp-pull1.0",
    "libcpp-httplib": "libcpp-httplib0.11", "libcivetweb": "libcivetweb1",
    "libssl": "libssl3", "libcrypto": "libssl3", "libz.": "zlib1g",
}


def _missing_library_hint(message):
    """What to do about an ImportError that names a shared library, or None."""
    import re  # noqa: PLC0415
    m = re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", message)
    if not m:
        return None
    library = m.group(1)
    if library.startswith("libnccl"):
        return (f"{library} is missing: onebit needs NCCL 2 (CUDA 13's, under /usr/local/cuda; "
                "its lib directory must be known to the dynamic loader, e.g. in ld.so.conf)")
    for prefix, package in _DEBIAN_PACKAGES.items():
        if library.startswith(prefix):
            return f"{library} is missing: apt-get install {package}"
    return f"{library} is missing (see the wheel's Requires-External)"


def _core():
    """The native core (onebit/_native.py over libonebit_core.so), loaded at first use."""
    from onebit import _native  # noqa: PLC0415
    try:
        _native.lib()
    except OSError as e:
        hint = _missing_library_hint(str(e))
        raise ImportError(f"onebit's native core cannot load: {hint or e}") from e
    except ImportError as e:
        raise ImportError(
            f"{e}: pip install the wheel (bash python/wheel/build.sh), or build it with "
            "`bazel build //python:libonebit_core.so` and put bazel-bin/python on PYTHONPATH "
            "(onebit-launch does)") from e
    return _native


def load_config(config):
    """The job config as a dict, read as the optimizers read their `config`.

    A script that reads the config it passes as `config=` (its batch size, steps, seed)
    reads it with this, so that both see the same file.

    Args:
        config: A path to a JSON file, a dict, or None. The file may be DeepSpeed's
            ds_config.json: its `//` and `/* */` comments and trailing commas are taken out,
            as onebit's C++ parser does.

    Returns:
        A new dict: the file's content, a deep copy of the dict, or {} for None.
    """
    if config is None:
        return {}
    if isinstance(config, dict):
        return json.loads(json.dumps(config))  # a deep copy the caller does not see change
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        with open(path) as f:
            text = f.read()
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            # Comments and trailing commas, as DeepSpeed's files have them: taken out by
            # the C++ config parser's own code.
            return json.loads(_core().strict_json(text))
    raise TypeError(f"config must be a dict or a path to a JSON file, not {type(config).__name__}")


def _code_digest():
    """The SHA-256 of the training script and of the Python modules it imported from its own
    directory tree (the user's code: not site-packages, not onebit), or "" in an interactive
    session. A job that failed stays failed when rank 0 starts it again with the same config
    and code (a launcher's restart cannot fix it); edited code, like another config, is the
    fix and a new job. Modules are those imported by the time the optimizer is built."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        return ""
    main = os.path.realpath(path)
    root = os.path.dirname(main)
    ours = os.path.dirname(os.path.realpath(__file__)) + os.sep
    files = {main}
    for module in list(sys.modules.values()):
        f = getattr(module, "__file__", None)
        if not isinstance(f, str) or not f.endswith(".py"):
            continue
        f = os.path.realpath(f)
        inside = os.path.relpath(f, root).split(os.sep)
        if inside[0] == os.pardir or f.startswith(ours) or any(
                part in ("site-packages", "dist-packages") for part in inside):
            continue
        files.add(f)
    digest = hashlib.sha256()
    for f in sorted(files):
        try:
            with open(f, "rb") as code:
                text = code.read()
        except OSError:
            if f == main:
                return ""
            continue  # removed since its import
        digest.update(os.path.relpath(f, root).encode() + b"\0")
        digest.update(hashlib.sha256(text).digest())
    return digest.hexdigest()


# The job config's keys that the optimizers fill in or read themselves (_job_config and the
# constructor), where docs/config.md's default is not what a script gets: key: the rule. The
# API reference prints it; its test checks that docs/config.md has each key.
_CONFIG_FILLED_IN = {
    "steps": "Without it the job is open-ended: it ends after the last step every worker's "
             "loop ran (at opt.close(), a `with` block's end or the script's exit).",
    "optimizer.type": "The optimizer's class. Another type in the config is a ValueError; "
                      "Adam also takes \"AdamW\".",
    "optimizer.params": "The hyper-parameter keywords given, which win over the block's.",
    "onebit.workers": "The launcher's world size. A config's value that differs under a "
                      "launcher is a ValueError.",
    "onebit.device": "cuda for CUDA parameters, else cpu.",
    "onebit.workload.type": "pytorch.",
    "onebit.workload.parameters": "The number of elements the optimizer trains.",
    "onebit.freeze": "{\"mode\": \"automatic\"} for OneBitAdam and OneBitLamb without a "
                     "freeze_step.",
    "onebit.exchange.overlap": "The overlap keyword's decision.",
    "onebit.exchange.servers": "\"per_node\" (ps mode only): one shard per node, run by its "
                               "local rank 0, so world size / local world size shards.",
    "onebit.exchange.warmup_over": "\"workers\" for OneBitAdam and OneBitLamb with servers "
                                   "\"per_node\", where the config gives none.",
    "onebit.failure.max_restarts": "Where the config gives none: the launcher's "
                                   "--max_restarts (TORCHELASTIC_MAX_RESTARTS), if higher "
                                   "than the default.",
    "onebit.momentum_mask.ranges": "The config's ranges and those of the param groups' "
                                   "exp_avg_mask.",
}


def _job_config(job, optimizer_type, explicit, n, device, notes=None):
    """The whole job config: `job` (the user's, maybe {}) with the keyword arguments in its
    optimizer block and what the launcher and the model say in its onebit block. Defaults
    it chooses that a user should hear of go into `notes`."""
    keywords_only = "optimizer" not in job
    block = job.setdefault("optimizer", {})
    given = block.get("type")
    if given is not None and given.lower().replace("_", "") != optimizer_type.lower() and not (
            optimizer_type == "Adam" and given.lower() == "adamw"):
        raise ValueError(f"the job config's optimizer is {given}, not {optimizer_type}: "
                         f"use onebit.torch.{given}")
    block["type"] = optimizer_type
    hp = block.setdefault("params", {})
    for key, value in explicit.items():
        hp[key] = list(value) if key == "betas" else value
    if keywords_only:
        # Configured like torch.optim.Adam, it behaves like it; a job config's optimizer
        # block keeps its own default (off, docs/algorithms.md).
        hp.setdefault("bias_correction", _KEYWORDS["bias_correction"].default)
    ob = job.setdefault("onebit", {})
    if optimizer_type in ("OneBitAdam", "OneBitLamb") and "freeze_step" not in hp and \
            "freeze" not in ob:
        # No freeze step anywhere: the coordinator freezes when the variance settles
        # (onebit.freeze's automatic mode), where a static default would never compress.
        ob["freeze"] = {"mode": "automatic"}
        if notes is not None:
            notes.append("no freeze_step given: the freeze is automatic, when the variance "
                         "settles (onebit.freeze; between steps 50 and 1000); the coordinator's "
                         "log says when and why. Give freeze_step=N for a fixed step")
    launched = any(os.environ.get(v) for v in ("ONEBIT_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"))
    workers = world_size()
    if "workers" in ob and launched and ob["workers"] != workers:
        raise ValueError(f"the job config says onebit.workers = {ob['workers']}, the launcher "
                         f"started {workers} workers (WORLD_SIZE): leave it out, or make them agree")
    if "workers" not in ob:
        ob["workers"] = workers
    exchange = ob.get("exchange", {})
    if exchange.get("servers") == "per_node":
        if exchange.get("mode") != "ps":
            raise ValueError('onebit.exchange.servers "per_node" runs a shard on each node: '
                             'it needs exchange.mode "ps"')
        per_node = local_world_size()
        if workers % per_node:
            raise ValueError(f"onebit.exchange.servers \"per_node\": the world size {workers} "
                             f"is not a multiple of the local world size {per_node} "
                             "(LOCAL_WORLD_SIZE)")
        exchange["servers"] = workers // per_node
        # The shards share the workers' nodes: their warmup would send W streams into every
        # link at once, so the warmup goes between the workers unless the config says
        # otherwise (0.94x DDP against 1.83x at 100 Mbit/s, BENCHMARKS.md, "ps shards beside
        # the workers"). Only optimizers with one switch to compression take it.
        if optimizer_type in ("OneBitAdam", "OneBitLamb"):
            exchange.setdefault("warmup_over", "workers")
    # A launcher that restarts the whole group (torchrun's or onebit-run's --max_restarts)
    # recovers the job through rank 0's restarted coordinator. The job keeps at least as
    # many recoveries of its own, so that a loss the coordinator sees before the launcher
    # stops it cannot fail a job the launcher would restart.
    launcher = _env.max_restarts()
    failure = ob.get("failure", {})
    if launcher is not None and isinstance(failure, dict) and "max_restarts" not in failure:
        ob["failure"] = dict(failure, max_restarts=max(launcher, _core().default_max_restarts()))
    ob.setdefault("device", device)
    workload = ob.setdefault("workload", {})
    workload.setdefault("type", "pytorch")
    if workload.get("type") == "pytorch":
        workload.setdefault("parameters", n)
    return job


def _named_and_trainable(params):
    """torch.optim's `params` (tensors, or dicts of param groups), where each tensor may come
    as a (name, tensor) pair as model.named_parameters() gives them: the same without the
    names and without the parameters that do not require a gradient (frozen: they neither
    train nor count), with {id(tensor): name} and the number left out."""
    names, frozen = {}, 0

    def clean(seq):
        nonlocal frozen
        out = []
        for item in seq:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                names[id(item[1])] = item[0]
                item = item[1]
            if isinstance(item, torch.Tensor) and not item.requires_grad:
                frozen += 1
                continue
            out.append(item)
        return out

    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors or dicts, not a tensor "
                        "(as in torch.optim)")
    params = list(params)
    if params and isinstance(params[0], dict):
        groups = [{**g, "params": clean(list(g["params"]))} for g in params]
        return [g for g in groups if g["params"]], names, frozen
    return clean(params), names, frozen


class _BucketPlan:
    """The overlap's buckets (_buckets) and which of this step's gradients are final."""

    def __init__(self, params, offsets, first_cap, cap):
        self.buckets = _buckets([p.numel() for p in params], first_cap, cap)
        # Each bucket's parameters are adjacent in the flat buffer: [first, last] reversed.
        self.ranges = [(offsets[min(b)], offsets[max(b) + 1]) for b in self.buckets]
        self.bucket_of = [0] * len(params)
        for k, b in enumerate(self.buckets):
            for i in b:
                self.bucket_of[i] = k
        self.reset()

    def reset(self):
        """A new step: nothing final, nothing sent."""
        self.ready = [False] * len(self.bucket_of)
        self.pending = [len(b) for b in self.buckets]
        self.next = 0  # the next bucket to send
        # The gradient buffer's version counter once every bucket went (the views share
        # it): an in-place change after that (torch's clip_grad_norm_) moves it.
        self.sealed = None

    def mark(self, i):
        """Parameter i's gradient is final: the buckets that can go now, in order."""
        self.ready[i] = True
        self.pending[self.bucket_of[i]] -= 1
        out = []
        while self.next < len(self.buckets) and self.pending[self.next] == 0:
            out.append(self.next)
            self.next += 1
        return out


class _NodeShard:
    """A parameter-server shard run by this process for its node (exchange.servers
    "per_node"): onebit-server as a child process, which registers with the job's
    coordinator as shard `index` and ends with the job, or with this process."""

    def __init__(self, config_path, coordinator, index, host, job_key):
        import subprocess  # noqa: PLC0415
        binary = self.binary()
        argv = [binary, "--config=" + config_path, "--coordinator=" + coordinator,
                f"--shard={index}", "--host=" + host, "--port=0", "--metrics_port=0",
                "--job_key=" + job_key]
        token_file = os.environ.get("ONEBIT_MEMBER_TOKEN_FILE")
        if token_file:
            argv.append("--member_token_file=" + token_file)
        self.index = index
        self.process = subprocess.Popen(argv, preexec_fn=self._die_with_parent)
        print(f"onebit: this node's shard {index} runs as process {self.process.pid} "
              f"({binary})", file=sys.stderr, flush=True)

    @staticmethod
    def binary():
        """onebit-server: $ONEBIT_SERVER_BIN, else the wheel's (onebit/bin/server/), else
        Bazel's beside the extension (bazel-bin/server/)."""
        given = os.environ.get("ONEBIT_SERVER_BIN")
        if given:
            return given
        here = os.path.dirname(_core().lib().path)
        for path in (os.path.join(here, "bin", "server", "onebit-server"),
                     os.path.join(here, os.pardir, "server", "onebit-server")):
            if os.access(path, os.X_OK):
                return os.path.normpath(path)
        raise OnebitError('onebit.exchange.servers "per_node" needs onebit-server: install the '
                          "wheel, build //server:onebit-server, or set ONEBIT_SERVER_BIN")

    @staticmethod
    def _die_with_parent():
        import ctypes  # noqa: PLC0415
        import signal  # noqa: PLC0415
        PR_SET_PDEATHSIG = 1  # Linux: SIGTERM to the shard when this process dies
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    def close(self, wait_s):
        """Waits up to wait_s for the shard to end with the job, then stops it (SIGTERM)."""
        import subprocess  # noqa: PLC0415
        try:
            self.process.wait(timeout=max(0.0, wait_s))
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _cuda_view(address, n, device):
    class _Memory:
        __cuda_array_interface__ = {
            "shape": (n,), "typestr": "<f4", "data": (address, False), "version": 2}
    return torch.as_tensor(_Memory(), device=device)


class _State(collections.abc.Mapping):
    """opt.state: each parameter's optimizer state, as torch.optim.Adam's is read ("step",
    "exp_avg", "exp_avg_sq", and a type's own buffers by their names in state_dict()),
    taken from the worker between two steps or after the last one. Each read is a COPY on
    the parameter's device: changing it changes nothing (load_state_dict sets state).
    Empty before the first step, as torch's; a tensor that is not a parameter of the
    optimizer is a KeyError."""

    def __init__(self, opt):
        self._opt = weakref.ref(opt)

    def _started(self):
        """True once the job has taken a step (without joining a job for it)."""
        opt = self._opt()
        return (opt is not None and opt._worker is not None and
                opt._worker.state_slice(0, 0)["step"] >= 1)

    def __getitem__(self, p):
        opt = self._opt()
        index = None if opt is None else opt._index_of.get(id(p))
        if index is None or opt._params[index] is not p:
            raise KeyError("not a parameter of this optimizer")
        if opt._worker is None:
            return {}
        begin, end = opt._offsets[index], opt._offsets[index + 1]
        state = opt._worker.state_slice(begin, end)
        if state["step"] < 1:
            return {}
        out = {"step": torch.tensor(float(state["step"]))}
        for name, values in state["tensors"].items():
            out[name] = values.view(p.shape).to(opt._device)
        return out

    def __iter__(self):
        return iter(self._opt()._params if self._started() else ())

    def __len__(self):
        return len(self._opt()._params) if self._started() else 0

    def __bool__(self):
        # True even before the first step: onebit's state exists from the start (zeros).
        # torch.distributed.checkpoint's get/set_optimizer_state_dict take a step of their
        # own to make a state where `optim.state` is false, which here would be a step of
        # the job.
        return True

    def __reduce__(self):
        # Pickled (the optimizer with it, as torch 1.13's OneCycleLR.state_dict() does
        # through its bound anneal_func): a plain dict of the copies a read gives.
        opt = self._opt()
        return (dict, ({} if opt is None else {p: self[p] for p in self},))


class _OnebitOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step() runs the job's exchange and update in C++: each
    process that builds one is a worker of the job.

    The worker joins the job at the first step(), or at the first read of done, rank,
    world_size, next_step or loss_scale (which scale() reads). Until then the model's parameters may still
    change, and load_state_dict() may give the state to start after. A `with` block closes
    the optimizer at its end. `opt.state[p]` reads one parameter's state as
    torch.optim.Adam's does: copies, read-only.

    Args:
        params: The parameters to train, as torch.optim takes them: tensors, (name, tensor)
            pairs from model.named_parameters(), or param-group dicts. Those that do not
            require a gradient are left out. They must be float32, bfloat16 or float16,
            dense and contiguous, all on one device.
        decoupled_weight_decay: True, torch 2's keyword for AdamW's decoupled weight decay.
            False, the L2 form of torch.optim.Adam, is a ValueError: add the L2 term to the
            loss instead.
        config: The job config: a path to a JSON file, a dict, or None for $ONEBIT_CONFIG
            (none where it is unset). It gives the rest of the job: exchange mode, steps,
            checkpoints, freezing, security. The keywords win over its optimizer block. A
            path or dict in lr's place is taken as config, the older form.
        coordinator: host:port of a running onebit-coordinator. None: $ONEBIT_COORDINATOR,
            else rank 0 runs the job's coordinator in its own process on MASTER_PORT + 1.
        timeout_s: How long step() waits for the worker to finish a step before it raises
            OnebitError. Rank 0 also waits up to this long at the end, for the others to
            finish the job.
        overlap: Whether the warmup's full-precision exchange starts during backward(), as
            DDP's does. None: on for CPU tensors where the warmup goes between the workers
            (peer mode, or ps with warmup_over "workers"), without fp16 loss scaling or
            gradient_accumulation_steps. True where it cannot work is a ValueError. It must
            agree with the config's onebit.exchange.overlap where both are given.
        bucket_cap_mb: With overlap on, the most MB of gradients in each bucket that goes
            to the exchange during backward(), as DDP's. The first bucket takes up to 1 MB.
            It must be > 0.
        **hyper: The type's own hyper-parameters (its section lists them). Any other
            keyword is a TypeError.
    """
    _type = None  # the job config's optimizer.type
    _own = ()     # the type's own keyword hyper-parameters (optimizer.params keys)
    _states = ()  # the type's state tensors besides exp_avg and exp_avg_sq, from step 1
    # torch.amp.GradScaler then leaves the step to step() (grad_scale, found_inf): the
    # workers unscale and agree on overflows in C++ (_script_grad_scale).
    _step_supports_amp_scaling = True

    def __init__(self, params, lr=_UNSET, betas=_UNSET, eps=_UNSET, weight_decay=_UNSET, *,
                 bias_correction=_UNSET, decoupled_weight_decay=True, config=None,
                 coordinator=None, timeout_s=600.0, overlap=None, bucket_cap_mb=25.0, **hyper):
        if not decoupled_weight_decay:
            raise ValueError(
                "decoupled_weight_decay=False: onebit's weight decay is decoupled, as AdamW's "
                "and DeepSpeed's 1-bit optimizers' (lr * weight_decay * p joins the update; it "
                "never enters the compressed momentum); torch.optim.Adam's L2 form is not "
                "offered: add the L2 term to the loss instead")
        if isinstance(lr, (str, dict, os.PathLike)):  # the older form: (params, config)
            if config is not None:
                raise TypeError("the config is given twice (second argument and config=)")
            lr, config = _UNSET, lr
        # On every rank, before anything is registered on the parameters (before: rank 0
        # only, and the others' second optimizer waited for a job that never came: a GAN's
        # loop hung).
        self._refuse_a_second_member()
        unknown = sorted(set(hyper) - set(self._own))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected keyword argument(s) "
                            f"{', '.join(unknown)}; its own are {', '.join(self._own) or 'none'}")
        explicit = {k: v for k, v in dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                          bias_correction=bias_correction, **hyper).items()
                    if v is not _UNSET}
        if config is None:
            config = os.environ.get("ONEBIT_CONFIG") or None
        job = load_config(config)
        block = job.get("optimizer", {}).get("params", {})
        block = {**block, **explicit}
        defaults = {key: block.get(key, _KEYWORDS[key].default)
                    for key in ("lr", "betas", "eps", "weight_decay")}
        defaults["betas"] = tuple(defaults["betas"])
        params, self._names, frozen = _named_and_trainable(params)
        if not params and frozen:
            raise ValueError(f"no parameter requires a gradient ({frozen} left out: "
                             "requires_grad=False)")
        super().__init__(params, defaults)
        self._params = [p for group in self.param_groups for p in group["params"]]
        self._index_of = {id(p): i for i, p in enumerate(self._params)}
        self.state = _State(self)  # torch.optim's defaultdict, read from the worker
        self._check_params()
        self._frozen = frozen  # left out: they do not train, and do not count
        # Which parameters got a gradient since the last step: backward reached them (a
        # hook), or their .grad was written or replaced (its version counter or memory moved
        # since _grad_versions, taken after the last step, at binding and at zero_grad).
        self._arrived = [False] * len(self._params)
        self._grad_versions = None
        me = weakref.ref(self)
        for i, p in enumerate(self._params):
            p.register_hook(lambda grad, i=i, me=me: me()._arrived.__setitem__(i, True)
                            if me() else None)
        # OVERLAP: each parameter's gradient, once backward accumulated it (_accumulated).
        self._hook_handles = [
            _after_accumulation(p, lambda i=i, me=me: me() is not None and me()._accumulated(i))
            for i, p in enumerate(self._params)]
        self._no_sync = 0
        self._scales_loss = False  # the config's fp16 block (_ask_config)
        self._micro_batches = 1    # step() calls a step (gradient_accumulation_steps)
        self._between_workers = False  # the warmup goes between the workers
        self._config_momentum = False  # the config's scheduler cycles the betas
        self._loss_scale = 1.0     # this step's, once joined
        self._plan = None  # the buckets, once the worker is joined with overlap on
        self._device = self._params[0].device
        sizes = [p.numel() for p in self._params]
        self._offsets = [0]
        for size in sizes:
            self._offsets.append(self._offsets[-1] + size)
        hyper_groups = self._hyper_groups(defaults)
        masked = self._masked_ranges()
        # A torch lr_scheduler writes group["lr"]; each step hands the job's lr it implies
        # to the C++ side (_scheduled_lr).
        self._job_lr = float(defaults["lr"])
        self._initial_lrs = [float(g["lr"]) for g in self.param_groups]
        # What a schedule may not move (eps), and what it may: the betas (all groups alike)
        # and each group's weight_decay, as built.
        self._initial_betas = tuple(float(b) for b in defaults["betas"])
        self._fixed_eps = [float(g["eps"]) for g in self.param_groups]
        self._initial_decays = [float(g["weight_decay"]) for g in self.param_groups]
        self._config_scheduler = bool(job.get("scheduler"))
        # Without steps the job is open-ended: it ends when the workers' loops do.
        self._open_ended = "steps" not in job
        self._steps = OPEN_ENDED_STEPS if self._open_ended else int(job["steps"])
        node_shards = job.get("onebit", {}).get("exchange", {}).get("servers") == "per_node"
        notes = []
        given_config_optimizer = "optimizer" in job
        job = _job_config(job, self._type, explicit, self._offsets[-1],
                          "cuda" if self._device.type == "cuda" else "cpu", notes)
        if self._open_ended:
            job["steps"] = OPEN_ENDED_STEPS
        if masked:
            mask = job["onebit"].setdefault("momentum_mask", {})
            if mask.get("npy"):
                raise ValueError("a param group's exp_avg_mask and the job config's "
                                 "onebit.momentum_mask.npy: give one of them (the config's "
                                 "ranges may go with exp_avg_mask)")
            mask["ranges"] = list(mask.get("ranges", [])) + masked
        self._ask_config(job)
        self._overlap = self._overlap_setting(job, overlap, float(bucket_cap_mb))
        f = tempfile.NamedTemporaryFile("w", prefix="onebit-job-", suffix=".json", delete=False)
        with f:
            json.dump(job, f, indent=1)
        self._config_path = f.name
        atexit.register(os.unlink, f.name)
        try:
            notices = _core().check_config(f.name)
        except ValueError as e:  # it names the key; the file is ours, not the user's
            raise self._config_error(e, f.name) from None
        global _JOBS_MADE
        _JOBS_MADE += 1
        self._job_key = f"the script's optimizer {_JOBS_MADE}"
        self._rendezvous = _env.rendezvous(coordinator)
        self._coordinator = None
        address = self._rendezvous.coordinator
        if self._rendezvous.embedded:
            for notice in notices:  # the job's one coordinator says them once
                # Not of bias_correction when it is this package's default, not the user's.
                if notice.startswith("optimizer.params.bias_correction") and \
                        "bias_correction" not in explicit and not given_config_optimizer:
                    continue
                print(f"onebit: config notice: {notice}", file=sys.stderr)
            for note in notes:
                print(f"onebit: {note}", file=sys.stderr)
            self._coordinator = self._start_coordinator()
            address = address or self._coordinator.address
            restart = _env.restart_count()
            if restart and not job["onebit"].get("checkpoint", {}).get("dir"):
                print(f"onebit: the launcher's restart {restart}, and the job has no "
                      "onebit.checkpoint.dir to resume from: it starts again at step 1 (give "
                      "it a checkpoint.dir on storage every node sees)", file=sys.stderr)
        self._timeout = float(timeout_s)
        # exchange.servers "per_node": local rank 0 of each node runs the node's shard.
        self._shard = None
        if node_shards and local_rank() == 0:
            self._shard = _NodeShard(self._config_path, address, rank() // local_world_size(),
                                     self._rendezvous.host, self._job_key)
        named_rank = any(os.environ.get(v) for v in ("ONEBIT_RANK", "RANK", "SLURM_PROCID"))
        # The worker joins the job at the first step (or rank, state_dict, ...): until then
        # the model's parameters may still change (model.load_state_dict), and a saved
        # state may be loaded (load_state_dict), where the job then starts.
        self._worker_args = dict(
            config=self._config_path, coordinator=address, groups=self._offsets,
            host=self._rendezvous.host, metrics_port=int(os.environ.get("ONEBIT_METRICS_PORT", "0")),
            rank=rank() if named_rank or self._coordinator is not None else -1,
            summary_file=_per_rank(os.environ.get("ONEBIT_SUMMARY_FILE", "")),
            history_csv=_per_rank(os.environ.get("ONEBIT_HISTORY_CSV", "")),
            cuda_device=(self._device.index or 0) if self._device.type == "cuda" else 0,
            member_token_file=os.environ.get("ONEBIT_MEMBER_TOKEN_FILE", ""),
            hyper_groups=hyper_groups,
            # POINT:STEP, onebit-worker's --fault: the worker kills its process there (tests;
            # onebit-launch --fault=workerI:POINT:STEP sets it, for the first run only; under
            # a launcher that restarts the group it acts before the first restart only).
            fault=os.environ.get("ONEBIT_FAULT", "") if not _env.restart_count() else "",
            job_key=self._job_key,
            # DDP-quiet where the ranks share a console (torchrun, onebit-run, srun): rank 0
            # prints progress, the others only warnings and errors. onebit-launch gives
            # each worker a log of its own (ONEBIT_RANK): all of it there, as
            # onebit-worker's; ONEBIT_LOG_ALL_RANKS=1 likewise anywhere.
            quiet=(rank() != 0 and not os.environ.get("ONEBIT_RANK") and
                   any(os.environ.get(v) for v in ("RANK", "SLURM_PROCID")) and
                   not os.environ.get("ONEBIT_LOG_ALL_RANKS")))
        self._worker = None
        self._masters = {}    # bfloat16/float16 parameters' float32 masters, once bound
        self._closed = False  # close() ran
        self._next = 1        # the step the next step() completes (the job's, once joined)
        self._loaded = None   # a state to start from (load_state_dict before the first step)
        self._done = False
        self._stopped = None  # why the worker stopped, once it did
        self._stopped_code = 1  # the exit code its verdict asks for
        self._failed_job = None  # why this script's own loop failed the job, if it did
        self._clip = None     # clip_grad_norm_'s max_norm for the next step
        me = weakref.ref(self)
        atexit.register(lambda: me() is not None and me()._at_exit())
        _BUILT.add(self)
        _die_with_the_launcher()
        _install_excepthook()

    def _joined(self):
        """The worker, joined to the job: its first lease granted (or the job over)."""
        if self._worker is None:
            self._refuse_a_second_member()
            # What the parameters were checked for at construction still holds (a model
            # moved or cast since would be put back, or fail in C++).
            self._check_params()
            if self._params[0].device != self._device:
                raise RuntimeError(
                    f"the parameters moved to {self._params[0].device} after the optimizer was "
                    f"built on {self._device}: move the model before building the optimizer")
            initial = self._current_params()
            if self._loaded is not None and "params" not in self._loaded["tensors"]:
                self._loaded["tensors"]["params"] = initial  # the model's, as torch.optim
            ranges = []
            if self._overlap is not None:
                self._plan = _BucketPlan(self._params, self._offsets, *self._overlap)
                ranges = self._plan.ranges
            self._worker = _core().Worker(initial=initial,
                                          loaded=self._loaded, buckets=ranges,
                                          **self._worker_args)
            self._loaded = None
            self._worker.start()
            self._next = self._wait()
            if not self._done:
                self._bind()
        return self._worker

    @property
    def done(self):
        """True once the job is over for this worker (after its last step)."""
        self._joined()
        return self._done

    def _start_coordinator(self):
        rv = self._rendezvous
        try:
            return _core().Coordinator(self._config_path, host=rv.bind_host, port=rv.grpc_port,
                                       rest_port=rv.rest_port, metrics_port=0,
                                       code_digest=_code_digest(), job_key=self._job_key)
        except (RuntimeError, ValueError, TimeoutError) as e:
            where = f"{rv.bind_host}:{rv.grpc_port}"
            raise OnebitError(
                f"rank 0 could not start the job's coordinator on {where} (MASTER_PORT + 1) "
                f"and {rv.rest_port} (MASTER_PORT + 2): {e}. Choose another MASTER_PORT, or "
                "set ONEBIT_COORDINATOR to a running onebit-coordinator") from e

    def _at_exit(self):
        if not self._done:
            if _uncaught:
                self.close(_uncaught[-1], restartable=True)
            else:
                self.close(self._stopped or self._ended_early("the script exited"))
        self._close_coordinator()
        if self._failed_job:
            # This script's loop ended before the job's last step, so the job failed for
            # good: the process says so to its launcher, as every other rank's does.
            print(f"onebit: the job failed: {self._failed_job}; exiting with 78 (do not "
                  "restart)", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(78)
        if self._stopped and self._worker is not None and self._worker.join(10.0) is None:
            # The script caught the job's OnebitError and ended; the worker's thread is
            # still blocked in an exchange with a peer that stopped, and the interpreter's
            # exit would wait for it (up to the transport's timeout). Leave now, with the
            # code the verdict asked for: the script's own handlers have run.
            print(f"onebit: {self._stopped}; the worker's exchange is still blocked: "
                  f"exiting with {self._stopped_code}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self._stopped_code)

    def _end_open_ended_job(self):
        """The loop is over in a job without steps: the worker ends after the last step it
        ran, and the job once every worker's loop ended after that same step."""
        try:
            self._joined().end_after(self._next - 1)
        except Exception as e:  # noqa: BLE001 (the worker stopped meanwhile)
            self._stopped = self._stopped or f"onebit worker stopped: {e}"
            return False
        self._next = self._wait()
        return self._done

    def _last_step(self):
        """The last optimizer step this worker's step() calls completed."""
        return (self._next - 1) // self._micro_batches

    def _ended_early(self, what):
        micro = (f" (micro-batch {self._next - 1})" if self._micro_batches > 1 else "")
        return (f"{what} after step {self._last_step()}{micro} of the job's {self._steps} "
                "(onebit.steps): the training loop is shorter than the job; every worker "
                "must run every step (stop at opt.done, or give the job fewer steps)")

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None and not self._done and not self._open_ended:
            self.close(self._ended_early("the with block ended"))
        elif kind is not None:
            self.close(f"the with block raised {kind.__name__}: {value}", restartable=True)
        else:
            self.close()
        return False

    def _close_coordinator(self):
        """Rank 0 keeps the embedded coordinator until the job is over (every worker ran its
        last step, or the job failed), so that the others finish, then stops it. A node's
        shard ends with the job (it hears the end from the coordinator)."""
        if self._shard is not None:
            self._shard.close(wait_s=self._timeout if self._done else 5.0)
            self._shard = None
        if self._coordinator is None:
            return
        import time  # noqa: PLC0415
        # Only a job this worker finished can end while rank 0 waits.
        deadline = time.monotonic() + (self._timeout if self._done else 0.0)
        while self._coordinator.poll() == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the others' sessions hear the end
        self._coordinator.close()
        self._coordinator = None

    # ---- what the job says ----
    @property
    def rank(self):
        """This worker's rank in the job: the launcher's, where it names one."""
        return self._joined().rank

    @property
    def world_size(self):
        """The number of workers in the job."""
        return self._joined().world_size

    @property
    def next_step(self):
        """The step the next step() call completes, or -1 once done. With the job config's
        gradient_accumulation_steps K, step() is called after every micro-batch, and this
        counts micro-batches: optimizer step t ends with micro-batch t * K."""
        self._joined()
        return self._next

    # ---- the training loop ----
    def step(self, closure=None, loss=None, **kwargs):
        """Hands this worker's gradient to the job's step and returns once the step's new
        parameters are in place.

        Every parameter needs a gradient since the last step. With the job config's
        gradient_accumulation_steps K, call it after each micro-batch: every K-th call ends
        an optimizer step. After the job's last step, or after close(), it raises
        OnebitError; so does a worker that stopped (a lost peer, the job's failure).

        Args:
            closure: A function that runs backward() and returns the loss, as torch.optim's
                takes; called with gradients enabled before the step. None: no closure.
            loss: This step's loss, a tensor or a number: the worker logs it, exports it,
                and watches it for a jump after the freeze. None: no loss this step.
            **kwargs: Only grad_scaler, which the GradScaler of torch < 2.1 passes: a
                ScriptValueError (torch >= 2.1's GradScaler works). Any other is a
                TypeError.

        Returns:
            The loss: the closure's result, else `loss`.
        """
        # torch.amp.GradScaler (torch >= 2.1) sets grad_scale and found_inf here before it
        # calls step(); older ones hand themselves over as grad_scaler=.
        if kwargs.get("grad_scaler") is not None:
            raise ScriptValueError(
                f"a GradScaler of torch {torch.__version__} hands itself to step(): onebit "
                "works with torch.amp.GradScaler of torch >= 2.1 (scaler.scale, unscale_, "
                "step, update), or with the job config's \"fp16\": {\"enabled\": true} and "
                "opt.scale(loss).backward()")
        unknown = sorted(set(kwargs) - {"grad_scaler"})
        if unknown:
            raise TypeError(f"step() got unexpected keyword argument(s) {', '.join(unknown)}")
        grad_scale = self._script_grad_scale()
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._joined()
        if self._done and (self._closed or self._open_ended):
            raise OnebitError(
                "step() after the optimizer was closed (close(), its with block, or the end of "
                "a job without steps): its job is over; build a new optimizer for the next", 1)
        if self._done:
            raise OnebitError(
                f"step() after the job's last step ({self._steps}, onebit.steps): the training "
                "loop is longer than the job; stop at opt.done, or give the job more steps", 1)
        moved = next((i for i, (p, address) in enumerate(zip(self._params,
                                                             self._param_addresses))
                      if p.data_ptr() != address), None)
        if moved is not None:
            raise ScriptRuntimeError(
                f"{self._what(moved)} got memory of its own (p.data = ..., model.to(), .half()) "
                "after the optimizer took it over: onebit steps the parameters in its own "
                "buffer, which the tensors must keep viewing, so it would train no more. Copy "
                "new values in place (with torch.no_grad(): p.copy_(new)), or move the model "
                "before building the optimizer")
        without = self._without_gradient()
        if len(without) == len(self._params):  # no backward, no .grad written
            raise ScriptRuntimeError("step() without a new gradient since the last step (no backward, "
                               "no .grad written): nothing was exchanged; call loss.backward() "
                               "first")
        with _phase("gradients into the buffer"):
            self._gather_gradients(without)
        if self._device.type == "cuda":
            torch.cuda.current_stream(self._device).synchronize()
        self._check_fixed()
        lr = self._scheduled_lr()
        betas = self._scheduled_betas()
        decays = self._scheduled_weight_decays()
        value = None if loss is None else float(  # None: the worker says no loss
            loss.detach() if isinstance(loss, torch.Tensor) else loss)
        clip, self._clip = self._clip, None
        with _phase("hand-over to the worker"):
            nan = float("nan")
            self._to_worker(self._joined().supply, self._next, value,
                            nan if lr is None else lr, nan if clip is None else clip,
                            *((nan, nan) if betas is None else betas),
                            weight_decays=decays or [],
                            grad_scale=nan if grad_scale is None else grad_scale)
            if self._plan is not None:
                self._plan.reset()
        stepped = self._next
        with _phase("the worker's step"):
            self._next = self._wait()
        if grad_scale is not None and not self._done:
            self._tell_the_grad_scaler(self._worker.skipped(stepped))
        if self._masters and not self._done:
            self._sync_low_precision()
        if self._micro_batches > 1 and not self._done:
            # The worker took this micro-batch's gradient: .grad starts again from zero, as
            # DeepSpeed's engine clears it, so that a loop without zero_grad (or with one
            # an optimizer step) hands over each micro-batch's own gradient, not the sum so far.
            with torch.no_grad():
                self._flat_grad.zero_()
                for i in self._masters:
                    if self._params[i].grad is not None:
                        self._params[i].grad.zero_()
        self._arrived = [False] * len(self._params)
        self._grad_versions = self._versions()
        return loss

    def _script_grad_scale(self):
        """The factor torch.amp.GradScaler multiplied this step's gradient by (1 after its
        unscale_), or None without a GradScaler. The workers then skip alike a step whose
        gradient overflowed on any of them (found_inf is this worker's alone)."""
        if not hasattr(self, "found_inf"):
            return None
        if self._scales_loss:
            raise ScriptValueError(
                "torch.amp.GradScaler and the job config's fp16 block both scale the loss: "
                "use one of the two")
        if self._overlap is not None:
            raise ScriptValueError(
                "torch.amp.GradScaler with the warmup exchange overlapping backward(): the "
                "workers agree on overflows before the exchange, so build the optimizer with "
                "overlap=False")
        scale = getattr(self, "grad_scale", None)
        return 1.0 if scale is None else float(scale)

    def _tell_the_grad_scaler(self, skipped):
        """The workers' verdict on the step into the calling GradScaler's record of it, so
        that its update() moves the scale alike on every worker (as ShardedGradScaler's
        all-reduce of found_inf does). The scaler is the one whose step() called this one."""
        frame = sys._getframe(1)
        for _ in range(8):
            frame = frame.f_back
            if frame is None:
                return
            scaler = frame.f_locals.get("self")
            states = getattr(scaler, "_per_optimizer_states", None)
            if isinstance(states, dict) and id(self) in states:
                for found in states[id(self)].get("found_inf_per_device", {}).values():
                    found.fill_(1.0 if skipped else 0.0)
                return

    def _gather_gradients(self, without):
        """Checks that every parameter has a dense gradient (none is in `without`,
        _without_gradient's list) and puts each into the flat buffer the worker reads
        (backward's own tensors are copied there)."""
        fresh = []  # parameters whose .grad is a tensor of its own, not the buffer's view
        without = set(without)
        for i, p in enumerate(self._params):
            grad = p.grad
            if i in without:
                raise ScriptValueError(
                    f"{self._what(i)} has no gradient on this step: every parameter the "
                    "optimizer holds must take part in the loss on every worker (the momentum "
                    "is one flat exchange). Freeze it (requires_grad_(False) before building "
                    "the optimizer: it is left out), or keep it out of the optimizer's params")
            if grad.is_sparse:
                raise ScriptValueError(f"{self._what(i)} has a sparse gradient; onebit needs dense ones")
            if grad.data_ptr() != self._grad_views[i].data_ptr():
                fresh.append(i)
        if self._plan is not None and self._plan.sealed is not None and \
                self._flat_grad._version != self._plan.sealed:
            # At its first call, whether or not it clipped (it scales in place either way),
            # not at the first step whose norm it clips.
            raise ScriptRuntimeError(
                "the gradients were changed in place after backward() handed them to the "
                "exchange (overlap on), as torch.nn.utils.clip_grad_norm_ does: clip with "
                "opt.clip_grad_norm_(max_norm), which clips the workers' average gradient as "
                "DDP's clipping does, or build the optimizer with overlap=False")
        # zero_grad(set_to_none=True) (torch 2's default) or a .grad replaced: backward
        # wrote tensors of its own, which go into the exchange's buffer.
        self._grads_into_views(fresh)
        if self._plan is not None and self._plan.next > 0:
            changed = self._joined().changed_since_announced()
            if changed >= 0:
                i = bisect.bisect_right(self._offsets, changed) - 1
                raise ScriptRuntimeError(
                    f"the gradient of {self._what(i)} changed after backward() handed it to "
                    "the exchange (overlap): change gradients before they are final, clip "
                    "with opt.clip_grad_norm_(max_norm), or build the optimizer with "
                    "overlap=False")

    @property
    def loss_scale(self):
        """What the loss is multiplied by before backward() under the job config's fp16
        block, or 1.0 without it. It may change at every step(). Its scaling is dynamic:
        every worker skips a step whose gradient overflowed on any of them, and the scale
        halves. It doubles after fp16.loss_scale_window good steps."""
        self._joined()
        return self._loss_scale

    def scale(self, loss):
        """`loss` times loss_scale, as torch's GradScaler.scale. Call backward() on what it
        returns, and hand step() the loss itself (`opt.step(loss=loss)`). onebit divides the
        scale out of the gradient before clipping and the exchange.

        Args:
            loss: The loss tensor to scale.

        Returns:
            `loss * loss_scale`.
        """
        return loss * self.loss_scale

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Clips the next step's gradient by its global L2 norm, as
        torch.nn.utils.clip_grad_norm_ does, but where onebit has the gradient. In the
        warmup that is the exact average of every worker's gradient, which DDP clips. In
        the compression stage it is this worker's own: no gradient is averaged there, only
        the momentum. For that step it replaces the config's gradient_clipping.

        Args:
            max_norm: The largest L2 norm the gradient keeps: >= 0 and finite.
            norm_type: 2.0, the only norm onebit clips by; another is a ValueError.

        Returns:
            The total L2 norm of this worker's gradient now, as torch's returns it, with the
            loss scale divided out under fp16 loss scaling.
        """
        if float(norm_type) != 2.0:
            raise ValueError(f"onebit clips by the L2 norm (norm_type=2), not {norm_type}")
        max_norm = float(max_norm)
        if not max_norm >= 0 or max_norm == float("inf"):
            raise ValueError(f"max_norm must be >= 0 and finite, got {max_norm}")
        grads = [p.grad for p in self._params if p.grad is not None]
        self._clip = max_norm
        if not grads:
            return torch.tensor(0.0)
        norm = torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g.detach(), 2.0) for g in grads]), 2.0)
        return norm / self._loss_scale if self._loss_scale != 1.0 else norm

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulated inside stay on this worker until a backward() outside
        (or step()) sends them, as DDP's no_sync: for micro-batches, all but the last
        backward() of a step go inside."""
        self._no_sync += 1
        try:
            yield
        finally:
            self._no_sync -= 1

    def _accumulated(self, i):
        """Backward accumulated parameter i's gradient: with overlap on, the buckets whose
        gradients are all final go to the exchange now, in order."""
        plan = self._plan
        if plan is None or self._no_sync or self._done or self._stopped or self._worker is None:
            return
        if plan.ready[i]:
            raise ScriptRuntimeError(
                f"{self._what(i)} got a second gradient before step(), after the first went "
                "to the exchange (overlap): accumulate micro-batches inside `with "
                "opt.no_sync():` (all but the last backward), as with DDP, or build the "
                "optimizer with overlap=False")
        # At once, one tensor: backward's own .grad is freed here, and its memory serves the
        # next gradients of the same backward (holding them for one torch.cat per bucket
        # made backward allocate fresh memory: its time rose from 89-100 to 213-220 ms for
        # the 10.8M GPT on the CPU; BENCHMARKS.md).
        self._grad_into_view(i)
        for bucket in plan.mark(i):
            self._to_worker(self._worker.announce, self._next, bucket)
        if plan.next == len(plan.buckets):
            plan.sealed = self._flat_grad._version

    def _grads_into_views(self, indices):
        """_grad_into_view for each of `indices`; where that is every parameter (backward
        made every .grad, as after zero_grad(set_to_none=True)), one torch.cat into the flat
        buffer: one batched copy in place of one per tensor (on the CPU about half the time,
        BENCHMARKS.md; on a GPU one batched kernel in place of a copy per parameter, not
        yet measured)."""
        if len(indices) < len(self._params) or self._masters:
            for i in indices:
                self._grad_into_view(i)
            return
        with torch.no_grad():
            torch.cat([p.grad.reshape(-1) for p in self._params], out=self._flat_grad)
        for p, view in zip(self._params, self._grad_views):
            p.grad = view

    def _grad_into_view(self, i):
        """Parameter i's .grad in the exchange's buffer: after zero_grad(set_to_none=True)
        (or a .grad replaced) backward wrote a tensor of its own, copied in here (a
        bfloat16 or float16 parameter's, cast to float32, at every step)."""
        p, view = self._params[i], self._grad_views[i]
        if p.grad.data_ptr() != view.data_ptr():
            with torch.no_grad():
                view.copy_(p.grad.reshape(view.shape))
            if i not in self._masters:
                p.grad = view

    def _config_error(self, e, path=None):
        """The C++ config check's ValueError as this optimizer's (it names the key; the
        config file, when there is one, is ours, not the user's)."""
        message = str(e).replace("INVALID_ARGUMENT: ", "")
        if path:
            message = message.replace(path + ": ", "")
        return ValueError(f"{type(self).__name__}: {message}")

    def _ask_config(self, job):
        """What the defaults and checks here go by, in the C++ config's words (one rule in
        one place), asked of the config without the overlap _overlap_setting decides."""
        undecided = copy.deepcopy(job)
        undecided.get("onebit", {}).get("exchange", {}).pop("overlap", None)
        try:
            facts = _core().config_facts(json.dumps(undecided))
        except ValueError as e:
            raise self._config_error(e) from None
        self._between_workers = facts["warmup_between_workers"]
        self._scales_loss = facts["scales_loss"]
        self._micro_batches = facts["micro_batches"]
        self._config_momentum = facts["cycles_betas"]

    def _overlap_setting(self, job, overlap, cap_mb):
        """(first bucket, bucket) caps in floats where the warmup exchange overlaps
        backward(), else None. The config's onebit.exchange.overlap and the keyword must
        agree where both are given; by default on for CPU tensors where the warmup goes
        between the workers (peer mode, or ps with warmup_over "workers", which
        servers "per_node" sets)."""
        exchange = job.setdefault("onebit", {}).setdefault("exchange", {})
        configured = exchange.get("overlap")
        if overlap is not None and configured is not None and bool(overlap) != configured:
            raise ValueError(f"overlap={overlap} while the job config's onebit.exchange.overlap "
                             f"is {configured}: give one of the two")
        if not cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {cap_mb}")
        on = overlap if overlap is not None else configured
        mode = exchange.get("mode", "peer")
        if on is None:
            on = (self._between_workers and self._device.type == "cpu" and not self._scales_loss
                  and self._micro_batches == 1)
        if on and self._micro_batches > 1:
            raise ValueError(f"overlap with gradient_accumulation_steps {self._micro_batches}: "
                             "the micro-batches' gradients are averaged before the warmup "
                             "exchange, so it cannot start during backward(); build the "
                             "optimizer with overlap=False, or accumulate the torch way "
                             "(backward() inside `with opt.no_sync():` but the last, one "
                             "step()), where overlap stays on")
        if on and self._scales_loss:
            raise ValueError("overlap with fp16 loss scaling: the workers agree on overflows "
                             "before the warmup exchange, so it cannot start during "
                             "backward(); build the optimizer with overlap=False")
        if on and self._device.type != "cpu":
            raise ValueError("overlap (the warmup exchange during backward) works on CPU "
                             "tensors only so far; on CUDA build the optimizer with "
                             "overlap=False")
        if on and not self._between_workers:
            raise ValueError(f"overlap needs a warmup between the workers: onebit.exchange.mode "
                             f"\"peer\", or \"ps\" with warmup_over \"workers\", not "
                             f"\"{mode}\"{' with its warmup through the shards' if mode == 'ps' else ''}"
                             ": build the optimizer with overlap=False")
        exchange["overlap"] = bool(on)
        if not on:
            return None
        cap = max(1, int(cap_mb * (1 << 20)) // 4)
        return min(_FIRST_BUCKET_BYTES // 4, cap), cap

    def _scheduled_lr(self):
        """The job's lr for this step when the param groups' lrs moved (a torch
        lr_scheduler), else None (the config's lr and scheduler). Groups keep their ratio
        to the job's lr (fixed at construction), so they must all move by one factor."""
        lrs = [float(g["lr"]) for g in self.param_groups]
        if lrs == self._initial_lrs:
            return None
        if self._config_scheduler:
            raise ValueError("param_groups' lr changed (a torch lr_scheduler?) while the job "
                             "config has a scheduler: use one of the two")
        if any(lr < 0 or lr != lr for lr in lrs):
            raise ValueError(f"param_groups' lr must be >= 0, got {lrs}")
        base = self._initial_lrs[0]
        if base == 0:
            raise ValueError("param group 0 started with lr 0: a schedule cannot scale it")
        factor = lrs[0] / base
        for i, (lr, initial) in enumerate(zip(lrs, self._initial_lrs)):
            if abs(lr - initial * factor) > 1e-9 * max(abs(lr), abs(initial * factor), 1e-30):
                raise ValueError(
                    f"param group {i}'s lr went from {initial} to {lr}, group 0's by a factor "
                    f"{factor}: every group must keep its ratio to the others (one schedule "
                    "for all)")
        return self._job_lr * factor

    def _check_fixed(self):
        """eps is fixed when the optimizer is built: a change in param_groups is a
        ValueError, not ignored."""
        for i, (group, built) in enumerate(zip(self.param_groups, self._fixed_eps)):
            if float(group["eps"]) != built:
                raise ValueError(
                    f"param group {i}'s eps went from {built} to {group['eps']}: onebit fixes "
                    "eps when the optimizer is built (lr, betas and weight_decay may be "
                    "scheduled); build it with the value you want")

    def _scheduled_weight_decays(self):
        """Each group's weight_decay for this step when a schedule (or load_state_dict)
        moved one from its value at construction, else None (the built ones). Each group
        has its own in the worker (_hyper_groups), so each may move on its own."""
        decays = [float(g["weight_decay"]) for g in self.param_groups]
        if decays == self._initial_decays:
            return None
        for i, decay in enumerate(decays):
            if not decay >= 0 or decay == float("inf"):
                raise ValueError(f"param group {i}'s weight_decay is {decay}: it must be >= 0 "
                                 "and finite")
        return decays

    def _scheduled_betas(self):
        """The betas for this step when a schedule moved them in param_groups (OneCycleLR's
        momentum cycling), else None (the config's betas and scheduler). Every group must
        have the same (the momentum is one flat exchange)."""
        betas = [tuple(float(b) for b in g["betas"]) for g in self.param_groups]
        if all(b == self._initial_betas for b in betas):
            return None
        if any(b != betas[0] for b in betas):
            raise ValueError(f"param_groups' betas differ ({betas}): every group steps with "
                             "the same betas (the momentum is one flat exchange)")
        if self._config_momentum:
            raise ValueError("param_groups' betas changed (a torch scheduler's momentum "
                             "cycling?) while the job config's scheduler cycles them: use one "
                             "of the two")
        if not all(0 <= b < 1 for b in betas[0]):
            raise ValueError(f"param_groups' betas must be in [0, 1), got {betas[0]}")
        return betas[0]

    def add_param_group(self, param_group):
        """torch.optim's, while the optimizer is being built; afterwards a ValueError. The
        parameters are one flat buffer, sized and counted by the job when the optimizer was
        built, so a group added later (layers unfrozen in fine-tuning) would never train.

        Args:
            param_group: A dict with "params" and the group's own hyper-parameters, as
                torch.optim takes it.
        """
        if hasattr(self, "_params"):
            raise ValueError(
                "add_param_group after the optimizer was built: onebit's parameters are one "
                "flat buffer the job sized then, so these would never train; build the "
                "optimizer with every parameter it is to train (parameters added later need "
                "a new optimizer, and with it a new job)")
        super().add_param_group(param_group)

    def zero_grad(self, set_to_none=True):
        """Clears every parameter's gradient, as torch.optim's does. A gradient zeroed in
        place counts as none: step() needs a new one from backward().

        Args:
            set_to_none: True: each .grad becomes None, and step() copies the tensors
                backward() makes into the exchange's buffer. False: zeroed in place.
        """
        super().zero_grad(set_to_none=set_to_none)
        # Zeroing in place is no new gradient, and what arrived before is gone.
        self._arrived = [False] * len(self._params)
        if not set_to_none and self._grad_versions is not None:
            self._grad_versions = self._versions()

    def _versions(self):
        return [None if p.grad is None else (p.grad.data_ptr(), p.grad._version)
                for p in self._params]

    def _without_gradient(self):
        """The parameters that got no gradient since the last step: no backward reached
        them and their .grad was neither written nor replaced (a zero_grad(set_to_none=False)
        leaves the old view, zeroed: that is no gradient)."""
        if self._grad_versions is None:  # before binding: backward made the .grad tensors
            return [i for i, p in enumerate(self._params) if p.grad is None]
        now = self._versions()
        return [i for i, (p, arrived, was, is_) in
                enumerate(zip(self._params, self._arrived, self._grad_versions, now))
                if p.grad is None or not (arrived or is_ != was)]

    def _what(self, i):
        """How errors name parameter i: by its name where the optimizer was given
        model.named_parameters(), with its shape."""
        p = self._params[i]
        name = self._names.get(id(p))
        return (f"parameter {name!r} ({tuple(p.shape)})" if name is not None
                else f"parameter {i} ({tuple(p.shape)})")

    def state_dict(self):
        """The optimizer's state between two steps, or after the last one once the job is
        over, in torch.optim's layout. It holds copies. torch.save,
        torch.load(weights_only=True) and torch.distributed.checkpoint take it:

        - "state": {index: {"step", "exp_avg", "exp_avg_sq", and an optimizer's own
          tensors}}, each on its parameter's device and of its shape. It is empty before
          the first step, as torch's.
        - "param_groups": [{the hyper-parameters, "params": [indices]}]. The first group
          also holds onebit's own part under "onebit": the job's step and freeze step, the
          rank and world size that saved it, and this worker's error buffers. It holds the
          optimizer's and the trainer's scalars too, such as fp16's loss scaler. It sits in
          a group because torch.distributed.checkpoint keeps only "state" and
          "param_groups".

        Before the first step this does not join the job. The state is then step 0's, zeros,
        or the state a load_state_dict() gave. So torch.distributed.checkpoint's
        get_optimizer_state_dict gives dcp.load a template to load into.
        """
        if self._worker is None and not self._done:
            raw, rank_, world = self._unjoined_state()
        else:
            worker = self._joined()
            raw, rank_, world = worker.state_dict(), worker.rank, worker.world_size
        step = int(raw["step"])
        state = {}
        if step >= 0:
            for i, p in enumerate(self._params):
                begin, end = self._offsets[i], self._offsets[i + 1]
                entry = {"step": torch.tensor(float(step))}
                for name, t in raw["tensors"].items():
                    if name != "params":
                        entry[name] = t[begin:end].clone().view(p.shape).to(self._device)
                state[i] = entry
        groups, first = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(first, first + len(g["params"])))
            first += len(g["params"])
            groups.append(d)
        groups[0]["onebit"] = {
            "step": step, "freeze_step": int(raw["freeze_step"]), "rank": rank_,
            "world_size": world, "errors": raw["errors"], "scalars": raw["scalars"],
            "trainer": raw["trainer"]}
        return {"state": state, "param_groups": groups}

    def _unjoined_state(self):
        """state_dict()'s raw state before the worker joined: the loaded one, else step 0's
        zeros of the states every job of this type has."""
        if self._loaded is not None:
            return self._loaded, self._loaded.get("rank", -1), self._loaded.get("world_size", -1)
        n = self._offsets[-1]
        tensors = {name: torch.zeros(n) for name in ("exp_avg", "exp_avg_sq") + self._states}
        return ({"step": 0, "freeze_step": -1, "tensors": tensors, "errors": {}, "scalars": {},
                 "trainer": {}}, rank(), world_size())

    def _flat_state(self, state_dict):
        """A state_dict() as the core takes it: one flat tensor per state over all
        parameters, in their order. The parameters themselves are the model's (as with
        torch.optim): their tensor is added where the worker joins."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"a state_dict is a dict, not {type(state_dict).__name__}")
        if "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("not an optimizer's state_dict() (no 'state' and 'param_groups')")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state has {len(groups)} param groups, the optimizer "
                             f"{len(self.param_groups)}")
        extras = groups[0].get("onebit") if groups else None
        if not isinstance(extras, dict):
            raise ValueError("the state_dict has no onebit part (param_groups[0]['onebit']), so "
                             "it is not a onebit optimizer's; another optimizer's state "
                             "(torch.optim.Adam's) cannot be loaded: start the job from the "
                             "model's parameters alone")
        entries = [None] * len(self._params)
        saved_state = state_dict["state"]
        for g, (live, saved) in enumerate(zip(self.param_groups, groups)):
            keys = saved.get("params", [])
            if len(keys) != len(live["params"]):
                raise ValueError(f"the state's param group {g} has {len(keys)} parameters, "
                                 f"the optimizer's {len(live['params'])}")
            for key, p in zip(keys, live["params"]):
                entries[self._index_of[id(p)]] = saved_state.get(key)
        flat = {}
        step = int(extras.get("step", 0))
        if step >= 1:  # (step 0's zeros load nothing)
            names = None
            for i, entry in enumerate(entries):
                if not isinstance(entry, dict):
                    raise ValueError(f"the state has none for {self._what(i)}")
                own = sorted(k for k in entry if k != "step")
                if names is None:
                    names = own
                elif own != names:
                    raise ValueError(f"the state of {self._what(i)} has {', '.join(own)}; "
                                     f"the others' {', '.join(names)}")
                for name in own:
                    t = torch.as_tensor(entry[name])
                    if t.numel() != self._params[i].numel():
                        raise ValueError(f"the state's {name} of {self._what(i)} has "
                                         f"{t.numel()} elements, the parameter "
                                         f"{self._params[i].numel()}")
            for name in names:
                flat[name] = torch.cat([torch.as_tensor(e[name]).detach().reshape(-1).to(
                    device="cpu", dtype=torch.float32) for e in entries])
        raw = {k: extras.get(k) for k in ("step", "freeze_step", "errors", "scalars", "trainer",
                                          "rank", "world_size") if k in extras}
        raw["tensors"] = flat
        if not raw.get("errors"):  # none saved (dcp.load into a template has none): reset
            raw["errors"], raw["rank"] = {}, -1
        return raw, groups

    def load_state_dict(self, state_dict):
        """Puts back a state_dict(), as torch.optim's does. The parameters are the model's:
        load them with model.load_state_dict.

        Before the first step (a fresh job: the torch.save/torch.load way to resume), the
        job starts after the state's step. Moments and the optimizer's scalars come from
        it. This worker's error buffers do too when the same rank of as many workers saved
        it; else they start at zero, as from a checkpoint of another topology. Every worker
        must load a state of the same step: the coordinator fails the job, naming both,
        when they differ. A job with parameter-server shards resumes from its
        checkpoint.dir instead. A committed checkpoint of the job (a recovery) wins over a
        loaded state. A state of step 0 (saved before any step) loads no moments.

        Later, it takes a state of the step the job is at (the coordinator decides the
        steps). Another step, or a state that does not fit, is a ValueError and changes
        nothing.

        Args:
            state_dict: What state_dict() returned, maybe through torch.save and
                torch.load, or torch.distributed.checkpoint.
        """
        state, groups = self._flat_state(state_dict)
        for key in ("step", "freeze_step", "tensors", "scalars", "errors", "trainer"):
            if key not in state:
                raise ValueError(f"the state has no {key!r}")
        if self._worker is not None:
            if "params" not in state["tensors"]:
                state["tensors"]["params"] = self._current_params()
            self._worker.load_state_dict(state)
            return
        if int(state["step"]) < 1:
            if state["tensors"]:
                raise ValueError(f"the state is of step {state['step']}: nothing to start after")
        else:
            n = self._offsets[-1]
            for name, t in state["tensors"].items():
                size = torch.as_tensor(t).numel()
                if size != n:
                    raise ValueError(f"the state's {name} has {size} elements, this model {n}")
        if groups is not None:
            if len(groups) != len(self.param_groups):
                raise ValueError(f"the state has {len(groups)} param groups, the optimizer "
                                 f"{len(self.param_groups)}")
            # As torch.optim's: every hyper-parameter of the groups (an lr, betas or decay a
            # schedule moved, a scheduler's own keys) comes back; eps too, which step()
            # then checks against the job's.
            for group, saved in zip(self.param_groups, groups):
                group.update((key, value) for key, value in saved.items()
                             if key not in ("params", "onebit"))
        if int(state["step"]) >= 1:
            self._loaded = state

    def _current_params(self):
        """The model's parameters, flat, as a float32 CPU copy."""
        return torch.cat([p.detach().reshape(-1).to(device="cpu", dtype=torch.float32)
                          for p in self._params])

    def close(self, why=None, restartable=False):
        """Stops the worker: the job hears of it (the trainer fails with `why`) unless it
        is over already. In a job without steps it ends the loop instead: the job ends after
        the last step every worker ran. Rank 0 of a job whose coordinator it runs keeps it
        until the job is over. If rank 0 stops first, the job fails, or recovers where
        the reason is `restartable` or the worker stopped by itself. A `with` block calls
        it at its end, and so does the end of the script.

        Args:
            why: The reason the job hears. None: that the script closed the optimizer, and
                after which step.
            restartable: True where a launcher's restart may fix the reason (an
                exception): the job recovers instead of failing.
        """
        why = why or self._ended_early("the script closed the optimizer")
        if self._worker is None:
            # Never joined: nothing of this worker's ran. The job hears of it through rank
            # 0's coordinator (when this process runs it) or its registration timeout.
            self._done = True
            self._leave_job(f"stopped before its first step: {why}", restartable)
            self._close_coordinator()
            return
        if not self._done and self._open_ended and not self._stopped and not restartable:
            # The loop is over. Not after an exception: that is a failure, which the job
            # recovers from (or fails on), never where the job ends.
            self._end_open_ended_job()
        if not self._done:
            stopped = self._stopped
            why = stopped or why
            if not restartable and not stopped:
                # The loop ended before the job's last step: it would end early again after
                # any restart, so the job fails at once (reported while still a member).
                self._worker.fail_job(why, self._last_step())
                self._failed_job = why
            elif not stopped and self._coordinator is None:
                # The script raised: the job recovers at once, naming this worker and the
                # error, where its peers would otherwise wait out a heartbeat timeout (rank
                # 0 with the job's coordinator recovers it itself: _leave_job).
                self._worker.report_restartable_exit(why, self._last_step() + 1)
            self._worker.close(why)
            # A worker that stopped by itself (a lost peer, the job's verdict) leaves the
            # job to the coordinator's verdict.
            self._leave_job(f"stopped: {why}", restartable or bool(stopped))
        self._close_coordinator()
        self._closed = True

    def _in_job(self):
        """This optimizer holds a part of a job: it was built (its job exists from then on,
        on every rank: rank 0's coordinator runs it) and has not ended."""
        return self._coordinator is not None or not (self._done or self._closed or
                                                     self._stopped)

    def _refuse_a_second_member(self):
        """Each optimizer is this rank's member of a job: a second one in the job at once
        would be a second member of the same rank (and rank 0's a second coordinator on
        MASTER_PORT + 1)."""
        if any(other is not self and other._in_job() for other in list(_BUILT)):
            raise ScriptValueError(
                "another onebit optimizer of this process is still in its job: one at a "
                "time, since each is this rank's member of a job. Put every parameter into "
                "one optimizer (param groups for their own lr and weight_decay); optimizers "
                "that step by turns in one loop (a GAN's generator and discriminator) are "
                "not supported")

    def _leave_job(self, what, restartable):
        """Rank 0 of a job whose coordinator it runs stops before the job's end: the job
        cannot go on without this process. Where a restart may fix the reason (the script
        raised, the worker stopped by itself), the job recovers, so that a launcher's restart
        resumes it from the state file (a job that is not running is left as it is); a
        loop that ended early would end early again: the job fails."""
        if self._coordinator is None:
            return
        reason = f"rank 0, which runs the job's coordinator, {what}"
        if restartable:
            self._coordinator.recover(reason)
        else:
            self._coordinator.abandon(reason)

    # ---- internals ----
    def _hyper_groups(self, job):
        """Each param group's (begin, end, lr / the job's lr, weight_decay) in the flat
        buffer, or [] for a single group with the job's lr and decay. A group's lr is a fixed
        multiple of the job's, so the config's scheduler moves every group alike; betas and
        eps are the job's for all (the momentum is one flat exchange). Several groups are
        always the worker's groups, alike or not, so that a weight-decay schedule may move
        each on its own (groups with the job's values change no bit)."""
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
        return [] if same and len(groups) == 1 else groups

    def _masked_ranges(self):
        """The [begin, end) runs of the flat buffer that the param groups' exp_avg_mask
        (DeepSpeed's key: 0 where the momentum is masked, 1 elsewhere; each of the group's
        parameters takes it as exp_avg *= mask does, broadcast) masks, in order, adjacent
        runs joined: the job config's onebit.momentum_mask.ranges, so every worker's mask is
        checked against the others' at registration. ValueError for a mask that does not
        fit a parameter, holds another value, or has too many runs for a config."""
        runs, i = [], 0
        for g, group in enumerate(self.param_groups):
            mask = group.get("exp_avg_mask")
            count = len(group["params"])
            if mask is not None:
                mask = torch.as_tensor(mask).detach().cpu().double()
                for j in range(i, i + count):
                    p = self._params[j]
                    try:
                        values = torch.broadcast_to(mask, p.shape).reshape(-1)
                    except RuntimeError:
                        raise ValueError(
                            f"param group {g}'s exp_avg_mask has shape {tuple(mask.shape)}, "
                            f"which does not fit {self._what(j)} (exp_avg *= mask, "
                            "broadcast)") from None
                    bad = torch.nonzero((values != 0) & (values != 1)).reshape(-1)
                    if bad.numel():
                        first = int(bad[0])
                        raise ValueError(
                            f"param group {g}'s exp_avg_mask holds {float(values[first])} for "
                            f"element {first} of {self._what(j)}: a momentum mask is 0 (masked) "
                            "or 1")
                    edge = torch.zeros(1, dtype=torch.bool)
                    zero = torch.cat([edge, values == 0, edge])
                    edges = torch.nonzero(zero[1:] != zero[:-1]).reshape(-1) + self._offsets[j]
                    for begin, end in zip(edges[0::2].tolist(), edges[1::2].tolist()):
                        if runs and runs[-1][1] == begin:
                            runs[-1][1] = end
                        else:
                            runs.append([begin, end])
            i += count
        limit = _core().max_mask_ranges()
        if len(runs) > limit:
            raise ValueError(
                f"the param groups' exp_avg_mask masks {len(runs)} separate runs of elements, "
                f"more than the {limit} a job config takes: mask whole rows (contiguous "
                "elements), or write the model's mask as a .npy for onebit.momentum_mask.npy")
        return runs

    def _check_params(self):
        if not self._params:
            raise ValueError("no parameters to optimize")
        device = self._params[0].device
        for i, p in enumerate(self._params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameter {i} is a {type(p).__name__}, not a tensor")
            if p.dtype not in _PARAM_DTYPES:
                raise ValueError(f"{self._what(i)} is {p.dtype}; onebit trains float32, "
                                 "bfloat16 and float16 parameters (the last two with a float32 "
                                 "master copy of its own)")
            if p.is_sparse:
                raise ValueError(f"{self._what(i)} is sparse")
            if not p.is_contiguous():
                raise ValueError(f"{self._what(i)} is not contiguous")
            if p.device != device:
                raise ValueError(f"{self._what(i)} is on {p.device}, parameter 0 on {device}")

    def _stopped_error(self, e):
        """The OnebitError for the worker's failure `e` (its wait, or a hand-over to it),
        with the exit code the job's verdict asks for."""
        self._unbind()
        # The coordinator's word says why (a peer's failure, the job's end); the worker's
        # own error (a broken connection) is often only the symptom.
        code, reason = self._worker.verdict_after_failure()
        self._stopped = (f"onebit worker stopped: {reason} (this worker's error: {e})"
                         if reason else f"onebit worker stopped: {e}")
        self._stopped_code = code
        return OnebitError(self._stopped, code)

    def _to_worker(self, call, *args, **kwargs):
        """call(*args, **kwargs) on the worker; its failure is the job's OnebitError."""
        try:
            return call(*args, **kwargs)
        except OnebitError:
            raise
        except Exception as e:
            if self._stopped is None and self._worker is not None:
                raise self._stopped_error(e) from e
            raise

    def _wait(self):
        try:
            step = self._worker.wait_for_step(self._timeout)
        except Exception as e:
            raise self._stopped_error(e) from e
        if step < 0:
            self._done = True
            self._unbind(final=True)
            self._close_coordinator()
        elif self._scales_loss:
            self._loss_scale = float(self._worker.loss_scale())
        return step

    def _bind(self):
        n = self._offsets[-1]
        if self._worker.cuda:
            flat = _cuda_view(self._worker.params_address(), n, self._device)
            grad = _cuda_view(self._worker.gradient_address(), n, self._device)
        else:
            flat = self._worker.params()
            grad = self._worker.gradient()
        self._grad_views = []
        self._masters = {}  # index: the float32 master of a bfloat16 or float16 parameter
        with torch.no_grad():
            for i, (p, begin, end) in enumerate(zip(self._params, self._offsets,
                                                    self._offsets[1:])):
                view = grad[begin:end].view(p.shape)
                if p.grad is not None:
                    view.copy_(p.grad)
                    self._arrived[i] = True  # a gradient made before the worker joined
                if p.dtype == torch.float32:
                    p.data = flat[begin:end].view(p.shape)
                    p.grad = view
                else:  # its own memory and gradient; the master and its gradient here
                    self._masters[i] = flat[begin:end].view(p.shape)
                self._grad_views.append(view)
        self._flat_grad = grad  # what the views cover, in the parameters' order
        self._param_addresses = [p.data_ptr() for p in self._params]
        self._grad_versions = self._versions()

    def _sync_low_precision(self):
        """Each bfloat16 or float16 parameter takes its float32 master's new value."""
        with torch.no_grad():
            for i, master in self._masters.items():
                self._params[i].copy_(master)

    def _unbind(self, final=False):
        # The C++ buffers go with the worker: the tensors get memory of their own (a
        # bfloat16 or float16 parameter has its own, and keeps its last value).
        self._flat_grad = None
        masters, self._masters = getattr(self, "_masters", {}), {}
        with torch.no_grad():
            if final:
                last = self._worker.final_params().to(self._device)
            for i, (p, begin, end) in enumerate(zip(self._params, self._offsets,
                                                    self._offsets[1:])):
                if i in masters:
                    if final:
                        p.copy_(last[begin:end].view(p.shape))
                    continue
                p.data = last[begin:end].view(p.shape).clone() if final else \
                    torch.full(p.shape, float("nan"), device=self._device)
                p.grad = None


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
