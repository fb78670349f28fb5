"""_OnebitOptimizer, the torch.optim facade every onebit optimizer type shares: its
constructor, its public methods and properties (step, zero_grad, state_dict, close, ...),
and the worker's life from joining the job (the first step) to its end: each step's
hand-over, the job's verdict when the worker stops, the close. What it delegates lives with
its family: the job config (_job), the param groups and their schedules (_groups), the
parameters and their memory (_params), backward's gradients and the overlap (_gradients),
the state in torch.optim's layout (_state), and the processes beside the worker and the
script's end (_processes).
"""

import contextlib
import os
import sys
import weakref

import torch

from onebit._core import _core
from onebit._errors import OnebitError, ScriptRuntimeError, ScriptValueError
from onebit._gradients import _Gradients, _overlap_setting
from onebit._groups import _hyper_groups, _masked_ranges, _Schedule
from onebit._job import (_UNSET, _Job, _explicit_keywords, _shard_state_setting,
                         _torch_defaults, load_config)
from onebit._params import _FlatParams, _named_and_trainable
from onebit._processes import _Processes, _refuse_a_second_member, _track
from onebit._state import (_flat_state, _start_state, _State, _state_range, _torch_layout,
                           _unjoined_state)


def _phase(name):
    """step()'s phase `name` as a range torch.profiler shows ("onebit.step: ..."; how
    tools/gpu/step_bench.py --profile_steps splits the host's part of a step); nothing
    while no profiler runs (a range costs ~6 us a step, a check 0.1 us)."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(f"onebit.step: {name}")
    return contextlib.nullcontext()


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
        shard_state: Whether each worker keeps the optimizer state of its slice of the
            parameters only, the node's workers sharing it (onebit.exchange.shard_state).
            The training's bits stay the same. It needs exchange mode "hierarchical" with
            local_size >= 2, and OneBitAdam, Adam or OneBitLamb; elsewhere True is a
            ValueError. None: the config decides (off by default). It must agree with
            the config's onebit.exchange.shard_state where both are given.
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
                 coordinator=None, timeout_s=600.0, overlap=None, bucket_cap_mb=25.0,
                 shard_state=None, **hyper):
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
        _refuse_a_second_member(self)
        explicit = _explicit_keywords(
            type(self).__name__, self._own, dict(lr=lr, betas=betas, eps=eps,
                                                 weight_decay=weight_decay,
                                                 bias_correction=bias_correction), hyper)
        if config is None:
            config = os.environ.get("ONEBIT_CONFIG") or None
        job = load_config(config)
        _shard_state_setting(job, shard_state)
        defaults = _torch_defaults(job, explicit)
        params, names, frozen = _named_and_trainable(params)
        if not params and frozen:
            raise ValueError(f"no parameter requires a gradient ({frozen} left out: "
                             "requires_grad=False)")
        super().__init__(params, defaults)
        self._flat = _FlatParams([p for group in self.param_groups for p in group["params"]],
                                 names)
        self.state = _State(self)  # torch.optim's defaultdict, read from the worker
        self._frozen = frozen  # left out: they do not train, and do not count
        # The worker joins the job at the first step (or rank, state_dict, ...): until then
        # the model's parameters may still change (model.load_state_dict), and a saved
        # state may be loaded (load_state_dict), where the job then starts.
        self._worker = None
        self._closed = False  # close() ran
        self._next = 1        # the step the next step() completes (the job's, once joined)
        self._loaded = None   # a state to start from (load_state_dict before the first step)
        self._done = False
        self._stopped = None  # why the worker stopped, once it did
        self._stopped_code = 1  # the exit code its verdict asks for
        self._failed_job = None  # why this script's own loop failed the job, if it did
        self._clip = None     # clip_grad_norm_'s max_norm for the next step
        self._loss_scale = 1.0  # this step's, once joined
        me = weakref.ref(self)
        self._gradients = _Gradients(
            self._flat, lambda i, me=me: me() is not None and me()._accumulated(i))
        hyper_groups = _hyper_groups(self.param_groups, defaults)
        masked = _masked_ranges(self.param_groups, self._flat)
        self._schedule = _Schedule(self.param_groups, defaults)
        self._job = _Job(job, type(self).__name__, self._type, explicit, self._flat.n,
                         "cuda" if self._flat.device.type == "cuda" else "cpu", masked)
        self._gradients.overlap = _overlap_setting(self._job, overlap, float(bucket_cap_mb),
                                                   self._flat.device)
        self._job.write()
        self._processes = _Processes(self._job, coordinator)
        self._timeout = float(timeout_s)
        self._processes.start_shard(self._job)
        self._worker_args = self._job.worker_args(
            self._processes.address, self._processes.rendezvous.host,
            self._processes.coordinator is not None, self._flat.offsets, self._flat.device,
            hyper_groups)
        _track(self)

    def _joined(self):
        """The worker, joined to the job: its first lease granted (or the job over)."""
        if self._worker is None:
            _refuse_a_second_member(self)
            # What the parameters were checked for at construction still holds (a model
            # moved or cast since would be put back, or fail in C++).
            self._flat.check()
            if self._flat.params[0].device != self._flat.device:
                raise RuntimeError(
                    f"the parameters moved to {self._flat.params[0].device} after the optimizer "
                    f"was built on {self._flat.device}: move the model before building the "
                    "optimizer")
            initial = self._flat.current()
            if self._loaded is not None and "params" not in self._loaded["tensors"]:
                # The model's, as torch.optim (over a sharded state's range).
                lo, hi = _state_range(self._loaded, self._flat.n)
                self._loaded["tensors"]["params"] = initial[lo:hi]
            ranges = self._gradients.start()
            self._worker = _core().Worker(initial=initial,
                                          loaded=self._loaded, buckets=ranges,
                                          param_dtype=self._flat.param_dtype(),
                                          **self._worker_args)
            # The worker copied them: this float32 copy would stay alive through the
            # worker's start (4 bytes a parameter of host memory, BENCHMARKS.md).
            del initial
            self._loaded = None
            self._worker.start()
            self._next = self._wait()
            if not self._done:
                self._gradients.bound(self._flat.bind(self._worker))
        return self._worker

    @property
    def done(self):
        """True once the job is over for this worker (after its last step)."""
        self._joined()
        return self._done

    def _at_exit(self, uncaught):
        """The script's end (atexit): the worker stops, naming the script's `uncaught`
        exception where there was one (the job recovers from it, as from a lost process: a
        restart may fix it)."""
        if not self._done:
            if uncaught:
                self.close(uncaught, restartable=True)
            else:
                self.close(self._stopped or self._ended_early("the script exited"))
        self._close_processes()
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
        return (self._next - 1) // self._job.micro_batches

    def _ended_early(self, what):
        micro = (f" (micro-batch {self._next - 1})" if self._job.micro_batches > 1 else "")
        return (f"{what} after step {self._last_step()}{micro} of the job's {self._job.steps} "
                "(onebit.steps): the training loop is shorter than the job; every worker "
                "must run every step (stop at opt.done, or give the job fewer steps)")

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None and not self._done and not self._job.open_ended:
            self.close(self._ended_early("the with block ended"))
        elif kind is not None:
            self.close(f"the with block raised {kind.__name__}: {value}", restartable=True)
        else:
            self.close()
        return False

    def _close_processes(self):
        """The coordinator and shard this process runs for the job end with it
        (_Processes.close)."""
        self._processes.close(self._done, self._timeout)

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
        if self._done and (self._closed or self._job.open_ended):
            raise OnebitError(
                "step() after the optimizer was closed (close(), its with block, or the end of "
                "a job without steps): its job is over; build a new optimizer for the next", 1)
        if self._done:
            raise OnebitError(
                f"step() after the job's last step ({self._job.steps}, onebit.steps): the "
                "training loop is longer than the job; stop at opt.done, or give the job more "
                "steps", 1)
        self._flat.check_not_moved()
        without = self._gradients.without_gradient()
        if len(without) == len(self._flat.params):  # no backward, no .grad written
            raise ScriptRuntimeError("step() without a new gradient since the last step (no "
                                     "backward, no .grad written): nothing was exchanged; "
                                     "call loss.backward() first")
        with _phase("gradients into the buffer"):
            self._gradients.gather(without, self._worker)
        if self._flat.device.type == "cuda":
            torch.cuda.current_stream(self._flat.device).synchronize()
        groups = self.param_groups
        self._schedule.check_fixed(groups)
        lr = self._schedule.lr(groups, self._job.has_scheduler)
        betas = self._schedule.betas(groups, self._job.cycles_betas)
        decays = self._schedule.weight_decays(groups)
        value = None if loss is None else float(  # None: the worker says no loss
            loss.detach() if isinstance(loss, torch.Tensor) else loss)
        clip, self._clip = self._clip, None
        with _phase("hand-over to the worker"):
            self._to_worker(self._joined().supply, self._next, loss=value, lr=lr,
                            max_grad_norm=clip, betas=betas, weight_decays=decays or None,
                            grad_scale=grad_scale)
            self._gradients.handed_over()
        stepped = self._next
        with _phase("the worker's step"):
            self._next = self._wait()
        if grad_scale is not None and not self._done:
            self._tell_the_grad_scaler(self._worker.skipped(stepped))
        if self._flat.masters and not self._done:
            self._flat.sync_low_precision()
        if self._job.micro_batches > 1 and not self._done:
            # The worker took this micro-batch's gradient: .grad starts again from zero, as
            # DeepSpeed's engine clears it, so that a loop without zero_grad (or with one
            # an optimizer step) hands over each micro-batch's own gradient, not the sum so far.
            self._flat.zero_grads()
        self._gradients.stepped()
        return loss

    def _script_grad_scale(self):
        """The factor torch.amp.GradScaler multiplied this step's gradient by (1 after its
        unscale_), or None without a GradScaler. The workers then skip alike a step whose
        gradient overflowed on any of them (found_inf is this worker's alone)."""
        if not hasattr(self, "found_inf"):
            return None
        if self._job.scales_loss:
            raise ScriptValueError(
                "torch.amp.GradScaler and the job config's fp16 block both scale the loss: "
                "use one of the two")
        if self._gradients.overlap is not None:
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
        grads = [p.grad for p in self._flat.params if p.grad is not None]
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
        self._gradients.no_sync += 1
        try:
            yield
        finally:
            self._gradients.no_sync -= 1

    def _accumulated(self, i):
        """Backward accumulated parameter i's gradient: with overlap on, the buckets whose
        gradients are all final go to the exchange now, in order."""
        if self._done or self._stopped or self._worker is None:
            return
        self._gradients.accumulated(
            i, lambda bucket: self._to_worker(self._worker.announce, self._next, bucket))

    def add_param_group(self, param_group):
        """torch.optim's, while the optimizer is being built; afterwards a ValueError. The
        parameters are one flat buffer, sized and counted by the job when the optimizer was
        built, so a group added later (layers unfrozen in fine-tuning) would never train.

        Args:
            param_group: A dict with "params" and the group's own hyper-parameters, as
                torch.optim takes it.
        """
        if hasattr(self, "_flat"):
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
        self._gradients.zeroed(set_to_none)

    def state_dict(self, full=False):
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

        With sharded state (onebit.exchange.shard_state) a worker holds the state of one
        flat range of the parameters, [begin, end) in param_groups' order. By default it
        returns that range: "state" has the parameters wholly inside it. The "onebit" part
        then has "shard": {"begin", "end", "names" (the state tensors), "partial"}.
        "partial" maps the index of each parameter that straddles an end of the range to
        {"begin", "end", "state"}: elements [begin, end) of the flattened parameter, and
        each state tensor's 1-D part. This loads back into the same rank of the same
        topology, mid-run or before a fresh job's first step.

        Before the first step this does not join the job. The state is then step 0's, zeros,
        or the state a load_state_dict() gave. So torch.distributed.checkpoint's
        get_optimizer_state_dict gives dcp.load a template to load into.

        Args:
            full: True: the whole state, as an unsharded worker's, which loads into a
                sharded job or an unsharded one. A sharded worker gathers it from the
                other workers of its node between two steps: every rank of the node must
                call it at the same step. After the job's last step the node is gone, and
                it is a RuntimeError. Unsharded, it changes nothing.
        """
        if self._worker is None and not self._done:
            raw, rank_, world = _unjoined_state(self._loaded, self._flat.n, self._states)
            if full and "state_begin" in raw["scalars"]:
                raise RuntimeError(
                    "state_dict(full=True) before the first step: the state loaded is one "
                    "rank's shard, and the node gathers the whole state once the job runs")
        else:
            worker = self._joined()
            if not full:
                raw = worker.state_dict()
            else:
                try:
                    raw = worker.gathered_state_dict()
                except RuntimeError as e:
                    raise RuntimeError(f"state_dict(full=True): {e}") from None
            rank_, world = worker.rank, worker.world_size
        return _torch_layout(raw, rank_, world, self._flat, self.param_groups)

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

        A sharded worker takes a whole state (state_dict(full=True), or an unsharded
        job's) or its own range, as state_dict() gave it on the same rank. After the first
        step its load is a collective: the node's workers share the new parameters, so
        every rank of the node loads at the same step.

        Args:
            state_dict: What state_dict() returned, maybe through torch.save and
                torch.load, or torch.distributed.checkpoint.
        """
        state, groups = _flat_state(state_dict, self.param_groups, self._flat)
        if self._worker is not None:
            if "params" not in state["tensors"]:
                lo, hi = _state_range(state, self._flat.n)
                state["tensors"]["params"] = self._flat.current()[lo:hi]
            self._worker.load_state_dict(state)
            return
        loaded = _start_state(state, groups, self.param_groups, self._flat.n)
        if loaded is not None:
            self._loaded = loaded

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
            self._processes.leave(f"stopped before its first step: {why}", restartable)
            self._close_processes()
            return
        if not self._done and self._job.open_ended and not self._stopped and not restartable:
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
            elif not stopped and self._processes.coordinator is None:
                # The script raised: the job recovers at once, naming this worker and the
                # error, where its peers would otherwise wait out a heartbeat timeout (rank
                # 0 with the job's coordinator recovers it itself: _Processes.leave).
                self._worker.report_restartable_exit(why, self._last_step() + 1)
            self._worker.close(why)
            # A worker that stopped by itself (a lost peer, the job's verdict) leaves the
            # job to the coordinator's verdict.
            self._processes.leave(f"stopped: {why}", restartable or bool(stopped))
        self._close_processes()
        self._closed = True

    def _in_job(self):
        """This optimizer holds a part of a job: it was built (its job exists from then on,
        on every rank: rank 0's coordinator runs it) and has not ended."""
        return self._processes.coordinator is not None or not (
            self._done or self._closed or self._stopped)

    def _stopped_error(self, e):
        """The OnebitError for the worker's failure `e` (its wait, or a hand-over to it),
        with the exit code the job's verdict asks for."""
        self._flat.unbind(self._worker)
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
            self._flat.unbind(self._worker, final=True)
            self._close_processes()
        elif self._job.scales_loss:
            self._loss_scale = float(self._worker.loss_scale())
        return step
