"""Processes and the distributed engine behind dmuon.torch.Muon.

`init_distributed()` sets up both process groups of a job launched with `mpirun -np N python ...`:
the torch one (gloo, from the Open MPI environment) and the engine's MPI communicator.
`DistEngine` drives dmuon.Optimizer on DTensor parameters (FSDP2 / HSDP / TP / EP): it reads each
DTensor's mesh, placements and global shape, builds the engine's inventory once, checks that the
engine's local box is the DTensor's local shard, and hands the local shards to the engine each step.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import _core
from ._engine import param_name
from ._options import make_group_options

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


def communicator(world: int) -> "_core.Communicator":
    """The engine's communicator for a job of `world` ranks: the one init_distributed() made, the
    single one for one rank, or (under mpirun) a new MPI one."""
    global _COMM
    if _COMM is None:
        if world == 1:
            return _core.make_single_communicator()
        if "OMPI_COMM_WORLD_SIZE" not in os.environ:
            raise RuntimeError(f"[torch] DTensor parameters span {world} ranks but dmuon has no "
                               f"communicator: launch with `mpirun -np {world} python ...` and call "
                               f"dmuon.torch.init_distributed() first")
        _COMM = _core.make_mpi_communicator()
    if _COMM.size != world:
        raise ValueError(f"[torch] DTensor meshes span {world} ranks but dmuon's communicator has "
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


class DistEngine:
    """dmuon.Optimizer over the local shards of DTensor parameters (plain tensors among them are
    replicated on a 1-D mesh over the whole job). Same interface as LocalEngine."""

    kind = "distributed"

    def __init__(self, param_groups: list[dict], qk_tags: dict, non_finite: str, comm_dtype: str):
        flat = [p for group in param_groups for p in group["params"]]
        world = dist.get_world_size() if dist.is_initialized() else 1
        inventory = _core.Inventory()
        inventory.model = "torch"
        mesh_index: dict[tuple, int] = {}
        self.dist_meshes: list = []      # DeviceMesh per engine mesh (None: the plain-tensor mesh)
        specs, groups, names, layouts = [], [], [], []
        meshes, mesh_names = [], []

        def engine_mesh(key: tuple, device_mesh) -> int:
            if key not in mesh_index:
                mesh_index[key] = len(meshes)
                meshes.append(_core.Mesh([(n, s) for n, s in key]))
                mesh_names.append("x".join(n for n, _ in key) or "world")
                self.dist_meshes.append(device_mesh)
            return mesh_index[key]

        for g, group in enumerate(param_groups):
            pg = _core.ParamGroup()
            pg.options = make_group_options(group, g)
            muon = group.get("algorithm", "muon") == "muon"
            indices = []
            for j, p in enumerate(group["params"]):
                spec = _core.ParamSpec()
                spec.name = param_name(group, g, j)
                where = f"parameter '{spec.name}'"
                spec.shape = list(p.shape)
                spec.role = "muon" if muon else "adamw"
                spec.expert = muon and p.ndim == 3 and bool(group.get("expert_stacks"))
                if is_dtensor(p):
                    mesh, placements = _lift(p.device_mesh, list(p.placements), world, where)
                    spec.mesh = engine_mesh(_mesh_key(mesh), mesh)
                    spec.placements = [_placement(pl, p.ndim, where) for pl in placements]
                    layouts.append((p.device_mesh, tuple(p.placements)))
                else:
                    key = (("world", world),) if world > 1 else ()
                    spec.mesh = engine_mesh(key, None)
                    spec.placements = [_core.Placement.replicate()] * len(key)
                    layouts.append(None)
                tag = qk_tags.get(id(p))
                if tag is not None:
                    spec.qk = tag
                indices.append(len(specs))
                specs.append(spec)
                names.append(spec.name)
            pg.params = indices
            groups.append(pg)
        inventory.meshes, inventory.mesh_names, inventory.params = meshes, mesh_names, specs
        inventory.validate()
        self.params: list[torch.Tensor] = flat
        self.names = names
        self.layouts = layouts
        self._check_local_shards(inventory, world)
        self.comm = communicator(world)
        self.core = _core.Optimizer(self.comm, inventory, groups, non_finite, comm_dtype)
        self._state_cache: dict[int, dict[str, torch.Tensor]] = {}

    def _check_local_shards(self, inventory, world: int) -> None:
        # Before any collective: the engine's local box of every parameter must be the DTensor's
        # local shard (shape), and the shard must be contiguous (the engine works in place on it).
        rank = dist.get_rank() if dist.is_initialized() else 0
        for i, p in enumerate(self.params):
            local = p._local_tensor if is_dtensor(p) else p
            spec = inventory.params[i]
            box = _core.local_box(spec.shape, spec.placements, inventory.meshes[spec.mesh], rank)
            want = [sum(e - b for b, e in dim) for dim in box]
            if list(local.shape) != want:
                raise ValueError(f"[torch] parameter '{self.names[i]}': local shard has shape "
                                 f"{tuple(local.shape)} but its placements {list(spec.placements)} "
                                 f"give {tuple(want)} on rank {rank}")
            if not local.is_contiguous():
                raise ValueError(f"[torch] parameter '{self.names[i]}': the local shard (shape "
                                 f"{tuple(local.shape)}, stride {local.stride()}) is not contiguous; "
                                 f"the engine updates it in place and needs a contiguous shard")

    # ---- the engine interface (as LocalEngine) ---------------------------------------------------

    def state(self, i: int) -> dict[str, torch.Tensor]:
        """State of parameter i: DTensors with the parameter's mesh and placements whose local
        tensors alias the engine's memory (plain tensors for plain parameters). Cached: the same
        objects each call."""
        cached = self._state_cache.get(i)
        if cached is not None:
            return dict(cached)
        out = {}
        for key in self.core.state_keys(i):
            local = self.core.state(i, key)
            layout = self.layouts[i]
            if layout is None:
                out[key] = local
                continue
            from torch.distributed.tensor import DTensor
            mesh, placements = layout
            p = self.params[i]
            shape = list(p.shape)
            if key == "normuon_v":
                shape = list(_core.normuon_state_shape(shape, p.ndim == 3))
            stride = torch.empty(shape, device="meta").stride()
            out[key] = DTensor.from_local(local, mesh, placements, run_check=False,
                                          shape=torch.Size(shape), stride=stride)
        self._state_cache[i] = out
        return dict(out)

    def options(self, g: int) -> "_core.GroupOptions":
        return self.core.options(g)

    def step_count(self, i: int) -> int:
        return self.core.step_count(i)

    def set_step_count(self, i: int, count: int) -> None:
        self.core.set_step_count(i, count)

    def last_stats(self) -> dict:
        return self.core.last_stats()

    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor],
             qk_logits: dict[int, list[float]]) -> bool:
        local_params, local_grads = [], []
        for i, (p, g) in enumerate(zip(params, grads)):
            if g is None:  # no gradient: the engine leaves it untouched (agreed with every rank)
                local_params.append((p._local_tensor if is_dtensor(p) else p).detach())
                local_grads.append(None)
                continue
            if is_dtensor(p):
                layout = self.layouts[i]
                if not is_dtensor(g):
                    raise TypeError(f"[torch] gradient of DTensor parameter '{self.names[i]}' is a "
                                    f"plain tensor; expected a DTensor like the parameter")
                if tuple(g.placements) != layout[1]:
                    raise ValueError(f"[torch] gradient of '{self.names[i]}' has placements "
                                     f"{tuple(g.placements)}, the parameter {layout[1]}; "
                                     f"redistribute (reduce) it first")
                p, g = p._local_tensor, g._local_tensor
            local_params.append(p.detach())
            local_grads.append(g.detach().contiguous())  # no copy when contiguous (FSDP2's are)
        return self.core.step(local_params, local_grads, qk_logits)
