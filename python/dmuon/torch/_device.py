"""Where dmuon.torch's engine runs, and the communicator that carries that device's buffers.

The device is that of the parameters' (local) tensors, all alike:
- CPU tensors (plain ones, DTensors on a cpu mesh, and FSDP2 shards under CPUOffloadPolicy, which
  are CPU tensors on a cuda mesh): the cpu backend and _dist's host communicators (c10d over gloo,
  mpi, single).
- CUDA tensors, all on one device cuda:N: the cuda backend on N, with a communicator that moves
  device buffers: nccl bootstrapped over torch.distributed (the default under torchrun), mpi
  staging them through pinned host memory (the default under mpirun, and how several ranks share
  one GPU), or the single communicator with device copies (one rank). DMUON_COMM=nccl|mpi picks one;
  c10d (gloo) carries host buffers only and is refused for CUDA parameters.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.utils.dlpack import to_dlpack

from .. import _core
from . import _dist

DEVICE_COMM_KINDS = ("nccl", "mpi")

# dmuon's device communicators of this process, one per device name (released at exit, before the
# host communicator: see _dist.shutdown).
_DEVICE_COMMS: dict[str, "_core.Communicator"] = {}


def tensor_device(t: torch.Tensor) -> torch.device:
    """Where the engine sees t's data: a DTensor's local shard, else t itself."""
    return (t._local_tensor if _dist.is_dtensor(t) else t).device


def check_tensor_device(t: torch.Tensor, where: str) -> None:
    """TypeError unless t (its local shard) is a CPU or CUDA tensor."""
    d = tensor_device(t)
    if d.type not in ("cpu", "cuda"):
        raise TypeError(f"[torch] {where} is on {d}; dmuon steps CPU and CUDA tensors (move the "
                        f"model with .to('cpu') or .to('cuda'))")


def engine_device(params: list[torch.Tensor], names: list[str]) -> str:
    """The engine's device for these parameters: "cpu" or "cuda:N". TypeError naming two parameters
    when they are on different devices (one optimizer steps one device's parameters)."""
    first: Optional[tuple[torch.device, str]] = None
    for p, name in zip(params, names):
        check_tensor_device(p, f"parameter '{name}'")
        d = tensor_device(p)
        if first is None:
            first = (d, name)
        elif d != first[0]:
            raise TypeError(f"[torch] parameter '{name}' is on {d} but '{first[1]}' is on "
                            f"{first[0]}; one dmuon optimizer steps the parameters of one device: "
                            f"move them to one (model.to(device)) or build one optimizer per device")
    if first is None or first[0].type == "cpu":
        return "cpu"
    index = first[0].index if first[0].index is not None else torch.cuda.current_device()
    return f"cuda:{index}"


def wait_for_caller(device: str) -> None:
    """Before a ShardedParams call on a CUDA device (gradient reduction, unsharding): waits (on the
    host) until the caller's current stream has finished what it queued, e.g. the backward pass
    that wrote the gradients. Those calls complete their own device work before returning, so this
    one wait orders them between the caller's work before and after. Optimizer steps do not need
    it: they order themselves with the caller's stream on the device (caller_stream). Nothing to do
    on the CPU."""
    if device != "cpu":
        torch.cuda.current_stream(torch.device(device)).synchronize()


def caller_stream(device: str) -> Optional[int]:
    """The caller's current CUDA stream as the engines' set_stream takes it (a cudaStream_t as an
    int; the legacy default stream, whose handle is 0, as cudaStreamLegacy = 1), or None on the
    CPU. A step given it orders its work after what the stream queued (the backward pass) on the
    device, and what the caller queues there after the step runs after the step's work, so the
    step returns without waiting for its tail (the host still waits inside it for the non-finite
    check of the gradients)."""
    if device == "cpu":
        return None
    handle = torch.cuda.current_stream(torch.device(device)).cuda_stream
    return handle if handle != 0 else 1


def engine_arrays(tensors: list) -> list:
    """The tensors as the core's step takes them: DLPack capsules (None kept), made by
    torch.utils.dlpack.to_dlpack. A capsule costs about a ninth of the `__dlpack__` protocol the
    binding otherwise calls per tensor (0.2 vs 1.8 us on the development CPU: for GPT-2 small's 48
    matrices and their gradients, ~150 us of every step). The protocol's stream argument is not
    needed: the step orders itself with the caller's stream (caller_stream, set_stream)."""
    return [None if t is None else to_dlpack(t) for t in tensors]


def default_machine(device: str) -> str:
    """The cost model's machine profile when Muon's `machine` is not given: that of the device."""
    return "cpu" if device == "cpu" else "h100"


def device_comm_kind(requested: Optional[str] = None) -> str:
    """The communicator for CUDA parameters in a job of several ranks: `requested`, else DMUON_COMM,
    else mpi under mpirun and nccl otherwise. ValueError for c10d or an unknown name, RuntimeError
    for mpi without mpirun."""
    kind = requested if requested is not None else os.environ.get("DMUON_COMM", "") or None
    if kind is None:
        return "mpi" if _dist._under_mpirun() else "nccl"
    if kind == "c10d":
        raise ValueError("[torch] the c10d communicator (DMUON_COMM=c10d) carries host buffers over "
                         "gloo; CUDA parameters need nccl (torchrun) or mpi (mpirun, staged through "
                         "pinned memory): unset DMUON_COMM or set one of those")
    if kind not in DEVICE_COMM_KINDS:
        raise ValueError(f"[torch] communicator '{kind}' (DMUON_COMM) is unknown for CUDA "
                         f"parameters; choose one of {', '.join(DEVICE_COMM_KINDS)}")
    if kind == "mpi" and not _dist._under_mpirun():
        raise RuntimeError("[torch] the mpi communicator (DMUON_COMM=mpi) needs a job launched with "
                           "mpirun; under torchrun use nccl (unset DMUON_COMM)")
    return kind


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
    """The communicator for an engine of `world` ranks on `device`: _dist.communicator(world) for
    the CPU; for cuda:N the single one with device copies (one rank), or (several) the nccl one
    bootstrapped over torch.distributed on device N, or the mpi one (it stages device buffers).
    Made once per device and process; COLLECTIVE when made."""
    if device == "cpu":
        return _dist.communicator(world)
    comm = _DEVICE_COMMS.get(device)
    if comm is None:
        if world == 1:
            comm = _core.make_single_communicator(device)
        else:
            kind = device_comm_kind()
            if kind == "mpi":
                comm = _dist.communicator(world)
                if comm.backend != "mpi":
                    raise RuntimeError(f"[torch] dmuon's communicator is '{comm.backend}' but CUDA "
                                       f"parameters under mpirun need the mpi one: call "
                                       f"dmuon.torch.init_distributed(comm='mpi') (or unset "
                                       f"DMUON_COMM) before building the optimizer")
            else:
                if not dist.is_initialized():
                    raise RuntimeError(f"[torch] the parameters span {world} ranks but "
                                       f"torch.distributed is not initialised: call "
                                       f"dmuon.torch.init_distributed() (or "
                                       f"torch.distributed.init_process_group) first; the nccl "
                                       f"communicator is bootstrapped over it")
                index = int(device.split(":")[1])
                comm = _core.make_nccl_communicator(lambda blob: torch_exchange(blob, index),
                                                    dist.get_rank(), dist.get_world_size(), index)
        _DEVICE_COMMS[device] = comm
    if comm.size != world:
        raise ValueError(f"[torch] the parameters span {world} ranks but dmuon's communicator has "
                         f"{comm.size}; every mesh must span the whole job")
    return comm


def release() -> None:
    """Drops the device communicators (at exit, after the engines, before the host one)."""
    _DEVICE_COMMS.clear()
