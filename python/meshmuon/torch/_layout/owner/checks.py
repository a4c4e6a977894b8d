"""Checks of owner placement's misuses (meshmuon.torch.own, placement.py), each a ValueError / TypeError
naming the parameters and what to do, raised on every rank before any collective can mismatch: the
checks read only the model's structure, which is the same on every rank.

- own()'s arguments: `mesh` a DeviceMesh (or None); the matrices to own not already DTensors of
  fully_shard (own() comes first).
- An owned matrix also handed to fully_shard (its ignored_params forgotten): fully_shard replaces the
  module's parameter by its DTensor, whose all-gather would then mismatch (the ranks hold different
  shapes of it). Caught at the model's first forward, by a global forward pre-hook (the only one that
  runs before FSDP2's own pre-hook, which fully_shard prepends), at each later forward of the owning
  module, and by Muon() when it is handed such a DTensor.
"""
from __future__ import annotations

import fnmatch
import weakref
from typing import Any, Callable, Iterable

from torch import nn

from ..dtensor import is_dtensor

FIX = "pass ignored_params=placement.params to every fully_shard call"


def _listed(names: list[str]) -> str:
    return f"{names[:8]}{f' ... ({len(names)} in all)' if len(names) > 8 else ''}"


def check_mesh(mesh: Any) -> None:
    """own(mesh=): None or a torch DeviceMesh."""
    if mesh is None:
        return
    from torch.distributed.device_mesh import DeviceMesh
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"[torch] own(mesh=...) takes the torch DeviceMesh the rest of the model is "
                        f"sharded on (init_device_mesh('cpu', (world,)) for FSDP, (replicas, shards) for "
                        f"HSDP) or None (the whole world), got a {type(mesh).__name__}")


def check_not_sharded(model: nn.Module, kinds: dict[str, str], select: Any) -> None:
    """own() after fully_shard: the matrices it would own (Muon 2-D weights, as `select` picks them)
    that fully_shard has already made DTensors. Other DTensors (tensor parallel) are left to the
    eligibility rule."""
    from torch.distributed.fsdp import FSDPModule
    fsdp = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    if not fsdp:
        return

    def under_fsdp(name: str) -> bool:
        return any(f == "" or name.startswith(f + ".") for f in fsdp)

    sharded = [(n, p) for n, p in model.named_parameters()
               if kinds.get(n) == "muon" and p.ndim == 2 and is_dtensor(p) and under_fsdp(n)]
    if isinstance(select, str):
        picked = [n for n, _ in sharded]
    elif callable(select):
        picked = [n for n, p in sharded if select(n, p)]
    elif isinstance(select, Iterable):
        patterns = list(select)
        picked = [n for n, _ in sharded if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
    else:
        return  # own()'s TypeError for select
    if picked:
        raise ValueError(f"[torch] own(): the matrices to own {_listed(picked)} are already sharded by "
                         f"fully_shard (DTensors); call own() before fully_shard, then {FIX}")


def replaced(owned: Iterable[Any]) -> list[tuple[Any, Any]]:
    """(owned record, what its module holds now) for each owned matrix whose module's parameter is
    no longer the owned one."""
    out = []
    for o in owned:
        now = o.module._parameters.get(o.attr)
        if now is not o.param:
            out.append((o, now))
    return out


def also_sharded_error(pairs: list[tuple[Any, Any]], where: str) -> ValueError:
    names = [o.name for o, _ in pairs]
    if all(is_dtensor(now) for _, now in pairs):
        why = "also sharded by fully_shard (their parameters are now its DTensors)"
    else:
        why = ("also sharded by fully_shard or replaced after own() (their modules no longer hold the "
               "owned parameters)")
    return ValueError(f"[torch] {where}: the owned matrices {_listed(names)} (meshmuon.torch.own) are {why}; "
                      f"an owned matrix lives whole on its owner and must not be sharded too: {FIX}")


def check_forward(owned: list[Any]) -> None:
    pairs = replaced(owned)
    if pairs:
        raise also_sharded_error(pairs, "forward")


def check_at_first_forward(model: nn.Module, placement: Any) -> Callable[[], None]:
    """A global forward pre-hook: at the first forward of `model` (or of any of its modules), before
    any module hook (FSDP2's unshard included), checks that every owned matrix is still its module's
    parameter; removed once the check has passed. Holds the placement weakly."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    modules = {id(m) for m in model.modules()}
    ref = weakref.ref(placement)
    handle = None

    def hook(module: nn.Module, args: Any) -> None:
        if id(module) not in modules:
            return
        p = ref()
        if p is not None:
            check_forward(p.owned)  # raises: the hook stays, the next forward raises again
        handle.remove()

    handle = register_module_forward_pre_hook(hook)
    return handle.remove


def check_optimizer_params(params: list[Any], where: str, owned: Iterable[Any]) -> None:
    """Muon(): none of the group's `params` is what fully_shard made of an owned matrix (`owned`:
    every live owner placement's records)."""
    now_of = {id(now): (o, now) for o, now in replaced(list(owned)) if now is not None}
    hits = [now_of[id(p)] for p in params if id(p) in now_of]
    if hits:
        raise also_sharded_error(hits, where)
