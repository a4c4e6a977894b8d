"""The engine's inventory of meshmuon.torch.Muon's param groups: one ParamSpec per parameter (name,
global shape, role, expert stack, QK tag; its engine mesh and placements from the layout model), one
meshmuon.Mesh per distinct mesh, and the groups' GroupOptions. Every core builds from it (_cores.py,
_zero.py); ZeRO's has no placements (ShardedParams shards the whole parameters itself)."""
from __future__ import annotations

from typing import Any, Optional

from .. import _core
from ._layout import Layout
from ._options import make_group_options


def param_name(group: dict, group_index: int, j: int) -> str:
    names = group.get("param_names")
    return str(names[j]) if names else f"param_groups[{group_index}][{j}]"


def build(param_groups: list[dict], layouts: list[Layout], qk_tags: dict,
          world: Optional[int], check: Any = None) -> tuple["_core.Inventory", list, list[str]]:
    """(inventory, groups, names) of the param groups. `layouts`: per parameter in group order.
    `world`: the engine's world size, whose meshes and placements the specs get (a DTensor's mesh
    lifted to the job, owned and plain tensors on a "world" mesh); None: no placements (ZeRO).
    `check(name, param, layout)`: called for every parameter before its spec is made."""
    inventory = _core.Inventory()
    inventory.model = "torch"
    mesh_index: dict[tuple, int] = {}
    specs, groups, meshes, mesh_names, names = [], [], [], [], []

    def engine_mesh(key: tuple) -> int:
        if key not in mesh_index:
            mesh_index[key] = len(meshes)
            meshes.append(_core.Mesh([(n, s) for n, s in key]))
            mesh_names.append("x".join(n for n, _ in key) or "world")
        return mesh_index[key]

    flat = 0
    for g, group in enumerate(param_groups):
        pg = _core.ParamGroup()
        pg.options = make_group_options(group, g)
        muon = group.get("algorithm", "muon") == "muon"
        indices = []
        for j, p in enumerate(group["params"]):
            layout = layouts[flat]
            flat += 1
            spec = _core.ParamSpec()
            spec.name = param_name(group, g, j)
            if check is not None:
                check(spec.name, p, layout)
            spec.shape = list(layout.shape)
            spec.role = "muon" if muon else "adamw"
            spec.expert = muon and p.ndim == 3 and bool(group.get("expert_stacks"))
            if world is not None:
                key, placements = layout.engine_mesh(world, f"parameter '{spec.name}'")
                spec.mesh = engine_mesh(key)
                spec.placements = placements
            tag = qk_tags.get(id(p))
            if tag is not None:
                spec.qk = tag
            indices.append(len(specs))
            specs.append(spec)
            names.append(spec.name)
        pg.params = indices
        groups.append(pg)
    if world is not None:
        inventory.meshes, inventory.mesh_names = meshes, mesh_names
    inventory.params = specs
    return inventory, groups, names


def param_info(spec: "_core.ParamSpec") -> "_core.ParamInfo":
    """The local core's view of an inventory parameter (whole, unplaced)."""
    info = _core.ParamInfo()
    info.name, info.shape, info.expert_stack = spec.name, spec.shape, spec.expert
    if spec.qk is not None:
        info.qk = spec.qk
    return info
