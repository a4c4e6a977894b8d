"""Parameters replaced under meshmuon.torch.Muon after it was built: Accelerate's FSDP2 `prepare()`
rewrites every param_group["params"] in place, each plain parameter replaced by its sharded DTensor.
Muon notices it by the identity of the tensors (swapped(), at the next step, state_dict or
load_state_dict) and rebuilds its engine for the new tensors, the state carried by position
(carry_map()); never a step of the tensors it was built from."""
from __future__ import annotations

import torch

from . import _group_checks
from ._inventory import param_name
from ._layout import layout_of


def swapped(built: list[list[torch.Tensor]], param_groups: list[dict]) -> bool:
    """True when the groups no longer hold exactly the tensors the engine was built from (a list of
    identity comparisons: cheap enough for every step)."""
    if len(built) != len(param_groups):
        return True
    for old, group in zip(built, param_groups):
        new = group["params"]
        if len(new) != len(old) or any(a is not b for a, b in zip(new, old)):
            return True
    return False


def same_structure(built: list[list[torch.Tensor]], param_groups: list[dict]) -> bool:
    """As many groups, each with as many parameters, as the engine was built from (tensors may differ)."""
    return len(built) == len(param_groups) and all(len(o) == len(g["params"]) for o, g in zip(built, param_groups))


def global_shape(p: torch.Tensor) -> tuple[int, ...]:
    """The parameter's global shape (the layout model's)."""
    return layout_of(p).shape


def carry_map(built: list[list[torch.Tensor]], param_groups: list[dict],
              expert_default: bool) -> dict[int, int]:
    """{id(new tensor): flat index of the tensor it replaces} when every group holds as many
    tensors as when the engine was built, each of the same global shape as the one it replaces
    (and each passing the checks add_param_group makes). Otherwise a ValueError naming the group
    and the parameter; it depends on global shapes only, so every rank raises the same error,
    before anything changes."""
    swap = "were replaced after the optimizer was built (e.g. by Accelerate's FSDP2 prepare())"
    if len(built) != len(param_groups):
        raise ValueError(f"[torch] the optimizer has {len(param_groups)} param groups but was built "
                         f"with {len(built)}; add groups with add_param_group, never by editing "
                         f"param_groups")
    out, flat = {}, 0
    for g, (old, group) in enumerate(zip(built, param_groups)):
        new = group["params"]
        if len(new) != len(old):
            raise ValueError(f"[torch] param group {g} holds {len(new)} parameters but {len(old)} "
                             f"when the optimizer was built: its parameters {swap} with others "
                             f"that cannot be matched by position; build the optimizer on the "
                             f"model as it will be trained (after sharding it)")
        for j, (a, b) in enumerate(zip(new, old)):
            name = param_name(group, g, j)
            if not isinstance(a, torch.Tensor) or global_shape(a) != global_shape(b):
                got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
                raise ValueError(f"[torch] param group {g}, parameter {j} '{name}': the parameters "
                                 f"{swap}, but this one has global shape {got} where the original "
                                 f"had {global_shape(b)}; the new parameters must match the old "
                                 f"ones by position and global shape: build the optimizer on the "
                                 f"model as it will be trained (after sharding it)")
            out[id(a)] = flat + j
        flat += len(old)
    # the checks of add_param_group on the new tensors (dtype, device, one group each, Muon shapes)
    for g, group in enumerate(param_groups):
        params = [(n, p) for n, p in zip(group["param_names"], group["params"])] \
            if group.get("param_names") else list(group["params"])
        _group_checks.check_params(dict(group, params=params), g, group.get("algorithm", "muon"),
                                   param_groups[:g], expert_default)
    return out


def remap_keys(mapping: dict, built: list[list[torch.Tensor]], param_groups: list[dict]) -> dict:
    """`mapping` (qk_layout) with every key that is one of the old tensors replaced by the new
    tensor at its position; names and modules are resolved again at the rebuild."""
    by_id = {id(b): a for old, group in zip(built, param_groups)
             for a, b in zip(group["params"], old)}
    return {by_id.get(id(k), k) if isinstance(k, torch.Tensor) else k: v for k, v in mapping.items()}
