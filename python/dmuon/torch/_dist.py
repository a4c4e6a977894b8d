"""Processes and DTensor layouts for the distributed core behind dmuon.torch.Muon.

`init_distributed()` sets up both process groups of a job launched with `mpirun -np N python ...`:
the torch one (gloo, from the Open MPI environment) and the engine's MPI communicator. The layout
helpers map a DTensor's mesh and placements to the engine's (the Engine in _engine.py builds its
inventory with them), check that the engine's local box is the DTensor's local shard, and wrap the
engine's state and take the gradients' local shards in the DTensor's layout.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import _core

_COMM: Optional["_core.Communicator"] = None


def is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor"


def init_distributed(master_port: int = 29500, timeout_s: Optional[float] = None) -> tuple[int, int]:
    """Initialises the torch process group (gloo, CPU) and dmuon's MPI communicator for a job
    launched with `mpirun -np N python train.py`; returns (rank, world_size). Every rank must call
    it (collective). Maps OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK to RANK / WORLD_SIZE /
    LOCAL_RANK (unless set), MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to `master_port`.
    Without mpirun (no OMPI variables) it is a one-process job: the single communicator, and torch's
    process group only if RANK / WORLD_SIZE are set. Idempotent."""
    global _COMM
    env = os.environ
    if "OMPI_COMM_WORLD_RANK" in env:
        env.setdefault("RANK", env["OMPI_COMM_WORLD_RANK"])
        env.setdefault("WORLD_SIZE", env["OMPI_COMM_WORLD_SIZE"])
        env.setdefault("LOCAL_RANK", env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(master_port))
    if not dist.is_initialized() and "RANK" in env:
        kwargs = {}
        if timeout_s is not None:
            import datetime
            kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group("gloo", rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                                **kwargs)
    if _COMM is None:
        mpi = "OMPI_COMM_WORLD_SIZE" in env
        _COMM = _core.make_mpi_communicator() if mpi else _core.make_single_communicator()
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if (_COMM.rank, _COMM.size) != (rank, world):
        raise RuntimeError(f"[torch] dmuon's communicator is rank {_COMM.rank} of {_COMM.size} but "
                           f"torch's process group is rank {rank} of {world}; launch with mpirun "
                           f"and let init_distributed() set RANK / WORLD_SIZE")
    return rank, world


def job_size() -> int:
    """Ranks of the job as dmuon's communicator sees it: init_distributed()'s communicator, or Open
    MPI's world size under mpirun; 1 otherwise (one process, or a launcher dmuon has no
    communicator for yet, such as torchrun)."""
    if _COMM is not None:
        return _COMM.size
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


def world_size() -> int:
    """The distributed core's world: torch's process group when there is one, else job_size()."""
    return dist.get_world_size() if dist.is_initialized() else job_size()


def communicator(world: int) -> "_core.Communicator":
    """The engine's communicator for a job of `world` ranks: the one init_distributed() made, the
    single one for one rank, or (under mpirun) a new MPI one."""
    global _COMM
    if _COMM is None:
        if world == 1:
            return _core.make_single_communicator()
        if "OMPI_COMM_WORLD_SIZE" not in os.environ:
            raise RuntimeError(f"[torch] the parameters span {world} ranks but dmuon has no "
                               f"communicator: launch with `mpirun -np {world} python ...` and call "
                               f"dmuon.torch.init_distributed() first")
        _COMM = _core.make_mpi_communicator()
    if _COMM.size != world:
        raise ValueError(f"[torch] the parameters span {world} ranks but dmuon's communicator has "
                         f"{_COMM.size}; every mesh must span the whole job")
    return _COMM


# ---- DTensor layout -> engine layout -------------------------------------------------------------

def _placement(pl: Any, ndim: int, where: str) -> "_core.Placement":
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    if isinstance(pl, _StridedShard):  # before Shard: it is a subclass
        return _core.Placement.strided_shard(pl.dim % ndim, int(pl.split_factor))
    if isinstance(pl, Shard):
        return _core.Placement.shard(pl.dim % ndim)
    if isinstance(pl, Replicate):
        return _core.Placement.replicate()
    raise ValueError(f"[torch] {where} has placement {pl!r}; dmuon supports Replicate, Shard and "
                     f"_StridedShard (reduce Partial tensors before the optimizer step)")


def _row_major(mesh: Any, world: int) -> bool:
    layout = mesh.mesh
    return layout.numel() == world and layout.flatten().tolist() == list(range(world))


def _lift(mesh: Any, placements: list, world: int, where: str) -> tuple[Any, list]:
    """(mesh, placements) on a mesh over the whole job: the DTensor's own mesh when it spans the
    job row-major; for a sub-mesh (FSDP2 over mesh["dp"] beside TP), its root mesh with Replicate
    on the root dims the sub-mesh leaves out (the same local shard: those dims replicate)."""
    if mesh.device_type != "cpu":
        raise ValueError(f"[torch] {where} lives on a '{mesh.device_type}' mesh; the engine runs "
                         f"on the CPU (gloo)")
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
                     f"sub-mesh of one; dmuon needs meshes built like init_device_mesh(..., "
                     f"mesh_shape) over the whole job (or slices mesh[name] of them)")


def _mesh_key(mesh: Any) -> tuple:
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    return tuple(zip(names, (int(s) for s in mesh.mesh.shape)))


def check_local_shards(params: list, inventory: "_core.Inventory", names: list[str]) -> None:
    """The engine's local box of every parameter must be its local shard (shape; a plain tensor is
    whole), and the shard must be contiguous (the engine works in place on it). Before any
    collective: raises ValueError on the rank that differs."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    for i, p in enumerate(params):
        local = p._local_tensor if is_dtensor(p) else p
        spec = inventory.params[i]
        box = _core.local_box(spec.shape, spec.placements, inventory.meshes[spec.mesh], rank)
        want = [sum(e - b for b, e in dim) for dim in box]
        if list(local.shape) != want:
            raise ValueError(f"[torch] parameter '{names[i]}': local shard has shape "
                             f"{tuple(local.shape)} but its placements {list(spec.placements)} "
                             f"give {tuple(want)} on rank {rank}")
        if not local.is_contiguous():
            raise ValueError(f"[torch] parameter '{names[i]}': the local shard (shape "
                             f"{tuple(local.shape)}, stride {local.stride()}) is not contiguous; "
                             f"the engine updates it in place and needs a contiguous shard")


def as_layout(local: torch.Tensor, layout: Optional[tuple], p: Any, key: str) -> torch.Tensor:
    """Engine state `local` of parameter `p` in p's layout: itself for a plain parameter (layout
    None), else a DTensor with p's mesh and placements whose local tensor is `local` (no copy)."""
    if layout is None:
        return local
    from torch.distributed.tensor import DTensor
    mesh, placements = layout
    shape = list(p.shape)
    if key == "normuon_v":
        shape = list(_core.normuon_state_shape(shape, p.ndim == 3))
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=stride)


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
