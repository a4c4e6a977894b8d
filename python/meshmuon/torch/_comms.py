"""The engine's communicators and the processes of a job, for meshmuon.torch.Muon.

Owns every communicator kind and the choice between them, the process groups of a job, the
per-process caches of communicators, and the order in which meshmuon's native objects are released:
- Kinds: the single communicator (one rank; with device copies on cuda:N), meshmuon's MPI one (under
  `mpirun -np N python ...`; it stages device buffers through pinned host memory), the c10d one
  over the job's torch process group (_c10d.py; host buffers over gloo), and the nccl one for CUDA
  tensors, bootstrapped over torch.distributed (torch_exchange).
- Choice: comm_kind() for host (CPU) tensors: c10d under torchrun (torch.distributed from env://),
  mpi under mpirun; device_comm_kind() for CUDA tensors: nccl under torchrun, mpi under mpirun.
  MESHMUON_COMM=mpi|c10d|nccl (or init_distributed(comm=...)) picks one explicitly, e.g. to compare
  mpi and c10d in one mpirun job; c10d is refused for CUDA tensors.
- `init_distributed()` sets up both process groups of a job: the torch one (pg_backend(): gloo,
  plus nccl for CUDA tensors on a GPU machine) and the engine's host communicator. job_size() and
  world_size() are the job's ranks as meshmuon sees them.
- Caches: one host communicator per process (made by init_distributed() or by the first engine of
  several ranks) and one device communicator per device name; communicator(world, device) returns
  them, made on first use.
- Shutdown: engines and optimizers register with release_at_exit(), the tensor objects made over
  engine memory with track_engine_tensors(); at exit shutdown() empties those tensors (a kept
  state_dict() result holds them), then releases in order engines first, then the device
  communicators, then the host one, then the process group meshmuon initialised (MPI finalizes after
  them), so a job ends without nanobind's leak report.
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
from ._layout import local_tensor

HOST_COMM_KINDS = ("mpi", "c10d")
DEVICE_COMM_KINDS = ("nccl", "mpi")

# meshmuon's host communicator of this process (CPU tensors; also CUDA ones under mpi, which stages).
_HOST_COMM: Optional["_core.Communicator"] = None
# meshmuon's device communicators of this process, one per device name (released before the host one).
_DEVICE_COMMS: dict[str, "_core.Communicator"] = {}
_OWN_PG = False  # init_distributed() initialised torch.distributed: destroy it at exit


# ---- launchers and the choice of communicator ----------------------------------------------------

def _under_mpirun() -> bool:
    return "OMPI_COMM_WORLD_SIZE" in os.environ


def _under_torchrun() -> bool:
    """torch.distributed's env:// launch (torchrun sets TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE)."""
    env = os.environ
    return not _under_mpirun() and "RANK" in env and "WORLD_SIZE" in env


def comm_kind(requested: Optional[str] = None) -> str:
    """The engine's communicator for a job of several ranks: `requested`, else MESHMUON_COMM, else
    "mpi" under mpirun and "c10d" otherwise (torchrun, or a process group the caller initialised).
    ValueError for another name, RuntimeError for mpi without mpirun."""
    kind = requested if requested is not None else os.environ.get("MESHMUON_COMM", "") or None
    if kind is None:
        return "mpi" if _under_mpirun() else "c10d"
    if kind not in HOST_COMM_KINDS:
        raise ValueError(f"[torch] communicator '{kind}' (MESHMUON_COMM or comm=) is unknown; choose "
                         f"one of {', '.join(HOST_COMM_KINDS)}")
    if kind == "mpi" and not _under_mpirun():
        raise RuntimeError("[torch] the mpi communicator (MESHMUON_COMM=mpi) needs a job launched with "
                           "mpirun; under torchrun use c10d (unset MESHMUON_COMM)")
    return kind


def device_comm_kind(requested: Optional[str] = None) -> str:
    """The communicator for CUDA parameters in a job of several ranks: `requested`, else MESHMUON_COMM,
    else mpi under mpirun and nccl otherwise. ValueError for c10d or an unknown name, RuntimeError
    for mpi without mpirun."""
    kind = requested if requested is not None else os.environ.get("MESHMUON_COMM", "") or None
    if kind is None:
        return "mpi" if _under_mpirun() else "nccl"
    if kind == "c10d":
        raise ValueError("[torch] the c10d communicator (MESHMUON_COMM=c10d) carries host buffers over "
                         "gloo; CUDA parameters need nccl (torchrun) or mpi (mpirun, staged through "
                         "pinned memory): unset MESHMUON_COMM or set one of those")
    if kind not in DEVICE_COMM_KINDS:
        raise ValueError(f"[torch] communicator '{kind}' (MESHMUON_COMM) is unknown for CUDA "
                         f"parameters; choose one of {', '.join(DEVICE_COMM_KINDS)}")
    if kind == "mpi" and not _under_mpirun():
        raise RuntimeError("[torch] the mpi communicator (MESHMUON_COMM=mpi) needs a job launched with "
                           "mpirun; under torchrun use nccl (unset MESHMUON_COMM)")
    return kind


def make_communicator(kind: str) -> "_core.Communicator":
    """A new host communicator of `kind` ("mpi" or "c10d") over the whole job. Not cached."""
    if kind == "mpi":
        return _core.make_mpi_communicator()
    from ._c10d import make_c10d_communicator  # the transport is loaded only when used
    return make_c10d_communicator()


def pg_backend(requested: Optional[str] = None) -> str:
    """The torch process group's backend init_distributed() asks for: `requested`, else gloo for
    CPU tensors plus nccl for CUDA ones ("cpu:gloo,cuda:nccl") where torch sees a GPU and has NCCL
    (FSDP2 on CUDA needs nccl; meshmuon's c10d communicator moves host buffers over gloo), else gloo."""
    if requested is not None:
        return requested
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


# ---- the processes of a job -----------------------------------------------------------------------

def init_distributed(master_port: int = 29500, timeout_s: Optional[float] = None,
                     comm: Optional[str] = None, backend: Optional[str] = None) -> tuple[int, int]:
    """Initialises the torch process group and meshmuon's communicator; returns (rank, world_size).
    Every rank must call it (collective). The process group's backend is `backend`, else gloo, with
    nccl for CUDA tensors where there is a GPU (pg_backend()); on a GPU machine call
    torch.cuda.set_device(local_rank) first. Launchers:
    - torchrun (`python -m torch.distributed.run --nproc-per-node N train.py`): the process group
      from torchrun's environment, and the c10d communicator over it.
    - mpirun (`mpirun -np N python train.py`): maps OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK to
      RANK / WORLD_SIZE / LOCAL_RANK (unless set), MASTER_ADDR defaults to 127.0.0.1 and
      MASTER_PORT to `master_port`; meshmuon's MPI communicator (or c10d with comm="c10d").
    - neither: a one-process job: the single communicator, and torch's process group only if RANK
      / WORLD_SIZE are set.
    `comm` ("mpi" | "c10d") overrides MESHMUON_COMM and the launcher's default. Idempotent."""
    global _HOST_COMM, _OWN_PG
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
    if _HOST_COMM is None:
        if world == 1 and not _under_mpirun():
            _HOST_COMM = _core.make_single_communicator()
        else:
            _HOST_COMM = make_communicator(kind or comm_kind())
    elif comm is not None and _HOST_COMM.backend != comm:
        raise RuntimeError(f"[torch] meshmuon's communicator is already '{_HOST_COMM.backend}'; "
                           f"init_distributed(comm='{comm}') must come before anything makes one")
    if (_HOST_COMM.rank, _HOST_COMM.size) != (rank, world):
        raise RuntimeError(f"[torch] meshmuon's communicator is rank {_HOST_COMM.rank} of "
                           f"{_HOST_COMM.size} but torch's process group is rank {rank} of {world}; "
                           f"launch with torchrun or mpirun and let init_distributed() set up both")
    return rank, world


def job_size() -> int:
    """Ranks of the job as meshmuon sees it: init_distributed()'s communicator, Open MPI's world size
    under mpirun, torch's process group or torchrun's WORLD_SIZE; 1 otherwise."""
    if _HOST_COMM is not None:
        return _HOST_COMM.size
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


# ---- the communicators of this process ------------------------------------------------------------

def _host_communicator(world: int) -> "_core.Communicator":
    """The host communicator for a job of `world` ranks: the one init_distributed() made, the
    single one for one rank, or a new one: MPI under mpirun, c10d over torch's process group
    otherwise (MESHMUON_COMM overrides)."""
    global _HOST_COMM
    if _HOST_COMM is None:
        if world == 1:
            return _core.make_single_communicator()
        kind = comm_kind()
        if kind == "c10d" and not dist.is_initialized():
            raise RuntimeError(f"[torch] the parameters span {world} ranks but torch.distributed is "
                               f"not initialised: call meshmuon.torch.init_distributed() first (launch "
                               f"with torchrun --nproc-per-node {world} or mpirun -np {world})")
        _HOST_COMM = make_communicator(kind)
    if _HOST_COMM.size != world:
        raise ValueError(f"[torch] the parameters span {world} ranks but meshmuon's communicator has "
                         f"{_HOST_COMM.size}; every mesh must span the whole job")
    return _HOST_COMM


def torch_exchange(blob: bytes, index: int = 0) -> bytes:
    """The nccl bootstrap's all-gather over torch.distributed's default process group: every
    rank's blob, in rank order, concatenated (COLLECTIVE). With CUDA present it runs with device
    `index` current: an nccl process group stages objects on the current device, which must be
    this rank's own (not cuda:0 on every rank) even when the caller never called set_device."""
    out: list[Any] = [None] * dist.get_world_size()
    if torch.cuda.is_available():
        with torch.cuda.device(index):
            dist.all_gather_object(out, bytes(blob))
    else:
        dist.all_gather_object(out, bytes(blob))
    return b"".join(out)


def communicator(world: int, device: str) -> "_core.Communicator":
    """The communicator for an engine of `world` ranks on `device` ("cpu" or "cuda:N"): for the CPU
    the host one (init_distributed()'s, the single one for one rank, else MPI under mpirun and
    c10d otherwise); for cuda:N the single one with device copies (one rank), or (several) the nccl
    one bootstrapped over torch.distributed on device N, or the mpi one (it stages device buffers).
    Made once per device and process; COLLECTIVE when made."""
    if device == "cpu":
        return _host_communicator(world)
    comm = _DEVICE_COMMS.get(device)
    if comm is None:
        if world == 1:
            comm = _core.make_single_communicator(device)
        else:
            kind = device_comm_kind()
            if kind == "mpi":
                comm = _host_communicator(world)
                if comm.backend != "mpi":
                    raise RuntimeError(f"[torch] meshmuon's communicator is '{comm.backend}' but CUDA "
                                       f"parameters under mpirun need the mpi one: call "
                                       f"meshmuon.torch.init_distributed(comm='mpi') (or unset "
                                       f"MESHMUON_COMM) before building the optimizer")
            else:
                if not dist.is_initialized():
                    raise RuntimeError(f"[torch] the parameters span {world} ranks but "
                                       f"torch.distributed is not initialised: call "
                                       f"meshmuon.torch.init_distributed() (or "
                                       f"torch.distributed.init_process_group) first; the nccl "
                                       f"communicator is bootstrapped over it")
                index = int(device.split(":")[1])
                comm = _core.make_nccl_communicator(lambda blob: torch_exchange(blob, index),
                                                    dist.get_rank(), dist.get_world_size(), index)
        _DEVICE_COMMS[device] = comm
    if comm.size != world:
        raise ValueError(f"[torch] the parameters span {world} ranks but meshmuon's communicator has "
                         f"{comm.size}; every mesh must span the whole job")
    return comm


# ---- release at exit ------------------------------------------------------------------------------

# meshmuon.torch engines and optimizers whose native objects shutdown() releases (weakly held).
_RELEASE: "weakref.WeakSet[Any]" = weakref.WeakSet()


def release_at_exit(obj: Any) -> None:
    """Registers an engine or a core (attributes core / _core / native / sp / comm / _state_cache holding native
    objects) or a meshmuon optimizer (its state aliases engine memory) for shutdown()."""
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
    release_engine_memory()
    for o in live:
        for attr in ("_state_cache", "core", "_core", "native", "sp", "comm", "engine", "_dist_options"):
            o.__dict__.pop(attr, None)


# Tensor objects made over engine memory (state tensors, ZeRO's masters and gradient shards; weakly
# held): release_engine_memory() empties the live ones at exit.
# Keyed by id: a WeakSet would compare two tensors with == (elementwise) on a hash match.
_ENGINE_TENSORS: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def track_engine_tensors(tensors: Any) -> None:
    """Registers tensor objects (plain or DTensors) that alias an engine's native memory."""
    for t in tensors:
        _ENGINE_TENSORS[id(t)] = t


def release_engine_memory() -> None:
    """Empties every live tensor object that aliases engine memory (track_engine_tensors): each
    keeps its native owner alive, and references outside meshmuon outlive the optimizer (a
    `state_dict()` result holds the same tensor objects, DTensors included, also after the
    optimizer itself is gone), so at exit they would keep the engine, its sharded parameters and
    its communicator past the module's teardown (nanobind's leak report). A view a caller made of
    such a tensor is a tensor of its own, not reached here."""
    with torch.no_grad():
        for t in list(_ENGINE_TENSORS.values()):
            local = local_tensor(t)  # a DTensor's local tensor is the alias...
            for alias in (local, local._base):  # ...or a view of it (DTensor.from_local's)
                if alias is not None:
                    alias.set_()


def shutdown() -> None:
    """Releases meshmuon's native objects in order: engines (optimizers' native cores), then the
    device communicators, then the host one (mpi may be both), then the process group
    init_distributed() created (MPI finalizes after, at process exit). Runs at exit (atexit),
    before Python tears modules down, so nothing native outlives its module (no nanobind leak
    report)."""
    global _HOST_COMM, _OWN_PG
    try:
        _release_engines()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass
    gc.collect()  # cycles through tensors that keep an engine alive
    _DEVICE_COMMS.clear()
    _HOST_COMM = None
    gc.collect()
    if _OWN_PG and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    _OWN_PG = False


atexit.register(shutdown)
