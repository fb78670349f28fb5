"""What backward() hands to the step: which parameters got a gradient since the last step
(a hook on each, and each .grad's memory and version), the checks that every one has a
dense gradient, unchanged since it went to the exchange, and their way into the flat
buffer the worker reads; and with overlap on, the buckets of gradients that go to the
exchange while backward() still runs, as DDP's do (_overlap_setting decides whether).
"""

import bisect
import weakref

import torch

from onebit._errors import ScriptRuntimeError, ScriptValueError

_FIRST_BUCKET_BYTES = 1 << 20  # DDP's first bucket: the last layers go out soon


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


def _overlap_setting(job, overlap, cap_mb, device):
    """(first bucket, bucket) caps in floats where the warmup exchange overlaps
    backward(), else None. The config's onebit.exchange.overlap and the keyword must
    agree where both are given; by default on for CPU tensors where the warmup goes
    between the workers (peer mode, or ps with warmup_over "workers", which
    servers "per_node" sets). `job`: the optimizer's _Job, whose facts decide, and whose
    config takes the decision as onebit.exchange.overlap."""
    exchange = job.config.setdefault("onebit", {}).setdefault("exchange", {})
    configured = exchange.get("overlap")
    if overlap is not None and configured is not None and bool(overlap) != configured:
        raise ValueError(f"overlap={overlap} while the job config's onebit.exchange.overlap "
                         f"is {configured}: give one of the two")
    if not cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {cap_mb}")
    on = overlap if overlap is not None else configured
    mode = exchange.get("mode", "peer")
    if on is None:
        on = (job.between_workers and device.type == "cpu" and not job.scales_loss
              and job.micro_batches == 1)
    if on and job.micro_batches > 1:
        raise ValueError(f"overlap with gradient_accumulation_steps {job.micro_batches}: "
                         "the micro-batches' gradients are averaged before the warmup "
                         "exchange, so it cannot start during backward(); build the "
                         "optimizer with overlap=False, or accumulate the torch way "
                         "(backward() inside `with opt.no_sync():` but the last, one "
                         "step()), where overlap stays on")
    if on and job.scales_loss:
        raise ValueError("overlap with fp16 loss scaling: the workers agree on overflows "
                         "before the warmup exchange, so it cannot start during "
                         "backward(); build the optimizer with overlap=False")
    if on and device.type != "cpu":
        raise ValueError("overlap (the warmup exchange during backward) works on CPU "
                         "tensors only so far; on CUDA build the optimizer with "
                         "overlap=False")
    if on and not job.between_workers:
        raise ValueError(f"overlap needs a warmup between the workers: onebit.exchange.mode "
                         f"\"peer\", or \"ps\" with warmup_over \"workers\", not "
                         f"\"{mode}\"{' with its warmup through the shards' if mode == 'ps' else ''}"
                         ": build the optimizer with overlap=False")
    exchange["overlap"] = bool(on)
    if not on:
        return None
    cap = max(1, int(cap_mb * (1 << 20)) // 4)
    return min(_FIRST_BUCKET_BYTES // 4, cap), cap


class _Gradients:
    """The gradients of `flat`'s parameters (a _FlatParams) between two steps: which
    arrived, and with overlap on (`overlap`: _overlap_setting's caps, else None) the
    buckets that went to the exchange. Backward's hooks call `on_accumulated(i)` each time
    it has accumulated parameter i's gradient into .grad."""

    def __init__(self, flat, on_accumulated):
        self._flat = flat
        params = flat.params
        # Which parameters got a gradient since the last step: backward reached them (a
        # hook), or their .grad was written or replaced (its version counter or memory moved
        # since _versions_then, taken after the last step, at binding and at zero_grad).
        self._arrived = [False] * len(params)
        self._versions_then = None
        me = weakref.ref(self)
        for i, p in enumerate(params):
            p.register_hook(lambda grad, i=i, me=me: me()._arrived.__setitem__(i, True)
                            if me() else None)
        # OVERLAP: each parameter's gradient, once backward accumulated it.
        self._hook_handles = [_after_accumulation(p, lambda i=i: on_accumulated(i))
                              for i, p in enumerate(params)]
        self.no_sync = 0     # the depth of `with opt.no_sync():` blocks around backward()
        self.overlap = None  # _overlap_setting's caps
        self.plan = None     # the buckets, once the worker is joined with overlap on

    def start(self):
        """The worker joins: with overlap on, the buckets' [begin, end) ranges in the flat
        buffer, for the worker; else []."""
        if self.overlap is None:
            return []
        self.plan = _BucketPlan(self._flat.params, self._flat.offsets, *self.overlap)
        return self.plan.ranges

    def bound(self, arrived):
        """The parameters now view the worker's buffers; those in `arrived` had a gradient
        from before."""
        for i in arrived:
            self._arrived[i] = True
        self._versions_then = self._versions()

    def zeroed(self, set_to_none):
        """zero_grad() ran: zeroing in place is no new gradient, and what arrived before is
        gone."""
        self._arrived = [False] * len(self._flat.params)
        if not set_to_none and self._versions_then is not None:
            self._versions_then = self._versions()

    def handed_over(self):
        """The worker took this step's gradient: no bucket is sent, none is final."""
        if self.plan is not None:
            self.plan.reset()

    def stepped(self):
        """The step is over: the next one starts with no gradient."""
        self._arrived = [False] * len(self._flat.params)
        self._versions_then = self._versions()

    def _versions(self):
        return [None if p.grad is None else (p.grad.data_ptr(), p.grad._version)
                for p in self._flat.params]

    def without_gradient(self):
        """The parameters that got no gradient since the last step: no backward reached
        them and their .grad was neither written nor replaced (a zero_grad(set_to_none=False)
        leaves the old view, zeroed: that is no gradient)."""
        if self._versions_then is None:  # before binding: backward made the .grad tensors
            return [i for i, p in enumerate(self._flat.params) if p.grad is None]
        now = self._versions()
        return [i for i, (p, arrived, was, is_) in
                enumerate(zip(self._flat.params, self._arrived, self._versions_then, now))
                if p.grad is None or not (arrived or is_ != was)]

    def accumulated(self, i, send):
        """Backward accumulated parameter i's gradient: with overlap on (and outside
        no_sync), send(bucket) for each bucket whose gradients are now all final, in order."""
        plan = self.plan
        if plan is None or self.no_sync:
            return
        if plan.ready[i]:
            raise ScriptRuntimeError(
                f"{self._flat.what(i)} got a second gradient before step(), after the first "
                "went to the exchange (overlap): accumulate micro-batches inside `with "
                "opt.no_sync():` (all but the last backward), as with DDP, or build the "
                "optimizer with overlap=False")
        # At once, one tensor: backward's own .grad is freed here, and its memory serves the
        # next gradients of the same backward (holding them for one torch.cat per bucket
        # made backward allocate fresh memory: its time rose from 89-100 to 213-220 ms for
        # the 10.8M GPT on the CPU; BENCHMARKS.md).
        self._flat.grad_into_view(i)
        for bucket in plan.mark(i):
            send(bucket)
        if plan.next == len(plan.buckets):
            plan.sealed = self._flat.grad._version

    def gather(self, without, worker):
        """Checks that every parameter has a dense gradient (none is in `without`,
        without_gradient's list) and puts each into the flat buffer the worker reads
        (backward's own tensors are copied there); with overlap on, that none changed after
        it went to the exchange."""
        flat, plan = self._flat, self.plan
        fresh = []  # parameters whose .grad is a tensor of its own, not the buffer's view
        without = set(without)
        for i, p in enumerate(flat.params):
            grad = p.grad
            if i in without:
                raise ScriptValueError(
                    f"{flat.what(i)} has no gradient on this step: every parameter the "
                    "optimizer holds must take part in the loss on every worker (the momentum "
                    "is one flat exchange). Freeze it (requires_grad_(False) before building "
                    "the optimizer: it is left out), or keep it out of the optimizer's params")
            if grad.is_sparse:
                raise ScriptValueError(f"{flat.what(i)} has a sparse gradient; onebit needs "
                                       "dense ones")
            if grad.data_ptr() != flat.grad_views[i].data_ptr():
                fresh.append(i)
        if plan is not None and plan.sealed is not None and flat.grad._version != plan.sealed:
            # At its first call, whether or not it clipped (it scales in place either way),
            # not at the first step whose norm it clips.
            raise ScriptRuntimeError(
                "the gradients were changed in place after backward() handed them to the "
                "exchange (overlap on), as torch.nn.utils.clip_grad_norm_ does: clip with "
                "opt.clip_grad_norm_(max_norm), which clips the workers' average gradient as "
                "DDP's clipping does, or build the optimizer with overlap=False")
        # zero_grad(set_to_none=True) (torch 2's default) or a .grad replaced: backward
        # wrote tensors of its own, which go into the exchange's buffer.
        flat.grads_into_views(fresh)
        if plan is not None and plan.next > 0:
            changed = worker.changed_since_announced()
            if changed >= 0:
                i = bisect.bisect_right(flat.offsets, changed) - 1
                raise ScriptRuntimeError(
                    f"the gradient of {flat.what(i)} changed after backward() handed it to "
                    "the exchange (overlap): change gradients before they are final, clip "
                    "with opt.clip_grad_norm_(max_norm), or build the optimizer with "
                    "overlap=False")
