"""Which matrices owner placement places, and where (meshmuon.torch.own's `select`): the eligible
matrices (candidates), the choice by name, glob, callable or the planner's cost model (choose), and
the data-parallel mesh's (replicate, shard) sizes the cost model reads (mesh_sizes)."""
from __future__ import annotations

import fnmatch
from typing import Any, Iterable

from torch import nn

from .... import _core
from .. import layout_of
from ...groups import classify

SELECT_MODES = ("auto", "owner", "all")


def mesh_sizes(mesh: Any, world: int) -> tuple[int, int]:
    """(replicate, shard) of an FSDP (1-D) or HSDP (2-D: replicate, shard) mesh over the whole job."""
    if mesh is None:
        return 1, world
    shape = [int(s) for s in mesh.mesh.shape]
    if mesh.mesh.numel() != world or mesh.mesh.flatten().tolist() != list(range(world)):
        raise ValueError(f"[torch] own(mesh=...): the mesh {mesh.mesh.tolist()} must span all {world} ranks "
                         f"row-major (init_device_mesh over the world); owner placement is data parallel")
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    raise ValueError(f"[torch] own(mesh=...): a {len(shape)}-D mesh; give the FSDP (1-D) or HSDP (2-D "
                     f"replicate x shard) data-parallel mesh")


def candidates(model: nn.Module) -> dict[str, tuple[nn.Module, str, nn.Parameter]]:
    """Eligible matrices by name: Muon 2-D weights (param_groups' rule), held by exactly one module
    under one name (a tied weight is not eligible), not yet a DTensor."""
    kinds = classify(model)
    holders: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for attr, p in module._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((f"{mname}.{attr}" if mname else attr, module, attr))
    out = {}
    for name, p in model.named_parameters():
        if kinds.get(name) != "muon" or p.ndim != 2 or type(p).__name__ == "DTensor":
            continue
        where = holders.get(id(p), [])
        if len(where) != 1 or layout_of(p).owner is not None:
            continue
        _, module, attr = where[0]
        out[name] = (module, attr, p)
    return out


def choose(candidates: dict, select: Any, R: int, S: int, machine: Any, scatter_gather: bool) -> dict:
    """name -> (module, attr, param, why, owner rank or -1)."""
    names = list(candidates)
    if isinstance(select, str):
        if select not in SELECT_MODES:
            raise ValueError(f"[torch] own(select={select!r}): use 'auto' (the cost model), 'owner' / 'all' "
                             f"(every eligible matrix), a list of parameter names or globs, or a callable "
                             f"(name, param) -> bool")
        mode = "owner" if select in ("owner", "all") else "auto"
        picked = names
    elif callable(select):
        mode, picked = "owner", [n for n in names if select(n, candidates[n][2])]
    elif isinstance(select, Iterable):
        patterns = list(select)
        mode = "owner"
        picked = [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
        unmatched = [pat for pat in patterns if not any(fnmatch.fnmatchcase(n, pat) for n in names)]
        if unmatched:
            raise ValueError(f"[torch] own(select=...): {unmatched} match no eligible matrix (Muon 2-D "
                             f"weights held by one module); eligible: {names[:8]}{' ...' if len(names) > 8 else ''}")
    else:
        raise TypeError(f"[torch] own(select=...) takes a str, a list of names or a callable, "
                        f"got {type(select).__name__}")
    specs = []
    for n in picked:
        spec = _core.ParamSpec()
        spec.name, spec.shape, spec.role = n, list(candidates[n][2].shape), "muon"
        specs.append(spec)
    from ..._plan import check_machine
    profile = check_machine(machine)
    choices = _core.choose_owner_placement(specs, R, S, mode, profile if profile is not None else "cpu",
                                           scatter_gather_reduce=scatter_gather) if specs else []
    out = {}
    for n, c in zip(picked, choices):
        module, attr, p = candidates[n]
        out[n] = (module, attr, p, c["why"], c["owner"] if c["owned"] else -1)
    return out
