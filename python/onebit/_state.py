"""The optimizer's state in torch.optim's layout: state_dict()'s dict made of the worker's
flat state (_torch_layout), a saved one made flat again for the worker (_flat_state) and
checked before a fresh job starts after it (_start_state), and opt.state, each
parameter's state read from the worker (_State)."""

import collections.abc
import weakref

import torch

from onebit.env import rank, world_size


def _torch_layout(raw, rank_, world, flat, param_groups):
    """state_dict() of the worker's state `raw` (or _unjoined_state's), saved by rank `rank_`
    of `world` workers: each of `flat`'s parameters (a _FlatParams) its slice, the groups
    of param_groups their indices. A sharded worker's `raw` holds its state range only
    (scalars state_begin and state_end): the parameters wholly inside it get entries, and
    the parts of those that straddle its ends go into onebit's "shard" record
    (docs/pytorch.md, "Sharded optimizer state")."""
    step = int(raw["step"])
    scalars = dict(raw["scalars"])
    lo, hi, shard = 0, flat.n, None
    if "state_begin" in scalars:  # a sharded worker's own range (onebit.exchange.shard_state)
        lo, hi = int(scalars.pop("state_begin")), int(scalars.pop("state_end"))
        shard = {"begin": lo, "end": hi, "names": sorted(
            name for name in raw["tensors"] if name != "params"), "partial": {}}
    state = {}
    if step >= 0:
        for i, p in enumerate(flat.params):
            begin, end = flat.offsets[i], flat.offsets[i + 1]
            inside = lo <= begin and end <= hi
            a, b = max(begin, lo), min(end, hi)
            if not inside and a >= b:
                continue  # another worker's
            tensors = {name: t[a - lo:b - lo].clone().to(flat.device)
                       for name, t in raw["tensors"].items() if name != "params"}
            if inside:
                entry = {"step": torch.tensor(float(step))}
                entry.update((name, t.view(p.shape)) for name, t in tensors.items())
                state[i] = entry
            else:
                shard["partial"][i] = {"begin": a - begin, "end": b - begin, "state": tensors}
    groups, first = [], 0
    for g in param_groups:
        d = {k: v for k, v in g.items() if k != "params"}
        d["params"] = list(range(first, first + len(g["params"])))
        first += len(g["params"])
        groups.append(d)
    groups[0]["onebit"] = {
        "step": step, "freeze_step": int(raw["freeze_step"]), "rank": rank_,
        "world_size": world, "errors": raw["errors"], "scalars": scalars,
        "trainer": raw["trainer"]}
    if shard is not None:
        groups[0]["onebit"]["shard"] = shard
    return {"state": state, "param_groups": groups}


def _state_range(raw, n):
    """The elements [begin, end) of the model's n that the flat state `raw`'s tensors hold:
    a sharded worker's own range, else all."""
    scalars = raw.get("scalars") or {}
    if "state_begin" in scalars:
        return int(scalars["state_begin"]), int(scalars["state_end"])
    return 0, n


def _unjoined_state(loaded, n, states):
    """state_dict()'s raw state before the worker joined: the `loaded` one, else step 0's
    zeros (n elements) of exp_avg, exp_avg_sq and `states`, the type's own: the states
    every job of the type has."""
    if loaded is not None:
        return loaded, loaded.get("rank", -1), loaded.get("world_size", -1)
    tensors = {name: torch.zeros(n) for name in ("exp_avg", "exp_avg_sq") + states}
    return ({"step": 0, "freeze_step": -1, "tensors": tensors, "errors": {}, "scalars": {},
             "trainer": {}}, rank(), world_size())


def _flat_state(state_dict, param_groups, flat):
    """A state_dict() as the core takes it, with its param groups: one flat tensor per state
    over all of `flat`'s parameters, in their order, where param_groups (the optimizer's)
    say which saved index is which. The parameters themselves are the model's (as with
    torch.optim): their tensor is added where the worker joins."""
    if not isinstance(state_dict, dict):
        raise ValueError(f"a state_dict is a dict, not {type(state_dict).__name__}")
    if "state" not in state_dict or "param_groups" not in state_dict:
        raise ValueError("not an optimizer's state_dict() (no 'state' and 'param_groups')")
    groups = state_dict["param_groups"]
    if len(groups) != len(param_groups):
        raise ValueError(f"the state has {len(groups)} param groups, the optimizer "
                         f"{len(param_groups)}")
    extras = groups[0].get("onebit") if groups else None
    if not isinstance(extras, dict):
        raise ValueError("the state_dict has no onebit part (param_groups[0]['onebit']), so "
                         "it is not a onebit optimizer's; another optimizer's state "
                         "(torch.optim.Adam's) cannot be loaded: start the job from the "
                         "model's parameters alone")
    entries = [None] * len(flat.params)
    keys_of = [None] * len(flat.params)  # each parameter's index in the saved state
    saved_state = state_dict["state"]
    for g, (live, saved) in enumerate(zip(param_groups, groups)):
        keys = saved.get("params", [])
        if len(keys) != len(live["params"]):
            raise ValueError(f"the state's param group {g} has {len(keys)} parameters, "
                             f"the optimizer's {len(live['params'])}")
        for key, p in zip(keys, live["params"]):
            entries[flat.index_of[id(p)]] = saved_state.get(key)
            keys_of[flat.index_of[id(p)]] = key
    shard = extras.get("shard")
    lo, hi = 0, flat.n
    if shard is not None:
        lo, hi = int(shard["begin"]), int(shard["end"])
        if not 0 <= lo <= hi <= flat.n:
            raise ValueError(f"the state's shard [{lo}, {hi}) is not within this model's "
                             f"{flat.n} elements")
    tensors = {}
    step = int(extras.get("step", 0))
    if step >= 1:  # (step 0's zeros load nothing)
        names = None if shard is None else sorted(shard.get("names", []))
        pieces = []  # {name: tensor} of each parameter or part, in element order over [lo, hi)
        for i, entry in enumerate(entries):
            begin, end = flat.offsets[i], flat.offsets[i + 1]
            a, b = max(begin, lo), min(end, hi)
            if lo <= begin and end <= hi:
                if not isinstance(entry, dict):
                    raise ValueError(f"the state has none for {flat.what(i)}")
                got = {k: v for k, v in entry.items() if k != "step"}
                size = end - begin
            elif a < b:  # a part of a parameter that straddles a sharded state's end
                part = shard.get("partial", {}).get(keys_of[i])
                if not isinstance(part, dict) or (part.get("begin"), part.get("end")) != (
                        a - begin, b - begin):
                    raise ValueError(f"the state's shard [{lo}, {hi}) has no part "
                                     f"[{a - begin}, {b - begin}) of {flat.what(i)}")
                got, size = part.get("state", {}), b - a
            else:
                continue
            own = sorted(got)
            if names is None:
                names = own
            elif own != names:
                raise ValueError(f"the state of {flat.what(i)} has {', '.join(own)}; "
                                 f"the others' {', '.join(names)}")
            for name in own:
                t = torch.as_tensor(got[name])
                if t.numel() != size:
                    raise ValueError(f"the state's {name} of {flat.what(i)} has "
                                     f"{t.numel()} elements, not {size}")
            pieces.append(got)
        for name in names or ():
            tensors[name] = torch.cat([torch.as_tensor(got[name]).detach().reshape(-1).to(
                device="cpu", dtype=torch.float32) for got in pieces]) if pieces else \
                torch.zeros(0)
    raw = {k: extras.get(k) for k in ("step", "freeze_step", "errors", "scalars", "trainer",
                                      "rank", "world_size") if k in extras}
    raw["tensors"] = tensors
    if shard is not None:  # the worker's words for its range (python/optimizer_state.h)
        raw["scalars"] = dict(raw.get("scalars") or {}, state_begin=lo, state_end=hi)
    if not raw.get("errors"):  # none saved (dcp.load into a template has none): reset
        raw["errors"], raw["rank"] = {}, -1
    for key in ("step", "freeze_step", "tensors", "scalars", "errors", "trainer"):
        if key not in raw:
            raise ValueError(f"the state has no {key!r}")
    return raw, groups


def _start_state(state, groups, param_groups, n):
    """load_state_dict() before the worker joined: _flat_state's `state` and `groups`
    checked against the model's n elements, the saved groups' hyper-parameters put back
    into param_groups, as torch.optim's load_state_dict does; the state the job is to start
    after, or None for one of step 0 (saved before any step: no moments)."""
    if int(state["step"]) < 1:
        if state["tensors"]:
            raise ValueError(f"the state is of step {state['step']}: nothing to start after")
    else:
        lo, hi = _state_range(state, n)
        for name, t in state["tensors"].items():
            size = torch.as_tensor(t).numel()
            if size != hi - lo:
                what = f"its shard [{lo}, {hi})" if hi - lo != n else f"this model {n}"
                raise ValueError(f"the state's {name} has {size} elements, {what}")
    if groups is not None:
        if len(groups) != len(param_groups):
            raise ValueError(f"the state has {len(groups)} param groups, the optimizer "
                             f"{len(param_groups)}")
        # As torch.optim's: every hyper-parameter of the groups (an lr, betas or decay a
        # schedule moved, a scheduler's own keys) comes back; eps too, which step()
        # then checks against the job's.
        for group, saved in zip(param_groups, groups):
            group.update((key, value) for key, value in saved.items()
                         if key not in ("params", "onebit"))
    return state if int(state["step"]) >= 1 else None


class _State(collections.abc.Mapping):
    """opt.state: each parameter's optimizer state, as torch.optim.Adam's is read ("step",
    "exp_avg", "exp_avg_sq", and a type's own buffers by their names in state_dict()),
    taken from the worker between two steps or after the last one. Each read is a COPY on
    the parameter's device: changing it changes nothing (load_state_dict sets state).
    Empty before the first step, as torch's; a tensor that is not a parameter of the
    optimizer is a KeyError. A sharded worker (onebit.exchange.shard_state) holds the
    parameters wholly inside its state range only: it iterates over those, and any other
    is a KeyError naming the range (state_dict(full=True) gathers the whole state)."""

    def __init__(self, opt):
        self._opt = weakref.ref(opt)

    def _now(self):
        """The worker's step and the elements whose state it holds ((0, n) unsharded), or
        None before the worker joined."""
        opt = self._opt()
        if opt is None or opt._worker is None:
            return None
        now = opt._worker.state_slice(0, 0)
        return now["step"], _state_range(now, opt._flat.n)

    def _held(self, lo, hi):
        opt = self._opt()
        return [p for i, p in enumerate(opt._flat.params)
                if lo <= opt._flat.offsets[i] and opt._flat.offsets[i + 1] <= hi]

    def __getitem__(self, p):
        opt = self._opt()
        index = None if opt is None else opt._flat.index_of.get(id(p))
        if index is None or opt._flat.params[index] is not p:
            raise KeyError("not a parameter of this optimizer")
        if opt._worker is None:
            return {}
        begin, end = opt._flat.offsets[index], opt._flat.offsets[index + 1]
        try:
            state = opt._worker.state_slice(begin, end)
        except ValueError as e:
            if "is not held here" not in str(e):
                raise
            raise KeyError(f"the state of {opt._flat.what(index)} is not on this rank: {e}; "
                           "opt.state_dict(full=True) gathers the whole state (every rank "
                           "of the node calls it at the same step)") from None
        if state["step"] < 1:
            return {}
        lo, hi = _state_range(state, opt._flat.n)
        if not (lo <= begin and end <= hi) and begin < end:
            raise KeyError(f"the state of {opt._flat.what(index)} is only in part on this "
                           f"rank, which holds elements [{lo}, {hi}) (sharded state); "
                           "opt.state_dict(full=True) gathers the whole state (every rank of "
                           "the node calls it at the same step)")
        out = {"step": torch.tensor(float(state["step"]))}
        for name, values in state["tensors"].items():
            out[name] = values.view(p.shape).to(opt._flat.device)
        return out

    def __iter__(self):
        now = self._now()
        return iter(self._held(*now[1]) if now is not None and now[0] >= 1 else ())

    def __len__(self):
        now = self._now()
        return len(self._held(*now[1])) if now is not None and now[0] >= 1 else 0

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
