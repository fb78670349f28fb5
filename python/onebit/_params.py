"""The parameters an optimizer trains and their memory: which tensors (trainable, named
where the script named them, each checked), each one's slice of one flat float32 buffer,
and from the worker's joining (bind) to its end (unbind) their memory: each float32
parameter and each .grad views the worker's buffers, where a bfloat16 or float16 parameter
keeps its own memory and the buffer holds its float32 master, copied back after each
step. With sharded state and every parameter of one low-precision type, the worker keeps
only its shard's float32 masters, and the parameters view its low-precision buffer, which
it writes itself after each step."""

import ctypes

import torch

from onebit._errors import ScriptRuntimeError


# The parameter types onebit trains: float32 ones view its flat buffer; bfloat16 and float16
# ones keep their memory, and the buffer holds their float32 master copy.
_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The worker's names of the low-precision types (its option param_dtype).
_LOW_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


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


def _cuda_view(address, n, device, typestr="<f4"):
    class _Memory:
        __cuda_array_interface__ = {
            "shape": (n,), "typestr": typestr, "data": (address, False), "version": 2}
    return torch.as_tensor(_Memory(), device=device)


def _torch_dtype(name):
    """The torch dtype of the worker's "bf16" or "fp16"."""
    return next(t for t, known in _LOW_DTYPE_NAMES.items() if known == name)


def _low_view(address, n, dtype, device, owner):
    """n elements of a 2-byte `dtype` at `address` (the worker's low-precision parameters,
    device or host memory), no copy. The array interfaces know no bfloat16: the memory is
    taken as int16 and viewed as `dtype`. A host view keeps `owner` alive."""
    if device.type == "cuda":
        return _cuda_view(address, n, device, "<i2").view(dtype)
    if n == 0:
        return torch.empty(0, dtype=dtype)
    array = (ctypes.c_int16 * n).from_address(address)
    array._owner = owner  # noqa: SLF001 (the worker outlives the view)
    return torch.frombuffer(array, dtype=torch.int16, count=n).view(dtype)


class _FlatParams:
    """The parameters in param-group order, parameter i the slice offsets[i]:offsets[i + 1]
    of the flat buffer (n elements in all), all on one device. Once bound, grad is the
    worker's flat gradient buffer, grad_views its slices by parameter, and masters the
    float32 masters of the bfloat16 and float16 parameters by index."""

    def __init__(self, params, names):
        self.params = params
        self.names = names  # {id(tensor): name} where named_parameters() gave the tensors
        self.index_of = {id(p): i for i, p in enumerate(params)}
        self.check()
        self.device = params[0].device
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.n = self.offsets[-1]
        self.masters = {}  # bfloat16/float16 parameters' float32 masters, once bound
        self.own_grads = set()  # bfloat16/float16 parameters: their .grad is their own
        self.grad = None   # the worker's gradient buffer, once bound
        self.grad_views = []
        self._addresses = []  # each parameter's memory, as bound

    def what(self, i):
        """How errors name parameter i: by its name where the optimizer was given
        model.named_parameters(), with its shape."""
        p = self.params[i]
        name = self.names.get(id(p))
        return (f"parameter {name!r} ({tuple(p.shape)})" if name is not None
                else f"parameter {i} ({tuple(p.shape)})")

    def check(self):
        """What onebit trains: dense, contiguous float32, bfloat16 or float16 tensors on one
        device (a TypeError or ValueError naming the first that is not)."""
        if not self.params:
            raise ValueError("no parameters to optimize")
        device = self.params[0].device
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameter {i} is a {type(p).__name__}, not a tensor")
            if p.dtype not in _PARAM_DTYPES:
                raise ValueError(f"{self.what(i)} is {p.dtype}; onebit trains float32, "
                                 "bfloat16 and float16 parameters (the last two with a float32 "
                                 "master copy of its own)")
            if p.is_sparse:
                raise ValueError(f"{self.what(i)} is sparse")
            if not p.is_contiguous():
                raise ValueError(f"{self.what(i)} is not contiguous")
            if p.device != device:
                raise ValueError(f"{self.what(i)} is on {p.device}, parameter 0 on {device}")

    def param_dtype(self):
        """The worker's option param_dtype: "bf16" or "fp16" when every parameter has that
        type, else "fp32" (mixed types keep every master whole in the worker)."""
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) == 1 and next(iter(dtypes)) in _LOW_DTYPE_NAMES:
            return _LOW_DTYPE_NAMES[next(iter(dtypes))]
        return "fp32"

    def current(self):
        """The model's parameters, flat, as a float32 CPU copy."""
        return torch.cat([p.detach().reshape(-1).to(device="cpu", dtype=torch.float32)
                          for p in self.params])

    def check_not_moved(self):
        """Each parameter still views the memory it was bound to."""
        moved = next((i for i, (p, address) in enumerate(zip(self.params, self._addresses))
                      if p.data_ptr() != address), None)
        if moved is not None:
            raise ScriptRuntimeError(
                f"{self.what(moved)} got memory of its own (p.data = ..., model.to(), .half()) "
                "after the optimizer took it over: onebit steps the parameters in its own "
                "buffer, which the tensors must keep viewing, so it would train no more. Copy "
                "new values in place (with torch.no_grad(): p.copy_(new)), or move the model "
                "before building the optimizer")

    def bind(self, worker):
        """The parameters and their gradients become views of the worker's buffers (a
        gradient made before the worker joined is copied in): the indices of those that had
        one. A worker with low-precision parameters (sharded state) holds the model's own:
        the parameters view them, and it keeps no master here. A bfloat16 model's gradient
        buffer there is bfloat16 too: the .grad tensors view it as they are."""
        address, dtype = worker.param_buffer()
        low = None
        if dtype != "fp32":
            low = _low_view(address, self.n, _torch_dtype(dtype), self.device, worker)
        grad_address, grad_dtype = worker.gradient_buffer()
        if grad_dtype != "fp32":
            grad = _low_view(grad_address, self.n, _torch_dtype(grad_dtype), self.device, worker)
        elif worker.cuda:
            grad = _cuda_view(grad_address, self.n, self.device)
        else:
            grad = worker.gradient()
        if worker.cuda:
            flat = None if low is not None else _cuda_view(address, self.n, self.device)
        else:
            flat = None if low is not None else worker.params()
        self.grad_views = []
        self.masters = {}  # index: the float32 master of a bfloat16 or float16 parameter
        self.own_grads = set()
        arrived = []
        with torch.no_grad():
            for i, (p, begin, end) in enumerate(zip(self.params, self.offsets,
                                                    self.offsets[1:])):
                view = grad[begin:end].view(p.shape)
                if p.grad is not None:
                    view.copy_(p.grad)
                    arrived.append(i)  # a gradient made before the worker joined
                if low is not None:  # the worker's parameter; its own (low) gradient
                    if p.dtype != low.dtype:
                        raise ScriptRuntimeError(
                            f"{self.what(i)} is {p.dtype}; the worker keeps {low.dtype} "
                            "parameters (the model's types changed after the optimizer was built)")
                    p.data = low[begin:end].view(p.shape)
                    if grad.dtype == p.dtype:  # the worker's gradient too
                        p.grad = view
                    else:
                        self.own_grads.add(i)
                elif p.dtype == torch.float32:
                    p.data = flat[begin:end].view(p.shape)
                    p.grad = view
                else:  # its own memory and gradient; the master and its gradient here
                    self.masters[i] = flat[begin:end].view(p.shape)
                    self.own_grads.add(i)
                self.grad_views.append(view)
        self.grad = grad  # what the views cover, in the parameters' order
        self._addresses = [p.data_ptr() for p in self.params]
        return arrived

    def sync_low_precision(self):
        """Each bfloat16 or float16 parameter takes its float32 master's new value."""
        with torch.no_grad():
            for i, master in self.masters.items():
                self.params[i].copy_(master)

    def unbind(self, worker, final=False):
        """The worker's buffers go with it: the tensors get memory of their own (a bfloat16
        or float16 parameter has its own, and keeps its last value). `final`: the job is
        over, and they take the worker's last parameters; else NaN."""
        self.grad = None
        masters, self.masters = self.masters, {}
        own_grads, self.own_grads = self.own_grads, set()
        with torch.no_grad():
            if final:
                last = worker.final_params().to(self.device)
            for i, (p, begin, end) in enumerate(zip(self.params, self.offsets,
                                                    self.offsets[1:])):
                if i in masters:
                    if final:
                        p.copy_(last[begin:end].view(p.shape))
                    continue
                # A low-precision parameter viewing the worker's: its values (final_params
                # widened them: the cast back is exact) in memory of its own, its .grad kept.
                if final:
                    value = last[begin:end].view(p.shape)
                    p.data = value.clone() if p.dtype == value.dtype else value.to(p.dtype)
                else:
                    p.data = torch.full(p.shape, float("nan"), dtype=p.dtype, device=self.device)
                if i not in own_grads:
                    p.grad = None

    def grads_into_views(self, indices):
        """grad_into_view for each of `indices`; where that is every parameter (backward
        made every .grad, as after zero_grad(set_to_none=True)), one torch.cat into the flat
        buffer: one batched copy in place of one per tensor (on the CPU about half the time,
        BENCHMARKS.md; on a GPU one batched kernel in place of a copy per parameter, not
        yet measured)."""
        if len(indices) < len(self.params) or self.own_grads:
            for i in indices:
                self.grad_into_view(i)
            return
        with torch.no_grad():
            torch.cat([p.grad.reshape(-1) for p in self.params], out=self.grad)
        for p, view in zip(self.params, self.grad_views):
            p.grad = view

    def grad_into_view(self, i):
        """Parameter i's .grad in the exchange's buffer: after zero_grad(set_to_none=True)
        (or a .grad replaced) backward wrote a tensor of its own, copied in here (a
        bfloat16 or float16 parameter's, cast to float32, at every step)."""
        p, view = self.params[i], self.grad_views[i]
        if p.grad.data_ptr() != view.data_ptr():
            with torch.no_grad():
                view.copy_(p.grad.reshape(view.shape))
            if i not in self.own_grads:
                p.grad = view

    def zero_grads(self):
        """Every gradient zeroed in place: the flat buffer and the bfloat16 and float16
        parameters' own."""
        with torch.no_grad():
            self.grad.zero_()
            for i in self.own_grads:
                if self.params[i].grad is not None:
                    self.params[i].grad.zero_()
