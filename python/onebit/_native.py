"""onebit's native core, libonebit_core.so (python/c_api.h), through ctypes.

A C library rather than a CPython extension: it depends on no Python, NumPy or torch ABI,
so one wheel serves every CPython from 3.9 on with whatever NumPy and torch are installed.
Tensors cross as addresses (data_ptr()); the library never sees a Python object. ctypes
releases the interpreter lock during every call, so the waits here block no other thread.

Errors: a call that fails raises ValueError (INVALID_ARGUMENT), FileNotFoundError
(NOT_FOUND), TimeoutError (UNAVAILABLE, DEADLINE_EXCEEDED) or RuntimeError, with the core's
message.
"""
import ctypes
import json
import os
import sys

# torch is imported where tensors are made, not here: the core's config and coordinator
# calls work without it (the wheel's test loads the core on every CPython it finds).

ABI_VERSION = 5
LIBRARY_NAME = "libonebit_core.so"
_INVALID_ARGUMENT, _DEADLINE_EXCEEDED, _NOT_FOUND, _UNAVAILABLE = 3, 4, 5, 14

_c_int, _c_int64, _c_uint64 = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64
_c_size, _c_double, _c_float = ctypes.c_size_t, ctypes.c_double, ctypes.c_float
_c_str, _c_void = ctypes.c_char_p, ctypes.c_void_p
_P = ctypes.POINTER

# onebit_step_inputs (c_api.h): a field counts when its bit is in `set`.
_STEP_LOSS, _STEP_LR, _STEP_MAX_GRAD_NORM = 1 << 0, 1 << 1, 1 << 2
_STEP_BETAS, _STEP_WEIGHT_DECAYS, _STEP_GRAD_SCALE = 1 << 3, 1 << 4, 1 << 5


class _StepInputs(ctypes.Structure):
    _fields_ = [("set", ctypes.c_uint32), ("loss", _c_double), ("lr", _c_double),
                ("max_grad_norm", _c_double), ("beta1", _c_double), ("beta2", _c_double),
                ("grad_scale", _c_double), ("weight_decays", _P(_c_double)),
                ("n_weight_decays", _c_size)]


# Each function's (result, arguments); ints are status codes unless said otherwise.
_SIGNATURES = {
    "onebit_abi_version": (_c_int, []),
    "onebit_last_error": (_c_str, []),
    "onebit_free": (None, [_c_void]),
    "onebit_strict_json": (_c_int, [_c_str, _P(_c_void)]),
    "onebit_check_config": (_c_int, [_c_str, _P(_c_void)]),
    "onebit_config_facts": (_c_int, [_c_str, _P(_c_void)]),
    "onebit_default_max_restarts": (_c_int, []),
    "onebit_max_mask_ranges": (_c_int, []),
    "onebit_state_new": (_c_void, [_c_int64, _c_int64, _c_int, _c_int]),
    "onebit_state_free": (None, [_c_void]),
    "onebit_state_step": (_c_int64, [_c_void]),
    "onebit_state_freeze_step": (_c_int64, [_c_void]),
    "onebit_state_put_tensor": (_c_int, [_c_void, _c_int, _c_str, _c_void, _c_size]),
    "onebit_state_put_scalar": (_c_int, [_c_void, _c_int, _c_str, _c_double]),
    "onebit_state_count": (_c_size, [_c_void, _c_int]),
    "onebit_state_name": (_c_str, [_c_void, _c_int, _c_size]),
    "onebit_state_tensor_size": (_c_size, [_c_void, _c_int, _c_size]),
    "onebit_state_tensor_copy": (_c_int, [_c_void, _c_int, _c_size, _c_void]),
    "onebit_state_scalar": (_c_double, [_c_void, _c_int, _c_size]),
    "onebit_options_new": (_c_void, []),
    "onebit_options_free": (None, [_c_void]),
    "onebit_options_set_string": (_c_int, [_c_void, _c_str, _c_str]),
    "onebit_options_set_int": (_c_int, [_c_void, _c_str, _c_int64]),
    "onebit_options_add_hyper_group": (_c_int, [_c_void, _c_uint64, _c_uint64, _c_float,
                                                _c_float]),
    "onebit_options_add_bucket": (_c_int, [_c_void, _c_uint64, _c_uint64]),
    "onebit_options_add_group_boundary": (_c_int, [_c_void, _c_uint64]),
    "onebit_worker_new": (_c_int, [_c_void, _c_void, _c_size, _c_void, _P(_c_void)]),
    "onebit_worker_free": (None, [_c_void]),
    "onebit_worker_start": (_c_int, [_c_void]),
    "onebit_worker_wait_for_step": (_c_int, [_c_void, _c_double, _P(_c_int64)]),
    "onebit_worker_supply_step": (_c_int, [_c_void, _c_int64, _P(_StepInputs)]),
    "onebit_worker_skipped": (_c_int, [_c_void, _c_int64, _P(_c_int)]),
    "onebit_worker_announce": (_c_int, [_c_void, _c_int64, _c_uint64]),
    "onebit_worker_loss_scale": (_c_int, [_c_void, _P(_c_float)]),
    "onebit_worker_changed_since_announced": (_c_int, [_c_void, _P(_c_int64)]),
    "onebit_worker_end_after": (_c_int, [_c_void, _c_int64]),
    "onebit_worker_close": (_c_int, [_c_void, _c_str]),
    "onebit_worker_join": (_c_int, [_c_void, _c_double, _P(_c_int), _P(_c_int), _P(_c_void)]),
    "onebit_worker_fail_job": (_c_int, [_c_void, _c_str, _c_int64, _P(_c_int)]),
    "onebit_worker_verdict_after_failure": (_c_int, [_c_void, _P(_c_int), _P(_c_void)]),
    "onebit_worker_report_restartable_exit": (_c_int, [_c_void, _c_str, _c_int64]),
    "onebit_worker_buffers": (_c_int, [_c_void, _P(ctypes.c_size_t), _P(ctypes.c_size_t),
                                       _P(_c_int)]),
    "onebit_worker_final_params": (_c_int, [_c_void, _c_void, _c_size]),
    "onebit_worker_state_dict": (_c_int, [_c_void, _P(_c_void)]),
    "onebit_worker_state_slice": (_c_int, [_c_void, _c_int64, _c_int64, _P(_c_void)]),
    "onebit_worker_load_state_dict": (_c_int, [_c_void, _c_void]),
    "onebit_worker_gathered_state_dict": (_c_int, [_c_void, _P(_c_void)]),
    "onebit_worker_rank": (_c_int, [_c_void]),
    "onebit_worker_world_size": (_c_int, [_c_void]),
    "onebit_worker_size": (_c_size, [_c_void]),
    "onebit_worker_param_buffer": (_c_int, [_c_void, _P(ctypes.c_size_t), _P(_c_int)]),
    "onebit_worker_gradient_buffer": (_c_int, [_c_void, _P(ctypes.c_size_t), _P(_c_int)]),
    "onebit_coordinator_start": (_c_int, [_c_str, _c_str, _c_int, _c_int, _c_int, _c_str, _c_str,
                                          _P(_c_void)]),
    "onebit_coordinator_free": (None, [_c_void]),
    "onebit_coordinator_address": (_c_int, [_c_void, _c_int, _P(_c_void)]),
    "onebit_coordinator_poll": (_c_int, [_c_void, _P(_c_void)]),
    "onebit_coordinator_failure_reason": (_c_int, [_c_void, _P(_c_void)]),
    "onebit_coordinator_abandon": (_c_int, [_c_void, _c_str]),
    "onebit_coordinator_recover": (_c_int, [_c_void, _c_str]),
    "onebit_coordinator_close": (_c_int, [_c_void]),
}

# The sections of an onebit_state (c_api.h).
_TENSORS, _ERRORS, _SCALARS, _TRAINER = 0, 1, 2, 3


def library_candidates():
    """Where the core is looked for, in order: $ONEBIT_CORE_LIB, beside this package (the
    wheel's), then each sys.path entry (bazel-bin/python on PYTHONPATH)."""
    given = os.environ.get("ONEBIT_CORE_LIB")
    paths = [given] if given else []
    paths.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME))
    paths += [os.path.join(entry or os.getcwd(), LIBRARY_NAME) for entry in sys.path]
    return paths


def _load():
    tried = []
    for path in library_candidates():
        if not os.path.isfile(path):
            tried.append(path)
            continue
        lib = ctypes.CDLL(path)  # an OSError names a missing shared library
        for name, (result, args) in _SIGNATURES.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = result, args
        version = lib.onebit_abi_version()
        if version != ABI_VERSION:
            raise ImportError(f"{path} has the C interface of version {version}, this package "
                              f"needs {ABI_VERSION}: install onebit's package and core together")
        lib.path = path
        return lib
    raise ImportError(f"onebit's native core {LIBRARY_NAME} is not installed (looked in "
                      f"{', '.join(tried)})")


_lib = None


def lib():
    """The loaded core (loaded at the first call)."""
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def _check(code):
    if code == 0:
        return
    message = (lib().onebit_last_error() or b"").decode(errors="replace")
    if code == _INVALID_ARGUMENT:
        raise ValueError(message)
    if code == _NOT_FOUND:
        raise FileNotFoundError(message)
    if code in (_UNAVAILABLE, _DEADLINE_EXCEEDED):
        raise TimeoutError(message)
    raise RuntimeError(message)


def _taken_string(pointer):
    """A string the core allocated (char**), freed here."""
    if not pointer.value:
        return ""
    try:
        return ctypes.string_at(pointer.value).decode(errors="replace")
    finally:
        lib().onebit_free(pointer)


def _string_call(function, *args):
    out = _c_void()
    _check(function(*args, ctypes.byref(out)))
    return _taken_string(out)


def _b(s):
    return s.encode() if isinstance(s, str) else s


def strict_json(text):
    """A config's text (comments and trailing commas allowed) as strict JSON."""
    return _string_call(lib().onebit_strict_json, _b(text))


def check_config(path):
    """The config file's notices (keys accepted without effect); ValueError for a bad one."""
    return json.loads(_string_call(lib().onebit_check_config, _b(path)))


def config_facts(text):
    """What the package decides its defaults by (c_api.h onebit_config_facts)."""
    return json.loads(_string_call(lib().onebit_config_facts, _b(text)))


def default_max_restarts():
    return lib().onebit_default_max_restarts()


def max_mask_ranges():
    return lib().onebit_max_mask_ranges()


def _floats(t):
    """A contiguous float32 CPU copy of a tensor (or of a sequence)."""
    import torch  # noqa: PLC0415
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    return t.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1)


def _state_from_dict(d):
    """An onebit_state (a handle the caller frees) from a state dict: step, freeze_step,
    rank and world_size (optional), tensors, scalars, errors and trainer."""
    for key in ("step", "freeze_step", "tensors", "scalars", "errors", "trainer"):
        if key not in d:
            raise ValueError(f"the state has no '{key}'")
    ints = {}
    for key in ("step", "freeze_step", "rank", "world_size"):
        value = d.get(key, -1)
        if hasattr(value, "item"):  # a one-element tensor
            value = value.item()
        if isinstance(value, bool) or not float(value).is_integer():
            raise ValueError(f"the state's {key} must be an integer, not {value!r}")
        ints[key] = int(value)
    handle = lib().onebit_state_new(ints["step"], ints["freeze_step"], ints["rank"],
                                    ints["world_size"])
    try:
        for section, key in ((_TENSORS, "tensors"), (_ERRORS, "errors")):
            for name, t in d[key].items():
                try:
                    f = _floats(t)
                except (TypeError, ValueError, RuntimeError) as e:
                    raise ValueError(f"the state's {name} is not a float tensor: {e}") from None
                _check(lib().onebit_state_put_tensor(handle, section, _b(name), f.data_ptr(),
                                                     f.numel()))
        for section, key in ((_SCALARS, "scalars"), (_TRAINER, "trainer")):
            for name, v in d[key].items():
                try:
                    value = float(v)
                except (TypeError, ValueError):
                    raise ValueError(f"the state's {name} is not a number: {v!r}") from None
                _check(lib().onebit_state_put_scalar(handle, section, _b(name), value))
    except BaseException:
        lib().onebit_state_free(handle)
        raise
    return handle


def _state_to_dict(handle):
    """The state dict of an onebit_state (freed here): tensors as float32 CPU tensors."""
    import torch  # noqa: PLC0415
    L = lib()
    try:
        d = {"step": L.onebit_state_step(handle), "freeze_step": L.onebit_state_freeze_step(handle)}
        for section, key in ((_TENSORS, "tensors"), (_ERRORS, "errors")):
            d[key] = {}
            for i in range(L.onebit_state_count(handle, section)):
                t = torch.empty(L.onebit_state_tensor_size(handle, section, i),
                                dtype=torch.float32)
                _check(L.onebit_state_tensor_copy(handle, section, i, t.data_ptr()))
                d[key][L.onebit_state_name(handle, section, i).decode()] = t
        for section, key in ((_SCALARS, "scalars"), (_TRAINER, "trainer")):
            d[key] = {L.onebit_state_name(handle, section, i).decode():
                      L.onebit_state_scalar(handle, section, i)
                      for i in range(L.onebit_state_count(handle, section))}
        return d
    finally:
        L.onebit_state_free(handle)


def _host_view(address, n, owner):
    """A float32 CPU tensor over n floats of the core's memory at `address` (no copy). The
    tensor keeps `owner` alive."""
    import torch  # noqa: PLC0415
    array = (ctypes.c_float * n).from_address(address)
    array._owner = owner  # noqa: SLF001 (the worker outlives the view)
    if n == 0:
        return torch.empty(0, dtype=torch.float32)
    return torch.frombuffer(array, dtype=torch.float32, count=n)


class Worker:
    """onebit's worker on a thread of this process (python/embedded.h EmbeddedWorker)."""

    def __init__(self, config, coordinator, initial, groups, host="127.0.0.1", metrics_port=0,
                 rank=-1, summary_file="", history_csv="", cuda_device=0, member_token_file="",
                 hyper_groups=(), loaded=None, buckets=(), fault="", job_key="", quiet=False,
                 param_dtype="fp32"):
        L = lib()
        self._handle = None
        options = L.onebit_options_new()
        state = None
        try:
            for key, value in (("config", config), ("coordinator", coordinator),
                               ("host", host), ("summary_file", summary_file),
                               ("history_csv", history_csv),
                               ("member_token_file", member_token_file), ("fault", fault),
                               ("job_key", job_key), ("param_dtype", param_dtype)):
                _check(L.onebit_options_set_string(options, _b(key), _b(value)))
            for key, value in (("metrics_port", metrics_port), ("rank", rank),
                               ("cuda_device", cuda_device), ("quiet", int(bool(quiet)))):
                _check(L.onebit_options_set_int(options, _b(key), int(value)))
            for begin, end, lr_scale, weight_decay in hyper_groups:
                _check(L.onebit_options_add_hyper_group(options, begin, end, lr_scale,
                                                        weight_decay))
            for begin, end in buckets:
                _check(L.onebit_options_add_bucket(options, begin, end))
            for boundary in groups:
                _check(L.onebit_options_add_group_boundary(options, int(boundary)))
            if loaded is not None:
                state = _state_from_dict(loaded)
            flat = _floats(initial)
            self._size = flat.numel()
            handle = _c_void()
            _check(L.onebit_worker_new(options, flat.data_ptr(), flat.numel(), state,
                                       ctypes.byref(handle)))
            self._handle = handle
        finally:
            L.onebit_options_free(options)
            if state is not None:
                L.onebit_state_free(state)

    def __del__(self):
        if getattr(self, "_handle", None) is not None and _lib is not None:
            _lib.onebit_worker_free(self._handle)
            self._handle = None

    def start(self):
        _check(lib().onebit_worker_start(self._handle))

    def wait_for_step(self, timeout_s):
        step = _c_int64()
        _check(lib().onebit_worker_wait_for_step(self._handle, timeout_s, ctypes.byref(step)))
        return step.value

    def supply(self, step, loss=None, lr=None, max_grad_norm=None, betas=None,
               weight_decays=None, grad_scale=None):
        """Step `step`'s gradient is in the buffer; the others are what the script set for
        it (None: not set, the job's schedule or fixed value applies)."""
        inputs = _StepInputs()
        for bit, name, value in ((_STEP_LOSS, "loss", loss), (_STEP_LR, "lr", lr),
                                 (_STEP_MAX_GRAD_NORM, "max_grad_norm", max_grad_norm),
                                 (_STEP_GRAD_SCALE, "grad_scale", grad_scale)):
            if value is not None:
                setattr(inputs, name, float(value))
                inputs.set |= bit
        if betas is not None:
            if len(betas) != 2:
                raise ValueError(f"betas must be a pair (beta1, beta2), got {tuple(betas)}")
            inputs.set |= _STEP_BETAS
            inputs.beta1, inputs.beta2 = (float(b) for b in betas)
        if weight_decays is not None:
            decays = (_c_double * len(weight_decays))(*(float(d) for d in weight_decays))
            inputs.set |= _STEP_WEIGHT_DECAYS
            inputs.weight_decays = ctypes.cast(decays, _P(_c_double))
            inputs.n_weight_decays = len(weight_decays)
        _check(lib().onebit_worker_supply_step(self._handle, step, ctypes.byref(inputs)))

    def skipped(self, step):
        """Whether step `step` was skipped (an overflow on some worker)."""
        out = _c_int()
        _check(lib().onebit_worker_skipped(self._handle, step, ctypes.byref(out)))
        return bool(out.value)

    def close(self, why):
        _check(lib().onebit_worker_close(self._handle, _b(why)))

    def fail_job(self, why, step):
        code = _c_int()
        _check(lib().onebit_worker_fail_job(self._handle, _b(why), step, ctypes.byref(code)))
        return code.value

    def end_after(self, step):
        _check(lib().onebit_worker_end_after(self._handle, step))

    def announce(self, step, bucket):
        _check(lib().onebit_worker_announce(self._handle, step, bucket))

    def changed_since_announced(self):
        first = _c_int64()
        _check(lib().onebit_worker_changed_since_announced(self._handle, ctypes.byref(first)))
        return first.value

    def loss_scale(self):
        scale = _c_float()
        _check(lib().onebit_worker_loss_scale(self._handle, ctypes.byref(scale)))
        return scale.value

    def join(self, timeout_s):
        """None while the worker runs, else (exit code, status text)."""
        done, code, message = _c_int(), _c_int(), _c_void()
        _check(lib().onebit_worker_join(self._handle, timeout_s, ctypes.byref(done),
                                        ctypes.byref(code), ctypes.byref(message)))
        text = _taken_string(message)
        return (code.value, text) if done.value else None

    def verdict_after_failure(self):
        """(75 restart, 78 failed, else 1; the coordinator's reason)."""
        code, reason = _c_int(), _c_void()
        _check(lib().onebit_worker_verdict_after_failure(self._handle, ctypes.byref(code),
                                                         ctypes.byref(reason)))
        return code.value, _taken_string(reason)

    def report_restartable_exit(self, why, step):
        _check(lib().onebit_worker_report_restartable_exit(self._handle, _b(why), step))

    def _buffers(self):
        params, gradient, cuda = ctypes.c_size_t(), ctypes.c_size_t(), _c_int()
        _check(lib().onebit_worker_buffers(self._handle, ctypes.byref(params),
                                           ctypes.byref(gradient), ctypes.byref(cuda)))
        return params.value, gradient.value, bool(cuda.value)

    @property
    def cuda(self):
        return self._buffers()[2]

    def params(self):
        """The optimizer's parameters as a float32 CPU tensor over the core's memory (none
        where the worker keeps low-precision parameters: param_buffer())."""
        address = self._buffers()[0]
        if not address:
            raise RuntimeError("the worker keeps low-precision parameters, no float32 ones "
                               "(param_buffer)")
        return _host_view(address, self._size, self)

    def gradient(self):
        """This worker's gradient buffer, likewise."""
        return _host_view(self._buffers()[1], self._size, self)

    def params_address(self):
        return self._buffers()[0]

    def param_buffer(self):
        """(address, dtype) of the model's parameters as the worker keeps them: dtype
        "bf16" or "fp16" for a sharded worker's low-precision parameters (padded past n),
        else "fp32" and params_address()."""
        address, dtype = ctypes.c_size_t(), _c_int()
        _check(lib().onebit_worker_param_buffer(self._handle, ctypes.byref(address),
                                                ctypes.byref(dtype)))
        return address.value, {0: "fp32", 1: "bf16", 2: "fp16"}[dtype.value]

    def gradient_address(self):
        return self._buffers()[1]

    def gradient_buffer(self):
        """(address, dtype) of the gradient buffer the .grad tensors view: dtype "bf16" for
        a bf16 model's in a sharded job (then gradient() has none), else "fp32" and
        gradient_address()."""
        address, dtype = ctypes.c_size_t(), _c_int()
        _check(lib().onebit_worker_gradient_buffer(self._handle, ctypes.byref(address),
                                                   ctypes.byref(dtype)))
        return address.value, {0: "fp32", 1: "bf16", 2: "fp16"}[dtype.value]

    def final_params(self):
        """A copy of the parameters at the end of the job."""
        import torch  # noqa: PLC0415
        out = torch.empty(self._size, dtype=torch.float32)
        _check(lib().onebit_worker_final_params(self._handle, out.data_ptr(), self._size))
        return out

    def state_dict(self):
        handle = _c_void()
        _check(lib().onebit_worker_state_dict(self._handle, ctypes.byref(handle)))
        return _state_to_dict(handle)

    def state_slice(self, begin, end):
        handle = _c_void()
        _check(lib().onebit_worker_state_slice(self._handle, begin, end, ctypes.byref(handle)))
        d = _state_to_dict(handle)
        return {"step": d["step"], "tensors": d["tensors"], "scalars": d["scalars"]}

    def gathered_state_dict(self):
        """The whole state; a sharded worker's gathered inside its node (a collective)."""
        handle = _c_void()
        _check(lib().onebit_worker_gathered_state_dict(self._handle, ctypes.byref(handle)))
        return _state_to_dict(handle)

    def load_state_dict(self, state):
        handle = _state_from_dict(state)
        try:
            _check(lib().onebit_worker_load_state_dict(self._handle, handle))
        finally:
            lib().onebit_state_free(handle)

    @property
    def rank(self):
        return lib().onebit_worker_rank(self._handle)

    @property
    def world_size(self):
        return lib().onebit_worker_world_size(self._handle)

    @property
    def size(self):
        return self._size


class Coordinator:
    """The job's coordinator in this process (python/embedded.h EmbeddedCoordinator)."""

    def __init__(self, config, host="127.0.0.1", port=0, rest_port=0, metrics_port=0,
                 code_digest="", job_key=""):
        self._handle = None
        handle = _c_void()
        _check(lib().onebit_coordinator_start(_b(config), _b(host), port, rest_port,
                                              metrics_port, _b(code_digest), _b(job_key),
                                              ctypes.byref(handle)))
        self._handle = handle

    def __del__(self):
        if getattr(self, "_handle", None) is not None and _lib is not None:
            _lib.onebit_coordinator_free(self._handle)
            self._handle = None

    def _address(self, which):
        return _string_call(lib().onebit_coordinator_address, self._handle, which)

    @property
    def address(self):
        return self._address(0)

    @property
    def rest_address(self):
        return self._address(1)

    @property
    def metrics_address(self):
        return self._address(2)

    def poll(self):
        return _string_call(lib().onebit_coordinator_poll, self._handle)

    @property
    def failure_reason(self):
        return _string_call(lib().onebit_coordinator_failure_reason, self._handle)

    def abandon(self, reason):
        _check(lib().onebit_coordinator_abandon(self._handle, _b(reason)))

    def recover(self, reason):
        _check(lib().onebit_coordinator_recover(self._handle, _b(reason)))

    def close(self):
        _check(lib().onebit_coordinator_close(self._handle))
