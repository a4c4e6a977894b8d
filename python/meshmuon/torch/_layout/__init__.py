"""Where a parameter of meshmuon.torch lives: the adapter's one layout model.

`layout_of(p)` answers, for any parameter, its global shape, the mesh and placements it is laid out
on (a DTensor's Shard / Replicate / _StridedShard, owner placement's Owned(k), none for a plain
tensor), this rank's local tensor and its box in the global shape. Every consumer (the engine, the
gradient norm, state dicts, the checks) asks a Layout what it needs (the engine's placements, the
local tensor, whether this rank holds the values, how gradients spread over ranks, state in the
parameter's layout) and none branches on "DTensor / owned / plain": that is decided here, once.

Layouts come from two places: a DTensor carries its own (dtensor.py maps it to the engine's), and
owner placement (owner/, meshmuon.torch.own) registers each matrix it places (register_owned).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

from ... import _core
from .dtensor import as_layout, engine_placement, is_dtensor, lift_to_job, local_grad, mesh_key, wrap_local

# id(P) -> owner placement record (owner/storage.py's _Owned: .param, .shape, .owner, .is_owner).
# Weak values: a placement dropped with its model leaves no entry behind.
_OWNED: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()

# How a parameter's gradient elements spread over the ranks (Layout.spread): the gradient norm
# combines the ranks' parts accordingly (_grad_norm.py).
SPREAD_MESH = "mesh"            # over a DTensor's mesh: its own reductions combine them
SPREAD_WORLD = "world"          # partitioned over the world (owned: whole on one rank, empty elsewhere)
SPREAD_REPLICATED = "replicated"  # the same whole tensor on every rank


@dataclass(frozen=True)
class Owned:
    """Owner placement: the whole tensor on world rank `owner`, an empty [0, cols] box elsewhere."""
    owner: int


def register_owned(record: Any) -> None:
    """Owner placement (owner/placement.py) registers each matrix it places; its layout is then
    Owned(record.owner) on the world."""
    _OWNED[id(record.param)] = record


def owned_records() -> list:
    """Every live owner placement's records (the checks look for owned matrices sharded elsewhere)."""
    return list(_OWNED.values())


def _owned(p: Any) -> Optional[Any]:
    o = _OWNED.get(id(p))
    return o if o is not None and o.param is p else None


@dataclass(frozen=True)
class Layout:
    """One parameter's layout (see the module docstring). `mesh` / `placements`: the DTensor's own
    (torch placements), () for owned and plain tensors; `owner`: Owned(k)'s rank or None."""
    shape: tuple
    local: torch.Tensor
    mesh: Any = None
    placements: tuple = ()
    owner: Optional[int] = None
    held_here: bool = True
    stride: tuple = ()  # a DTensor's global stride

    @property
    def placed(self) -> bool:
        """Laid out over ranks (a DTensor, or owned): only the distributed engine can step it."""
        return self.mesh is not None or self.owner is not None

    @property
    def spread(self) -> str:
        if self.mesh is not None:
            return SPREAD_MESH
        return SPREAD_WORLD if self.owner is not None else SPREAD_REPLICATED

    def describe(self) -> str:
        """What the layout is, for messages."""
        if self.mesh is not None:
            return "a DTensor (FSDP2 / TP)"
        if self.owner is not None:
            return f"owned by rank {self.owner} (meshmuon.torch.own)"
        return "a plain tensor"

    def all_placements(self) -> tuple:
        """The placements as the issue of record names them: the DTensor's, (Owned(k),), or ()."""
        return (Owned(self.owner),) if self.owner is not None else self.placements

    def engine_mesh(self, world: int, where: str) -> tuple[tuple, list]:
        """(mesh key, engine placements) of the engine's inventory: a DTensor's mesh lifted to the
        whole job (dtensor.lift_to_job); owned and plain tensors on a 1-D "world" mesh (Owned(k),
        Replicate), a plain one on no mesh dims in a one-process engine."""
        if self.mesh is not None:
            mesh, placements = lift_to_job(self.mesh, list(self.placements), world, where)
            return mesh_key(mesh), [engine_placement(pl, len(self.shape), where) for pl in placements]
        if self.owner is not None:
            return (("world", world),), [_core.Placement.owned(self.owner)]
        key = (("world", world),) if world > 1 else ()
        return key, [_core.Placement.replicate()] * len(key)

    def box(self, world: int, rank: int) -> list:
        """This rank's box in the global shape, per dim [(begin, end), ...] (the engine's rule)."""
        key, placements = self.engine_mesh(world, "layout")
        return _core.local_box(list(self.shape), placements, _core.Mesh([(n, s) for n, s in key]), rank)

    def local_of(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's part of `t`: the parameter itself or a tensor of its layout (its fp32 master)."""
        return t if self.mesh is None else t._local_tensor

    def local_grad(self, g: Any, name: str) -> Optional[torch.Tensor]:
        """The local part of this parameter's gradient (None stays None)."""
        if self.mesh is None:
            return g
        return local_grad(g, (self.mesh, self.placements), name)

    def wrap(self, local: torch.Tensor, key: Optional[str] = None) -> torch.Tensor:
        """Engine memory `local` (state key `key`, or the parameter's own values) in this parameter's
        layout, no copy: a DTensor on its mesh and placements, else `local` itself."""
        if self.mesh is None:
            return local
        if key is None:
            return wrap_local(local, self.mesh, self.placements, list(self.shape), self.stride)
        return as_layout(local, (self.mesh, self.placements), self.shape, key)


def layout_of(p: Any) -> Layout:
    """The layout of parameter (or tensor) `p` (module docstring)."""
    o = _owned(p)
    if o is not None:
        return Layout(shape=tuple(o.shape), local=p, owner=o.owner, held_here=o.is_owner)
    if is_dtensor(p):
        return Layout(shape=tuple(p.shape), local=p._local_tensor, mesh=p.device_mesh,
                      placements=tuple(p.placements), stride=tuple(p.stride()))
    return Layout(shape=tuple(p.shape), local=p)


def local_tensor(t: Any) -> torch.Tensor:
    """Where t's values are on this rank: a DTensor's local tensor, else t (parameters and state)."""
    return t._local_tensor if is_dtensor(t) else t


def copy_into(bound: torch.Tensor, value: torch.Tensor) -> None:
    """Copies a loaded state value into the engine's tensor: a DTensor of the same layout locally,
    another layout after redistributing it, a plain (full) tensor by taking this rank's shard."""
    if not is_dtensor(bound):
        bound.copy_(value.full_tensor() if is_dtensor(value) else value)
        return
    from torch.distributed.tensor import distribute_tensor
    if is_dtensor(value):
        if value.device_mesh != bound.device_mesh or tuple(value.placements) != tuple(bound.placements):
            value = value.redistribute(bound.device_mesh, bound.placements)
        local = value._local_tensor
    else:
        local = distribute_tensor(value, bound.device_mesh, bound.placements,
                                  src_data_rank=None)._local_tensor
    bound._local_tensor.copy_(local)


def check_local_shards(local_tensors: Iterable[torch.Tensor], layouts: list[Layout], names: list[str],
                       world: int) -> None:
    """The engine's box of every parameter must be the local tensor it steps (shape; a plain tensor
    is whole), and that tensor contiguous (the engine works in place on it). Before any collective:
    raises ValueError on the rank that differs."""
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_initialized() else 0
    for i, (local, lay) in enumerate(zip(local_tensors, layouts)):
        want = [sum(e - b for b, e in dim) for dim in lay.box(world, rank)]
        if list(local.shape) != want:
            _, placements = lay.engine_mesh(world, f"parameter '{names[i]}'")
            raise ValueError(f"[torch] parameter '{names[i]}': local shard has shape "
                             f"{tuple(local.shape)} but its placements {list(placements)} "
                             f"give {tuple(want)} on rank {rank}")
        if not local.is_contiguous():
            raise ValueError(f"[torch] parameter '{names[i]}': the local shard (shape "
                             f"{tuple(local.shape)}, stride {local.stride()}) is not contiguous; "
                             f"the engine updates it in place and needs a contiguous shard")
