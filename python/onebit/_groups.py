"""The param groups' hyper-parameters, which the job steps with: what each group's lr,
weight_decay and exp_avg_mask make of the job when the optimizer is built (the worker's
hyper groups, the config's momentum mask ranges), and at each step what a schedule moved in
the groups since (_Schedule): each group's lr and weight_decay and the betas, where eps may
not move. The groups themselves are torch.optim's param_groups, the optimizer's."""

import torch

from onebit._core import _core


def _hyper_groups(param_groups, job):
    """Each param group's (begin, end, lr / the job's lr, weight_decay) in the flat
    buffer, or [] for a single group with the job's lr and decay. A group's lr is a fixed
    multiple of the job's, so the config's scheduler moves every group alike; betas and
    eps are the job's for all (the momentum is one flat exchange). Several groups are
    always the worker's groups, alike or not, so that a weight-decay schedule may move
    each on its own (groups with the job's values change no bit). `job`: the job's lr,
    betas, eps and weight_decay (the optimizer's torch.optim defaults)."""
    groups, begin, same = [], 0, True
    for i, group in enumerate(param_groups):
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


def _masked_ranges(param_groups, flat):
    """The [begin, end) runs of the flat buffer that the param groups' exp_avg_mask
    (DeepSpeed's key: 0 where the momentum is masked, 1 elsewhere; each of the group's
    parameters takes it as exp_avg *= mask does, broadcast) masks, in order, adjacent
    runs joined: the job config's onebit.momentum_mask.ranges, so every worker's mask is
    checked against the others' at registration. ValueError for a mask that does not
    fit a parameter, holds another value, or has too many runs for a config. `flat`: the
    parameters (a _FlatParams), in param_groups' order."""
    runs, i = [], 0
    for g, group in enumerate(param_groups):
        mask = group.get("exp_avg_mask")
        count = len(group["params"])
        if mask is not None:
            mask = torch.as_tensor(mask).detach().cpu().double()
            for j in range(i, i + count):
                p = flat.params[j]
                try:
                    values = torch.broadcast_to(mask, p.shape).reshape(-1)
                except RuntimeError:
                    raise ValueError(
                        f"param group {g}'s exp_avg_mask has shape {tuple(mask.shape)}, "
                        f"which does not fit {flat.what(j)} (exp_avg *= mask, "
                        "broadcast)") from None
                bad = torch.nonzero((values != 0) & (values != 1)).reshape(-1)
                if bad.numel():
                    first = int(bad[0])
                    raise ValueError(
                        f"param group {g}'s exp_avg_mask holds {float(values[first])} for "
                        f"element {first} of {flat.what(j)}: a momentum mask is 0 (masked) "
                        "or 1")
                edge = torch.zeros(1, dtype=torch.bool)
                zero = torch.cat([edge, values == 0, edge])
                edges = torch.nonzero(zero[1:] != zero[:-1]).reshape(-1) + flat.offsets[j]
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


class _Schedule:
    """What a schedule may move in the param groups between steps, against their values
    when the optimizer was built: each group's lr (all by one factor: a torch
    lr_scheduler), the betas (every group alike: OneCycleLR's momentum cycling) and each
    group's weight_decay; not eps. Each read is None where nothing moved: the job's own
    values, and its config's scheduler, stand."""

    def __init__(self, param_groups, defaults):
        """param_groups as built, with torch.optim's `defaults` (the job's lr and betas)."""
        # A torch lr_scheduler writes group["lr"]; each step hands the job's lr it implies
        # to the C++ side (lr()).
        self._job_lr = float(defaults["lr"])
        self._initial_lrs = [float(g["lr"]) for g in param_groups]
        # What a schedule may not move (eps), and what it may: the betas (all groups alike)
        # and each group's weight_decay, as built.
        self._initial_betas = tuple(float(b) for b in defaults["betas"])
        self._fixed_eps = [float(g["eps"]) for g in param_groups]
        self._initial_decays = [float(g["weight_decay"]) for g in param_groups]

    def lr(self, param_groups, config_scheduler):
        """The job's lr for this step when the param groups' lrs moved (a torch
        lr_scheduler), else None (the config's lr and scheduler). Groups keep their ratio
        to the job's lr (fixed at construction), so they must all move by one factor.
        `config_scheduler`: the job config has a scheduler of its own."""
        lrs = [float(g["lr"]) for g in param_groups]
        if lrs == self._initial_lrs:
            return None
        if config_scheduler:
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

    def check_fixed(self, param_groups):
        """eps is fixed when the optimizer is built: a change in param_groups is a
        ValueError, not ignored."""
        for i, (group, built) in enumerate(zip(param_groups, self._fixed_eps)):
            if float(group["eps"]) != built:
                raise ValueError(
                    f"param group {i}'s eps went from {built} to {group['eps']}: onebit fixes "
                    "eps when the optimizer is built (lr, betas and weight_decay may be "
                    "scheduled); build it with the value you want")

    def weight_decays(self, param_groups):
        """Each group's weight_decay for this step when a schedule (or load_state_dict)
        moved one from its value at construction, else None (the built ones). Each group
        has its own in the worker (_hyper_groups), so each may move on its own."""
        decays = [float(g["weight_decay"]) for g in param_groups]
        if decays == self._initial_decays:
            return None
        for i, decay in enumerate(decays):
            if not decay >= 0 or decay == float("inf"):
                raise ValueError(f"param group {i}'s weight_decay is {decay}: it must be >= 0 "
                                 "and finite")
        return decays

    def betas(self, param_groups, config_cycles_betas):
        """The betas for this step when a schedule moved them in param_groups (OneCycleLR's
        momentum cycling), else None (the config's betas and scheduler). Every group must
        have the same (the momentum is one flat exchange). `config_cycles_betas`: the job
        config's scheduler cycles them itself."""
        betas = [tuple(float(b) for b in g["betas"]) for g in param_groups]
        if all(b == self._initial_betas for b in betas):
            return None
        if any(b != betas[0] for b in betas):
            raise ValueError(f"param_groups' betas differ ({betas}): every group steps with "
                             "the same betas (the momentum is one flat exchange)")
        if config_cycles_betas:
            raise ValueError("param_groups' betas changed (a torch scheduler's momentum "
                             "cycling?) while the job config's scheduler cycles them: use one "
                             "of the two")
        if not all(0 <= b < 1 for b in betas[0]):
            raise ValueError(f"param_groups' betas must be in [0, 1), got {betas[0]}")
        return betas[0]
