"""Product precision made knowingly: whether this CPU runs bf16 products natively, and a warning
(once per process) when `ns_matmul_dtype="bf16"` is asked for where they are emulated.

bf16 Newton–Schulz products (oneDNN) run at ~2.4x the fp32 rate on CPUs with AVX512-BF16 or
AMX-BF16; elsewhere oneDNN emulates them and they are slower than fp32 (measured 1.4x its time
here with the emulated path forced), with bf16's error on top. The warning carries the cost
measured on this machine: one small orthogonalization with bf16 and with fp32 products (a few ms,
measured once and cached).

Test seam: DMUON_ASSUME_NO_NATIVE_BF16=1 makes dmuon (this module, `dmuon info`,
`dmuon.cpu_info()`) report bf16 as emulated on any CPU; the products themselves are unchanged.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Iterable, Optional

import torch

from .. import _core


class DmuonPerformanceWarning(UserWarning):
    """A dmuon option is much slower on this machine than its documentation assumes (bf16 products
    on a CPU without native bf16 arithmetic)."""


_ENV = "DMUON_ASSUME_NO_NATIVE_BF16"
_INFO: dict[Optional[str], dict] = {}
_COST: Optional[dict] = None
_WARNED = False


def cpu_info() -> dict:
    """dmuon.cpu_info() (model, avx512_bf16, amx_bf16, bf16_native, bf16_assumed_absent), cached
    per value of DMUON_ASSUME_NO_NATIVE_BF16."""
    key = os.environ.get(_ENV)
    if key not in _INFO:
        _INFO[key] = dict(_core.cpu_info())
    return dict(_INFO[key])


def bf16_native() -> bool:
    return bool(cpu_info()["bf16_native"])


def bf16_cost(size: int = 160, repeats: int = 3) -> dict:
    """CPU seconds of one size x size Newton–Schulz orthogonalization (5 steps, plain products) with
    fp32 and with bf16 products on this machine, on one thread (the calling thread's CPU time, so
    other load on the machine does not distort the ratio), best of `repeats`, and their ratio.
    Measured once per process (~20 ms where bf16 is emulated), then cached. Where the bf16 products cannot run at
    all (oneDNN has no kernel for this CPU's instruction set), `error` holds the engine's message
    and the times are None."""
    global _COST
    if _COST is not None:
        return dict(_COST)
    x = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    out = torch.empty_like(x)
    best = {}
    threads = _core.blas_get_num_threads()
    _core.blas_set_num_threads(1)  # the products run on this thread (OpenBLAS and oneDNN)
    try:
        for dtype in ("fp32", "bf16"):
            ns = _core.NsOptions()
            ns.method = "plain"
            ns.matmul_dtype = dtype
            orth = _core.Orthogonalizer(ns)
            orth.run(x, out)  # warm-up: loads the library, creates the primitives
            t = float("inf")
            for _ in range(repeats):
                t0 = time.thread_time()
                orth.run(x, out)
                t = min(t, time.thread_time() - t0)
            best[dtype] = max(t, 1e-9)
    except (_core.DmuonError, ValueError) as e:
        _COST = dict(size=size, fp32_seconds=best.get("fp32"), bf16_seconds=None,
                     bf16_over_fp32=None, error=str(e))
        return dict(_COST)
    finally:
        _core.blas_set_num_threads(threads)
    _COST = dict(size=size, fp32_seconds=best["fp32"], bf16_seconds=best["bf16"],
                 bf16_over_fp32=best["bf16"] / best["fp32"], error=None)
    return dict(_COST)


_INTERNAL = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the dmuon package
             os.path.dirname(os.path.abspath(torch.__file__)))                 # torch (step wrappers)


def _user_stacklevel() -> int:
    """The warnings.warn stacklevel of the first frame outside dmuon and torch (the caller's line),
    counted from check_groups' caller."""
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level


def _wants_bf16(groups: Iterable[dict]) -> bool:
    return any(g.get("algorithm", "muon") == "muon" and g.get("ns_matmul_dtype") == "bf16"
               for g in groups)


def check_groups(groups: Iterable[dict], stacklevel: Optional[int] = None) -> None:
    """Warns (DmuonPerformanceWarning, once per process) when a Muon group asks for bf16 products
    and this CPU has no native bf16 arithmetic, pointing at the caller's line (the first frame
    outside dmuon and torch, unless `stacklevel` is given). Cheap when there is nothing to say."""
    global _WARNED
    if _WARNED or not _wants_bf16(groups) or bf16_native():
        return
    _WARNED = True
    info, cost = cpu_info(), bf16_cost()
    assumed = (f" (assumed by {_ENV}=1; this CPU has "
               f"{'avx512_bf16' if info['avx512_bf16'] else 'amx_bf16'})"
               if info["bf16_assumed_absent"] and (info["avx512_bf16"] or info["amx_bf16"]) else "")
    if cost["error"] is not None:
        measured = (f"The bf16 products could not run here at all ({cost['error']}): the step will "
                    f"fail.")
    else:
        measured = (f"Measured here on a {cost['size']}x{cost['size']} Newton-Schulz (one thread, CPU "
                    f"time): bf16 products {cost['bf16_seconds'] * 1e3:.2f} ms, fp32 "
                    f"{cost['fp32_seconds'] * 1e3:.2f} ms ({cost['bf16_over_fp32']:.1f}x the fp32 "
                    f"time; native bf16 products take ~0.3x).")
    warnings.warn(
        f"[torch] ns_matmul_dtype='bf16' on a CPU without native bf16 arithmetic ({info['model']}: no "
        f"avx512_bf16 / amx_bf16{assumed}): oneDNN emulates the bf16 products. {measured} "
        f"Use ns_matmul_dtype='fp32' (the default: more accurate"
        f"{', and faster here' if (cost['bf16_over_fp32'] or 2.0) >= 1.0 else ''}).",
        DmuonPerformanceWarning, stacklevel=stacklevel or _user_stacklevel())


def _reset_for_tests() -> None:
    """Forgets the warning and the cached measurements (tests only)."""
    global _COST, _WARNED
    _COST, _WARNED = None, False
    _INFO.clear()
