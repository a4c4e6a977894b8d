"""Owner placement in state dicts: each owned matrix is one item, held by its owner (the full tensor
under its usual name), absent elsewhere, so DCP saves it once and loads it into any owner, world size
or placement (an FSDP2 Shard(0) parameter too), and back. Module hooks (state_dict_hook,
load_pre_hook, load_post_hook, registered per unit by placement.py) for model.state_dict(); for
Muon.state_dict(), drop_elsewhere_state."""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from .. import layout_of


def drop_elsewhere_state(opt: Any, state_dict: dict) -> dict:
    """Muon.state_dict(): the state tensors of matrices owned by other ranks left out (their "step"
    kept), so a checkpoint holds each owned matrix's state once, from its owner (DCP saves and loads
    it as one item, into any owner or a Shard(0) layout)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    keys = [k for g in state_dict["param_groups"] for k in g["params"]]
    for p, k in zip(params, keys):
        entry = state_dict["state"].get(k)
        if entry is not None and not layout_of(p).held_here:
            state_dict["state"][k] = {key: v for key, v in entry.items() if key == "step"}
    return state_dict


def state_dict_hook(u: Any) -> Callable:
    def hook(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
        for o in u.owned:  # owner only: one item in a checkpoint, loadable anywhere
            if not o.is_owner:
                state_dict.pop(prefix + o.attr, None)
    return hook


def load_pre_hook(u: Any) -> Callable:
    def hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
             error_msgs) -> None:
        u.absent_keys = [prefix + o.attr for o in u.owned if not o.is_owner]
        for o in u.owned:
            key = prefix + o.attr
            value = state_dict.get(key)
            if value is not None and type(value).__name__ == "DTensor":
                value = value.full_tensor()  # collective: every rank holds the key
                state_dict[key] = value
            if value is not None and not o.is_owner:
                state_dict.pop(key)  # the others hold no data
    return hook


def load_post_hook(u: Any) -> Callable:
    def hook(module: nn.Module, incompatible: Any) -> None:
        for k in u.absent_keys:  # exactly this module's keys held elsewhere (the pre-hook's)
            if k in incompatible.missing_keys:
                incompatible.missing_keys.remove(k)
    return hook
