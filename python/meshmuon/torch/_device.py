"""Where meshmuon.torch's engine runs: the device of the parameters' tensors, and the engine's view of
torch tensors and streams there.

The device is that of the parameters' (local) tensors, all alike (engine_device):
- CPU tensors (plain ones, DTensors on a cpu mesh, and FSDP2 shards under CPUOffloadPolicy, which
  are CPU tensors on a cuda mesh): the cpu backend.
- CUDA tensors, all on one device cuda:N: the cuda backend on N.
The communicator that carries a device's buffers is _comms.communicator(world, device). Here also:
the caller's CUDA stream a step orders itself with (caller_stream, wait_for_caller), the tensors as
DLPack capsules for the core (engine_arrays), and the cost model's default machine of a device.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.utils.dlpack import to_dlpack

from ._layout import local_tensor


def tensor_device(t: torch.Tensor) -> torch.device:
    """Where the engine sees t's data: a DTensor's local shard, else t itself."""
    return local_tensor(t).device


def check_tensor_device(t: torch.Tensor, where: str) -> None:
    """TypeError unless t (its local shard) is a CPU or CUDA tensor."""
    d = tensor_device(t)
    if d.type not in ("cpu", "cuda"):
        raise TypeError(f"[torch] {where} is on {d}; meshmuon steps CPU and CUDA tensors (move the "
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
                            f"{first[0]}; one meshmuon optimizer steps the parameters of one device: "
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
