"""Product precision made knowingly: what runs bf16 products on this machine, what
`ns_matmul_dtype="auto"` (the default) picks, and a warning (once per process) when "bf16" is asked
for where it brings no speed.

Every CPU runs bf16 Newton–Schulz products (bf16 operands, fp32 accumulation); how is
`meshmuon.cpu_info()["bf16_products"]`: "native" (oneDNN on AVX512-BF16 / AMX: ~2.4x the fp32 rate),
"widened" (meshmuon's own: the bf16 values multiplied by the fp32 products, at the fp32 rate), or
"onednn_emulated" (only when MESHMUON_BF16_PRODUCTS=onednn forces oneDNN's emulation: slower than fp32).
"auto" picks bf16 where the products are native (and on CUDA devices), fp32 elsewhere: the fastest
path of the machine at Muon's accuracy. The warning carries the cost measured on this machine (one
small orthogonalization with each product dtype, a few ms, measured once and cached).
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Iterable, Optional

import torch

from .. import _core


class MeshmuonPerformanceWarning(UserWarning):
    """A meshmuon option brings no speed on this machine (bf16 products on a CPU where they are not
    native: as slow as fp32 or slower, with bf16's error)."""


_INFO: Optional[dict] = None
_COST: Optional[dict] = None
_WARNED = False


def cpu_info() -> dict:
    """meshmuon.cpu_info() (model, avx512_bf16, amx_bf16, bf16_native, bf16_products, bf16_kernel,
    bf16_reason, bf16_forced, bf16_error, auto_matmul_dtype), cached."""
    global _INFO
    if _INFO is None:
        _INFO = dict(_core.cpu_info())
    return dict(_INFO)


def bf16_native() -> bool:
    return bool(cpu_info()["bf16_native"])


def bf16_cost(size: int = 192, repeats: int = 3) -> dict:
    """CPU seconds of one size x size Newton–Schulz orthogonalization (5 steps, plain products) with
    fp32 and with bf16 products on this machine, on one thread (its CPU time, so other load does
    not distort the ratio), best of `repeats`, and their ratio. Measured once per process, then
    cached. Where bf16 products cannot run (a forced path this CPU lacks), `error` holds the
    engine's message and the times are None."""
    global _COST
    if _COST is not None:
        return dict(_COST)
    error = cpu_info()["bf16_error"]
    if error:
        _COST = dict(size=size, fp32_seconds=None, bf16_seconds=None, bf16_over_fp32=None, error=error)
    else:
        _COST = dict(_core.measure_bf16_cost(size, repeats), error=None)
    return dict(_COST)


def torch_bf16_slowdown() -> float:
    """How many times slower torch's own bf16 matmul is than its fp32 one on this CPU (one
    256x1024x256 product each, best of 3: a few ms; ~100x on CPUs without AVX-512, where
    torch.optim.Muon's bf16 Newton–Schulz is that much slower than fp32 arithmetic allows)."""
    import time
    a, b = torch.randn(256, 1024), torch.randn(1024, 256)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        t = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            x @ y
            t = min(t, time.perf_counter() - t0)
        best[dtype] = max(t, 1e-9)
    return best[torch.bfloat16] / best[torch.float32]


def _device_type(group: dict) -> str:
    params = group.get("params") or []
    return params[0].device.type if params and isinstance(params[0], torch.Tensor) else "cpu"


def matmul_dtype(group: dict) -> str:
    """The product dtype a Muon group runs with: its ns_matmul_dtype, "auto" resolved (bf16 where
    bf16 products are native or on a CUDA device, fp32 elsewhere; fp32 for the options bf16
    products exclude: ns_method="gram", ns_bf16=True)."""
    dtype = group.get("ns_matmul_dtype", "auto")
    if dtype != "auto":
        return dtype
    if group.get("ns_method") == "gram" or group.get("ns_bf16"):
        return "fp32"
    if _device_type(group) == "cuda":
        return "bf16"
    return cpu_info()["auto_matmul_dtype"]


def products_of(groups: Iterable[dict]) -> str:
    """What forms the bf16 products of these groups: 'unused' (every Muon group runs fp32
    products), else the CPU's kind ('native', 'widened', 'onednn_emulated'), or 'cuda'."""
    bf16 = [g for g in groups if g.get("algorithm", "muon") == "muon" and matmul_dtype(g) == "bf16"]
    if not bf16:
        return "unused"
    return "cuda" if _device_type(bf16[0]) == "cuda" else cpu_info()["bf16_products"]


_INTERNAL = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the meshmuon package
             os.path.dirname(os.path.abspath(torch.__file__)))                 # torch (step wrappers)


def _user_stacklevel() -> int:
    """The warnings.warn stacklevel of the first frame outside meshmuon and torch (the caller's line),
    counted from check_groups' caller."""
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level


def _asks_bf16(groups: Iterable[dict]) -> bool:
    return any(g.get("algorithm", "muon") == "muon" and g.get("ns_matmul_dtype") == "bf16"
               and _device_type(g) == "cpu" for g in groups)


def check_groups(groups: Iterable[dict], stacklevel: Optional[int] = None) -> None:
    """Warns (MeshmuonPerformanceWarning, once per process) when a CPU Muon group asks for "bf16"
    products and they are not native here, pointing at the caller's line (the first frame outside
    meshmuon and torch, unless `stacklevel` is given). Cheap when there is nothing to say."""
    global _WARNED
    if _WARNED or not _asks_bf16(groups) or bf16_native():
        return
    _WARNED = True
    info, cost = cpu_info(), bf16_cost()
    if cost["error"] is not None:
        measured = f"They cannot run here at all ({cost['error']}): the step will fail."
    else:
        measured = (f"Measured here on a {cost['size']}x{cost['size']} Newton-Schulz (one thread, CPU "
                    f"time): bf16 products {cost['bf16_seconds'] * 1e3:.2f} ms, fp32 "
                    f"{cost['fp32_seconds'] * 1e3:.2f} ms ({cost['bf16_over_fp32']:.2f}x the fp32 "
                    f"time; native bf16 products take ~0.4x).")
    how = {"widened": "meshmuon multiplies the bf16 values with its fp32 products (same speed as fp32, "
                      "bf16's error)",
           "onednn_emulated": "oneDNN emulates the bf16 products (slower than fp32)"}.get(
        info["bf16_products"], info["bf16_products"])
    warnings.warn(
        f"[torch] ns_matmul_dtype='bf16' on a CPU without native bf16 products ({info['model']}; "
        f"{info['bf16_reason']}): {how}. {measured} Use ns_matmul_dtype='auto' (the default: the "
        f"fastest path of each machine, fp32 here) or 'fp32'.",
        MeshmuonPerformanceWarning, stacklevel=stacklevel or _user_stacklevel())


def _reset_for_tests() -> None:
    """Forgets the warning and the cached information and measurements (tests only)."""
    global _COST, _INFO, _WARNED
    _COST, _INFO, _WARNED = None, None, False
