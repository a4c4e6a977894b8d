"""Processes and DTensor layouts for the distributed core behind dmuon.torch.Muon.

`init_distributed()` sets up both process groups of a job: the torch one (gloo; plus nccl for CUDA
tensors on a GPU machine) and the engine's
communicator. Under torchrun (torch.distributed from env://) the engine's communicator is the c10d
one over the job's process group (_c10d.py); under `mpirun -np N python ...` it is dmuon's MPI
one; DMUON_COMM=mpi|c10d (or init_distributed(comm=...)) picks one explicitly, e.g. to compare
both in one mpirun job. The layout helpers map a DTensor's mesh and placements to the engine's
(the Engine in _engine.py builds its inventory with them), check that the engine's local box is
the DTensor's local shard, and wrap the engine's state and take the gradients' local shards in the
DTensor's layout.

Shutdown: native engines and communicators are released at exit in order (engines first, then
communicators, then the process group dmuon initialised; MPI finalizes after them), so a job ends
without nanobind's leak report.
"""
from __future__ import annotations

import atexit
import gc
import os
import weakref
from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import _core

_COMM: Optional["_core.Communicator"] = None
_COMM_KINDS = ("mpi", "c10d")
_OWN_PG = False  # init_distributed() initialised torch.distributed: destroy it at exit


def is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor"


def _under_mpirun() -> bool:
    return "OMPI_COMM_WORLD_SIZE" in os.environ


def _under_torchrun() -> bool:
    """torch.distributed's env:// launch (torchrun sets TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE)."""
    env = os.environ
    return not _under_mpirun() and "RANK" in env and "WORLD_SIZE" in env


def comm_kind(requested: Optional[str] = None) -> str:
    """The engine's communicator for a job of several ranks: `requested`, else DMUON_COMM, else
    "mpi" under mpirun and "c10d" otherwise (torchrun, or a process group the caller initialised).
    ValueError for another name, RuntimeError for mpi without mpirun."""
    kind = requested if requested is not None else os.environ.get("DMUON_COMM", "") or None
    if kind is None:
        return "mpi" if _under_mpirun() else "c10d"
    if kind not in _COMM_KINDS:
        raise ValueError(f"[torch] communicator '{kind}' (DMUON_COMM or comm=) is unknown; choose "
                         f"one of {', '.join(_COMM_KINDS)}")
    if kind == "mpi" and not _under_mpirun():
        raise RuntimeError("[torch] the mpi communicator (DMUON_COMM=mpi) needs a job launched with "
                           "mpirun; under torchrun use c10d (unset DMUON_COMM)")
    return kind


def _make_comm(kind: str) -> "_core.Communicator":
    if kind == "mpi":
        return _core.make_mpi_communicator()
    from ._c10d import make_c10d_communicator
    return make_c10d_communicator()


def pg_backend(requested: Optional[str] = None) -> str:
    """The torch process group's backend init_distributed() asks for: `requested`, else gloo for
    CPU tensors plus nccl for CUDA ones ("cpu:gloo,cuda:nccl") where torch sees a GPU and has NCCL
    (FSDP2 on CUDA needs nccl; dmuon's c10d communicator moves host buffers over gloo), else gloo."""
    if requested is not None:
        return requested
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init_distributed(master_port: int = 29500, timeout_s: Optional[float] = None,
                     comm: Optional[str] = None, backend: Optional[str] = None) -> tuple[int, int]:
    """Initialises the torch process group and dmuon's communicator; returns (rank, world_size).
    Every rank must call it (collective). The process group's backend is `backend`, else gloo, with
    nccl for CUDA tensors where there is a GPU (pg_backend()); on a GPU machine call
    torch.cuda.set_device(local_rank) first. Launchers:
    - torchrun (`python -m torch.distributed.run --nproc-per-node N train.py`): the process group
      from torchrun's environment, and the c10d communicator over it.
    - mpirun (`mpirun -np N python train.py`): maps OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK to
      RANK / WORLD_SIZE / LOCAL_RANK (unless set), MASTER_ADDR defaults to 127.0.0.1 and
      MASTER_PORT to `master_port`; dmuon's MPI communicator (or c10d with comm="c10d").
    - neither: a one-process job: the single communicator, and torch's process group only if RANK
      / WORLD_SIZE are set.
    `comm` ("mpi" | "c10d") overrides DMUON_COMM and the launcher's default. Idempotent."""
    global _COMM, _OWN_PG
    env = os.environ
    if _under_mpirun():
        env.setdefault("RANK", env["OMPI_COMM_WORLD_RANK"])
        env.setdefault("WORLD_SIZE", env["OMPI_COMM_WORLD_SIZE"])
        env.setdefault("LOCAL_RANK", env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(master_port))
    kind = comm_kind(comm) if (_under_mpirun() or "RANK" in env or comm is not None) else None
    if not dist.is_initialized() and "RANK" in env:
        kwargs = {}
        if timeout_s is not None:
            import datetime
            kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(pg_backend(backend), rank=int(env["RANK"]),
                                world_size=int(env["WORLD_SIZE"]), **kwargs)
        _OWN_PG = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if _COMM is None:
        if world == 1 and not _under_mpirun():
            _COMM = _core.make_single_communicator()
        else:
            _COMM = _make_comm(kind or comm_kind())
    elif comm is not None and _COMM.backend != comm:
        raise RuntimeError(f"[torch] dmuon's communicator is already '{_COMM.backend}'; "
                           f"init_distributed(comm='{comm}') must come before anything makes one")
    if (_COMM.rank, _COMM.size) != (rank, world):
        raise RuntimeError(f"[torch] dmuon's communicator is rank {_COMM.rank} of {_COMM.size} but "
                           f"torch's process group is rank {rank} of {world}; launch with torchrun "
                           f"or mpirun and let init_distributed() set up both")
    return rank, world


def job_size() -> int:
    """Ranks of the job as dmuon sees it: init_distributed()'s communicator, Open MPI's world size
    under mpirun, torch's process group or torchrun's WORLD_SIZE; 1 otherwise."""
    if _COMM is not None:
        return _COMM.size
    if _under_mpirun():
        return int(os.environ["OMPI_COMM_WORLD_SIZE"])
    if dist.is_initialized():
        return dist.get_world_size()
    if _under_torchrun():
        return int(os.environ["WORLD_SIZE"])
    return 1


def world_size() -> int:
    """The distributed core's world: torch's process group when there is one, else job_size()."""
    return dist.get_world_size() if dist.is_initialized() else job_size()


def communicator(world: int) -> "_core.Communicator":
    """The engine's communicator for a job of `world` ranks: the one init_distributed() made, the
    single one for one rank, or a new one: MPI under mpirun, c10d over torch's process group
    otherwise (DMUON_COMM overrides)."""
    global _COMM
    if _COMM is None:
        if world == 1:
            return _core.make_single_communicator()
        kind = comm_kind()
        if kind == "c10d" and not dist.is_initialized():
            raise RuntimeError(f"[torch] the parameters span {world} ranks but torch.distributed is "
                               f"not initialised: call dmuon.torch.init_distributed() first (launch "
                               f"with torchrun --nproc-per-node {world} or mpirun -np {world})")
        _COMM = _make_comm(kind)
    if _COMM.size != world:
        raise ValueError(f"[torch] the parameters span {world} ranks but dmuon's communicator has "
                         f"{_COMM.size}; every mesh must span the whole job")
    return _COMM


# dmuon.torch engines and optimizers whose native objects shutdown() releases (weakly held).
_RELEASE: "weakref.WeakSet[Any]" = weakref.WeakSet()


def release_at_exit(obj: Any) -> None:
    """Registers an engine (attributes core / sp / comm / _state_cache / engine holding native
    objects) or a dmuon optimizer (its state aliases engine memory) for shutdown()."""
    _RELEASE.add(obj)


def _release_engines() -> None:
    """Drops what every live registered object holds of the native engine: the optimizers' state
    (state tensors alias an engine's memory and keep it alive), then each engine's cached state
    tensors, native core, sharded parameters, communicator and checked engine options (they hold a
    native MachineProfile). Only at exit: the optimizers are unusable afterwards."""
    live = list(_RELEASE)
    for o in live:
        if isinstance(o, torch.optim.Optimizer):
            o.state.clear()
    for o in live:
        for attr in ("_state_cache", "core", "sp", "comm", "engine", "_dist_options"):
            o.__dict__.pop(attr, None)


def shutdown() -> None:
    """Releases dmuon's native objects in order: engines (optimizers' native cores), then
    communicators, then the process group init_distributed() created (MPI finalizes after, at
    process exit). Runs at exit (atexit), before Python tears modules down, so nothing native
    outlives its module (no nanobind leak report)."""
    global _COMM, _OWN_PG
    try:
        _release_engines()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass
    gc.collect()  # cycles through tensors that keep an engine alive
    from . import _device  # the device communicators before the host one (mpi may be both)
    _device.release()
    _COMM = None
    gc.collect()
    if _OWN_PG and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    _OWN_PG = False


atexit.register(shutdown)


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
    if mesh.device_type not in ("cpu", "cuda"):
        raise ValueError(f"[torch] {where} lives on a '{mesh.device_type}' mesh; dmuon runs on "
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


def as_layout(local: torch.Tensor, layout: Optional[tuple], p: Any, key: str) -> torch.Tensor:
    """Engine state `local` of parameter `p` in p's layout: itself for a plain parameter (layout
    None), else a DTensor with p's mesh and placements whose local tensor is `local` (no copy)."""
    if layout is None:
        return local
    mesh, placements = layout
    shape = list(p.shape)
    if key == "normuon_v":
        shape = list(_core.normuon_state_shape(shape, p.ndim == 3))
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
