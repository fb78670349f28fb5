"""The job an optimizer makes: its hyper-parameter keywords (_KEYWORDS, the defaults the
API reference prints), the job config they and the launcher's environment fill in
(_job_config; _CONFIG_FILLED_IN says which keys), the facts the optimizer goes by that the
C++ config decides, the file the worker and the coordinator read it from, the options the
worker is started with, and the digest of the script's code that tells a job from its
rerun. Nothing here starts a process or touches a tensor.
"""

import atexit
import collections
import copy
import hashlib
import json
import os
import sys
import tempfile

from onebit import env as _env
from onebit._core import _core
from onebit.env import local_world_size, rank, world_size


class _Unset:
    """A keyword argument the caller did not give (its repr is the API reference's)."""

    def __repr__(self):
        return "unset"


_UNSET = _Unset()

# The hyper-parameters the optimizers take as keyword arguments: the job config's
# optimizer.params keys. A keyword wins over the config's optimizer block; with neither,
# `default` applies (a str is a rule in words). The optimizers take the defaults of lr,
# betas, eps and weight_decay (_torch_defaults) and bias_correction (_job_config) from
# here; the job config applies the others' (config/job_config_schema.cc). The API reference
# (docs/api.md) prints this table, and its test checks each default against docs/config.md
# (`config_default`, where the job config's own default differs) and each type's keys
# against its Types column.
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

# The steps of a job without `steps` (config/job_config.h's kOpenEndedSteps): it runs until
# its workers' training loops end, and ends after the step where they all did.
OPEN_ENDED_STEPS = 1 << 40
# This process's optimizers that made a job: each rank's n-th is the same job, told apart
# from the others by its key (RegisterRequest.job_key), so that a rank on to the next job
# waits out the last one's coordinator at MASTER_PORT + 1 instead of joining it.
_JOBS_MADE = 0


def _per_rank(path):
    """A path from the environment with {rank} replaced by this process's rank."""
    return path.replace("{rank}", str(rank()))


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


# The job config's keys that the optimizers fill in or read themselves (_job_config, _Job,
# and onebit/_gradients.py's _overlap_setting), where docs/config.md's default is not what
# a script gets: key: the rule. The API reference prints it; its test checks that
# docs/config.md has each key.
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
    "onebit.exchange.shard_state": "The shard_state keyword, where given.",
    "onebit.exchange.servers": "\"per_node\" (ps mode only): one shard per node, run by its "
                               "local rank 0, so world size / local world size shards.",
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
        # The warmup goes between the workers unless the config says otherwise: the C++
        # config's default for the optimizers with one switch (docs/config.md).
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




def _shard_state_setting(job, shard_state):
    """Puts the shard_state keyword (None: not given) into the job config `job` as
    onebit.exchange.shard_state, before the C++ config checks where it applies (mode
    hierarchical, local_size >= 2, not ZeroOneAdam). The config's value and the keyword
    must agree where both are given."""
    if shard_state is None:
        return
    exchange = job.setdefault("onebit", {}).setdefault("exchange", {})
    configured = exchange.get("shard_state")
    if configured is not None and bool(shard_state) != configured:
        raise ValueError(f"shard_state={shard_state} while the job config's "
                         f"onebit.exchange.shard_state is {configured}: give one of the two")
    exchange["shard_state"] = bool(shard_state)


def _explicit_keywords(optimizer, own, keywords, hyper):
    """The hyper-parameter keywords the caller gave (those not _UNSET): `keywords`, every
    optimizer's, and `hyper`, which must be `own`, the type's (else a TypeError naming
    `optimizer`, the class)."""
    unknown = sorted(set(hyper) - set(own))
    if unknown:
        raise TypeError(f"{optimizer} got unexpected keyword argument(s) "
                        f"{', '.join(unknown)}; its own are {', '.join(own) or 'none'}")
    return {k: v for k, v in dict(keywords, **hyper).items() if v is not _UNSET}


def _torch_defaults(job, explicit):
    """torch.optim's `defaults` for the param groups: lr, betas, eps and weight_decay as the
    keywords give them, else as the job config's optimizer block does, else _KEYWORDS'."""
    block = job.get("optimizer", {}).get("params", {})
    block = {**block, **explicit}
    defaults = {key: block.get(key, _KEYWORDS[key].default)
                for key in ("lr", "betas", "eps", "weight_decay")}
    defaults["betas"] = tuple(defaults["betas"])
    return defaults


def _config_error(e, optimizer, path=None):
    """The C++ config check's ValueError as the optimizer's (`optimizer`: its class name; the
    message names the key; the config file, when there is one, is ours, not the user's)."""
    message = str(e).replace("INVALID_ARGUMENT: ", "")
    if path:
        message = message.replace(path + ": ", "")
    return ValueError(f"{optimizer}: {message}")


class _Job:
    """One optimizer's job: the user's config (`config`, maybe {}) made whole by
    _job_config, and what the optimizer goes by that the config decides. write() puts it in
    the file that the worker and rank 0's coordinator read, checked by the C++ parser, and
    gives the job its key.

    Attributes: config (the whole job config), open_ended and steps, has_scheduler,
    node_shards (exchange.servers "per_node"), notes (defaults chosen here that a user
    should hear of), the C++ config's facts (between_workers, scales_loss, micro_batches,
    cycles_betas), and after write() path and key.
    """

    def __init__(self, config, optimizer, optimizer_type, explicit, n, device, masked):
        """`optimizer`: the class name its errors begin with, of `optimizer_type`; `explicit`:
        the keywords given; n elements on `device` ("cpu" or "cuda"); `masked`: the param
        groups' exp_avg_mask ranges (_masked_ranges)."""
        self._optimizer = optimizer
        self._explicit = explicit
        self.has_scheduler = bool(config.get("scheduler"))
        # Without steps the job is open-ended: it ends when the workers' loops do.
        self.open_ended = "steps" not in config
        self.steps = OPEN_ENDED_STEPS if self.open_ended else int(config["steps"])
        self.node_shards = (config.get("onebit", {}).get("exchange", {}).get("servers")
                            == "per_node")
        self.notes = []
        self._given_optimizer = "optimizer" in config
        config = _job_config(config, optimizer_type, explicit, n, device, self.notes)
        if self.open_ended:
            config["steps"] = OPEN_ENDED_STEPS
        if masked:
            mask = config["onebit"].setdefault("momentum_mask", {})
            if mask.get("npy"):
                raise ValueError("a param group's exp_avg_mask and the job config's "
                                 "onebit.momentum_mask.npy: give one of them (the config's "
                                 "ranges may go with exp_avg_mask)")
            mask["ranges"] = list(mask.get("ranges", [])) + masked
        self.config = config
        self._ask()
        self.path = None
        self.key = None
        self._notices = []

    def _ask(self):
        """What the defaults and checks of the optimizer go by, in the C++ config's words (one
        rule in one place), asked of the config without the overlap that the optimizer
        decides afterwards (_overlap_setting)."""
        undecided = copy.deepcopy(self.config)
        undecided.get("onebit", {}).get("exchange", {}).pop("overlap", None)
        try:
            facts = _core().config_facts(json.dumps(undecided))
        except ValueError as e:
            raise _config_error(e, self._optimizer) from None
        self.between_workers = facts["warmup_between_workers"]
        self.scales_loss = facts["scales_loss"]
        self.micro_batches = facts["micro_batches"]
        self.cycles_betas = facts["cycles_betas"]

    def write(self):
        """Writes the config to a file of this process's (removed at its exit), which the C++
        parser checks, and makes this process's next job key."""
        global _JOBS_MADE
        f = tempfile.NamedTemporaryFile("w", prefix="onebit-job-", suffix=".json", delete=False)
        with f:
            json.dump(self.config, f, indent=1)
        self.path = f.name
        atexit.register(os.unlink, f.name)
        try:
            self._notices = _core().check_config(f.name)
        except ValueError as e:  # it names the key; the file is ours, not the user's
            raise _config_error(e, self._optimizer, f.name) from None
        _JOBS_MADE += 1
        self.key = f"the script's optimizer {_JOBS_MADE}"

    def say(self):
        """The C++ parser's notices and the notes, on stderr: rank 0, which runs the job's one
        coordinator, says them once."""
        for notice in self._notices:
            # Not of bias_correction when it is this package's default, not the user's.
            if notice.startswith("optimizer.params.bias_correction") and \
                    "bias_correction" not in self._explicit and not self._given_optimizer:
                continue
            print(f"onebit: config notice: {notice}", file=sys.stderr)
        for note in self.notes:
            print(f"onebit: {note}", file=sys.stderr)

    def worker_args(self, address, host, runs_coordinator, offsets, device, hyper_groups):
        """The worker's options (onebit/_native.py's Worker, but for its initial and loaded
        state): this job, the coordinator at `address`, this process's environment.
        `runs_coordinator`: this process runs the job's coordinator (it is rank 0)."""
        named_rank = any(os.environ.get(v) for v in ("ONEBIT_RANK", "RANK", "SLURM_PROCID"))
        return dict(
            config=self.path, coordinator=address, groups=offsets,
            host=host, metrics_port=int(os.environ.get("ONEBIT_METRICS_PORT", "0")),
            rank=rank() if named_rank or runs_coordinator else -1,
            summary_file=_per_rank(os.environ.get("ONEBIT_SUMMARY_FILE", "")),
            history_csv=_per_rank(os.environ.get("ONEBIT_HISTORY_CSV", "")),
            cuda_device=(device.index or 0) if device.type == "cuda" else 0,
            member_token_file=os.environ.get("ONEBIT_MEMBER_TOKEN_FILE", ""),
            hyper_groups=hyper_groups,
            # POINT:STEP, onebit-worker's --fault: the worker kills its process there (tests;
            # onebit-launch --fault=workerI:POINT:STEP sets it, for the first run only; under
            # a launcher that restarts the group it acts before the first restart only).
            fault=os.environ.get("ONEBIT_FAULT", "") if not _env.restart_count() else "",
            job_key=self.key,
            # DDP-quiet where the ranks share a console (torchrun, onebit-run, srun): rank 0
            # prints progress, the others only warnings and errors. onebit-launch gives
            # each worker a log of its own (ONEBIT_RANK): all of it there, as
            # onebit-worker's; ONEBIT_LOG_ALL_RANKS=1 likewise anywhere.
            quiet=(rank() != 0 and not os.environ.get("ONEBIT_RANK") and
                   any(os.environ.get(v) for v in ("RANK", "SLURM_PROCID")) and
                   not os.environ.get("ONEBIT_LOG_ALL_RANKS")))
