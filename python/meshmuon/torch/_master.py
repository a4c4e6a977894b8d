"""fp32 master weights for bf16 parameters of meshmuon.torch.Muon on the local or distributed engine
(docs/python.md, "Mixed precision").

MasterEngine has the interface of _engine.Engine (params, names, kind, core, state(i), options(g),
step_count, set_step_count, last_stats, step) and wraps one: bf16 parameters (plain or DTensor)
get fp32 master copies (state key "master") that the engine updates; after each step the bf16
parameter is the master rounded to nearest even. ZeRO keeps its masters itself (_zero.py).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _comms
from ._engine import CoreDelegate, Engine
from ._layouts import is_dtensor, wrap_local

MASTER = "master"  # the state key of a parameter's fp32 master


def master_of(p: torch.Tensor) -> torch.Tensor:
    """An fp32 copy of bf16 parameter p (exact), plain or a DTensor with p's layout."""
    if not is_dtensor(p):
        return p.detach().to(torch.float32).contiguous()
    local = p._local_tensor.detach().to(torch.float32).contiguous()
    return wrap_local(local, p.device_mesh, p.placements, p.shape, p.stride())


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t._local_tensor if is_dtensor(t) else t).detach()


class MasterEngine(CoreDelegate):
    """bf16 parameters with fp32 masters over an Engine: the engine updates the masters (fp32 state as
    for any parameter), then each bf16 parameter (its local shard for a DTensor) is overwritten with
    its master rounded to nearest even. fp32 parameters of the same groups pass through."""

    def __init__(self, param_groups: list[dict], qk_tags: dict, non_finite: str, comm_dtype: str,
                 threads: int, kind: Optional[str]):
        self.params: list[torch.Tensor] = [p for g in param_groups for p in g["params"]]
        self.masters: list[Optional[torch.Tensor]] = []
        groups, tags = [], {}
        for group in param_groups:
            inner = []
            for p in group["params"]:
                m = master_of(p) if p.dtype == torch.bfloat16 else None
                self.masters.append(m)
                inner.append(p if m is None else m)
                if id(p) in qk_tags:
                    tags[id(inner[-1])] = qk_tags[id(p)]
            groups.append(dict(group, params=inner))
        self.engine = Engine(groups, tags, non_finite, comm_dtype, threads, kind)
        self.kind, self.names, self.core = self.engine.kind, self.engine.names, self.engine.core
        _comms.release_at_exit(self)
        self._targets = [self.engine.params[i] for i in range(len(self.params))]

    def state(self, i: int) -> dict[str, torch.Tensor]:
        state = self.engine.state(i)
        if self.masters[i] is not None:
            state[MASTER] = self.masters[i]
        return state

    def last_stats(self) -> Optional[dict]:
        return self.engine.last_stats()

    def step(self, params: list[torch.Tensor], grads: list[Optional[torch.Tensor]],
             qk_logits: dict[int, list[float]]) -> bool:
        applied = self.engine.step(self._targets, grads, qk_logits)
        if applied:
            for p, m, g in zip(self.params, self.masters, grads):
                if m is not None and g is not None:
                    _local(p).copy_(_local(m))  # fp32 -> bf16: round to nearest even
        return applied
