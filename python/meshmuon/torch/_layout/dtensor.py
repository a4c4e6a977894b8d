"""DTensor layouts (a part of the layout model, _layout/__init__.py, which alone uses it).

Maps a DTensor's device mesh and placements to the engine's: engine_placement() per placement,
lift_to_job() for a sub-mesh of the job's mesh, mesh_key() naming a mesh's dims and sizes; wraps the
engine's memory in a DTensor layout without copying (wrap_local, as_layout) and takes the gradients'
local shards (local_grad). is_dtensor() tells DTensors from plain tensors.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from ... import _core


def is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor"


# ---- DTensor layout -> engine layout -------------------------------------------------------------

def engine_placement(pl: Any, ndim: int, where: str) -> "_core.Placement":
    """The engine's placement for DTensor placement `pl` of a tensor of `ndim` dims."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    if isinstance(pl, _StridedShard):  # before Shard: it is a subclass
        return _core.Placement.strided_shard(pl.dim % ndim, int(pl.split_factor))
    if isinstance(pl, Shard):
        return _core.Placement.shard(pl.dim % ndim)
    if isinstance(pl, Replicate):
        return _core.Placement.replicate()
    raise ValueError(f"[torch] {where} has placement {pl!r}; meshmuon supports Replicate, Shard and "
                     f"_StridedShard (reduce Partial tensors before the optimizer step)")


def _row_major(mesh: Any, world: int) -> bool:
    layout = mesh.mesh
    return layout.numel() == world and layout.flatten().tolist() == list(range(world))


def lift_to_job(mesh: Any, placements: list, world: int, where: str) -> tuple[Any, list]:
    """(mesh, placements) on a mesh over the whole job: the DTensor's own mesh when it spans the
    job row-major; for a sub-mesh (FSDP2 over mesh["dp"] beside TP), its root mesh with Replicate
    on the root dims the sub-mesh leaves out (the same local shard: those dims replicate)."""
    if mesh.device_type not in ("cpu", "cuda"):
        raise ValueError(f"[torch] {where} lives on a '{mesh.device_type}' mesh; meshmuon runs on "
                         f"cpu and cuda meshes")
    if _row_major(mesh, world):
        return mesh, placements
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else None
    names, root_names = mesh.mesh_dim_names, getattr(root, "mesh_dim_names", None)
    if root is not None and root is not mesh and names and root_names \
            and set(names) <= set(root_names) and _row_major(root, world):
        dims = [root_names.index(n) for n in names]
        rank = dist.get_rank()
        coords = (root.mesh == rank).nonzero()[0].tolist()
        index = [slice(None) if d in dims else c for d, c in enumerate(coords)]
        if dims == sorted(dims) and torch.equal(root.mesh[tuple(index)], mesh.mesh):
            from torch.distributed.tensor import Replicate
            lifted = [Replicate()] * root.ndim
            for d, pl in zip(dims, placements):
                lifted[d] = pl
            return root, lifted
    raise ValueError(f"[torch] {where}: its device mesh {mesh.mesh.tolist()} is not the row-major "
                     f"layout of all {world} ranks (ranks 0..{world - 1} in order) nor a named "
                     f"sub-mesh of one; meshmuon needs meshes built like init_device_mesh(..., "
                     f"mesh_shape) over the whole job (or slices mesh[name] of them)")


def mesh_key(mesh: Any) -> tuple:
    """The mesh's ((dim name, size), ...): one engine mesh per distinct key."""
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    return tuple(zip(names, (int(s) for s in mesh.mesh.shape)))


# ---- engine memory -> DTensor layout -------------------------------------------------------------

def wrap_local(local: torch.Tensor, mesh: Any, placements: Any, shape: Any, stride: Any) -> Any:
    """A DTensor on (mesh, placements) whose local tensor IS `local` (no copy, no move). CPU memory
    on a cuda mesh (FSDP2's CPUOffloadPolicy shards and their state, offload_state's pinned home
    copies) stays where it is: DTensor.from_local would move it to the mesh's device, a copy cut
    off from the engine, so such tensors are wrapped directly (as FSDP2 wraps its own)."""
    from torch.distributed.tensor import DTensor
    if local.device.type == mesh.device_type:
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape),
                                  stride=tuple(stride))
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    spec = DTensorSpec(mesh, tuple(placements),
                       tensor_meta=TensorMeta(torch.Size(shape), tuple(stride), local.dtype))
    return DTensor(local, spec, requires_grad=False)


def as_layout(local: torch.Tensor, layout: Optional[tuple], shape: Any, key: str) -> torch.Tensor:
    """Engine state `local` (key `key`) of a parameter of global `shape` in the layout (mesh,
    placements): itself for layout None, else a DTensor whose local tensor is `local` (no copy)."""
    if layout is None:
        return local
    mesh, placements = layout
    ndim = len(shape)
    shape = list(shape)
    if key == "normuon_v":
        shape = list(_core.normuon_state_shape(shape, ndim == 3))
    stride = torch.empty(shape, device="meta").stride()
    return wrap_local(local, mesh, placements, shape, stride)


def local_grad(g: Any, layout: tuple, name: str) -> Optional[torch.Tensor]:
    """The local shard of the gradient of DTensor parameter `name` (layout: its mesh and
    placements); None stays None (no gradient)."""
    if g is None:
        return None
    if not is_dtensor(g):
        raise TypeError(f"[torch] gradient of DTensor parameter '{name}' is a plain tensor; "
                        f"expected a DTensor like the parameter")
    if tuple(g.placements) != layout[1]:
        raise ValueError(f"[torch] gradient of '{name}' has placements {tuple(g.placements)}, "
                         f"the parameter {layout[1]}; redistribute (reduce) it first")
    return g._local_tensor
