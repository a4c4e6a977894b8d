"""The engine factory of meshmuon.torch.Muon: which engine steps a set of param groups.

make_engine() picks one of the engines, all with the interface of _engine.Engine (params, names,
kind, core, state(i), options(g), step_count, set_step_count, last_stats, step):
- ZeroEngine (_zero.py) with zero=True: ZeRO over plain replicated parameters;
- MasterEngine (_master.py) when a parameter is bf16: fp32 masters over an Engine;
- Engine (_engine.py) otherwise: the local or distributed core.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._engine import Engine
from ._master import MasterEngine
from ._zero import ZeroEngine, ZeroOptions


def make_engine(param_groups: list[dict], qk_tags: dict, non_finite: str, comm_dtype: str,
                threads: int, kind: Optional[str], zero: ZeroOptions):
    """The engine for these groups: ZeroEngine with zero=True, MasterEngine when a parameter is bf16,
    else _engine.Engine."""
    if zero.zero:
        return ZeroEngine(param_groups, qk_tags, non_finite, comm_dtype, zero)
    if any(p.dtype == torch.bfloat16 for g in param_groups for p in g["params"]):
        return MasterEngine(param_groups, qk_tags, non_finite, comm_dtype, threads, kind)
    return Engine(param_groups, qk_tags, non_finite, comm_dtype, threads, kind)
