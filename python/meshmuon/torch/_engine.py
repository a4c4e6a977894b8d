"""The engine behind meshmuon.torch.Muon: one class over interchangeable native cores (_cores.py:
local, distributed; _zero.py: ZeRO through ShardedParams), built from the torch param groups once
(again only when groups change), with the options passed explicitly (EngineOptions). It asks the
layout model (_layout) where each parameter lives, keeps fp32 masters for bf16 parameters (ZeRO's
core keeps its own), exposes the state as torch tensors in the parameters' layouts, and runs steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from . import _comms, _device
from ._cores import DistributedCore, LocalCore
from ._layout import Layout, layout_of
from ._options import ZeroOptions
from ._zero import ZeroCore

MASTER = "master"  # the state key of a parameter's fp32 master


@dataclass(frozen=True)
class EngineOptions:
    """How the engine is built, from Muon's constructor (checked there, _options.check_constructor).
    `kind`: None (chosen from the parameters), "local" or "distributed". `dist`: the distributed
    core's options (window, chunk_bytes, strategy pins, replica, machine, timeout_s, exact; the local
    core reads none of them). `offload_state`: both cores."""
    non_finite: str = "raise"
    comm_dtype: str = "fp32"
    threads: int = 0
    kind: Optional[str] = None
    offload_state: bool = False
    dist: dict = field(default_factory=dict)
    zero: ZeroOptions = field(default_factory=lambda: ZeroOptions(False, None, False, None))

    def core_kwargs(self, device: str) -> dict:
        """The native core's keyword arguments: the distributed options, offload_state and the device;
        the cost model's constants those of the device the step runs on unless `machine` says
        otherwise."""
        out = dict(self.dist, offload_state=self.offload_state)
        if out.get("machine") is None:
            out["machine"] = _device.default_machine(device)
        out["device"] = device
        return out


def engine_kind(layouts: list[Layout], options: EngineOptions) -> str:
    """'zero' with zero=True; 'distributed' for parameters laid out over ranks (DTensors, owned), or
    plain ones in a job of several ranks that meshmuon has a communicator for; 'local' otherwise.
    options.kind ("local" / "distributed") overrides."""
    if options.zero.zero:
        return "zero"
    placed = any(layout.placed for layout in layouts)
    if options.kind == "local" and placed:
        raise ValueError("[torch] engine='local' cannot run DTensor or owned (meshmuon.torch.own) "
                         "parameters; leave engine=None")
    if options.kind is not None:
        return options.kind
    return "distributed" if placed or _comms.job_size() > 1 else "local"


def master_of(p: torch.Tensor, layout: Layout) -> torch.Tensor:
    """An fp32 copy of bf16 parameter p (exact), in p's layout."""
    return layout.wrap(layout.local_of(p).detach().to(torch.float32).contiguous())


class Engine:
    """One native core over the optimizer's parameters. `params` is the flat list in group order (the
    order of the optimizer's state_dict); `qk_tags` maps id(param) to its QkTag. COLLECTIVE when the
    core is (distributed, zero): construction and step() on every rank in the same order."""

    def __init__(self, param_groups: list[dict], qk_tags: dict, options: EngineOptions):
        self.params: list[torch.Tensor] = [p for group in param_groups for p in group["params"]]
        self.layouts = [layout_of(p) for p in self.params]
        self.kind = engine_kind(self.layouts, options)
        self._state_cache: dict[int, dict[str, torch.Tensor]] = {}
        _comms.release_at_exit(self)  # native objects released in order at exit
        # bf16 parameters are stepped through fp32 masters in their layout (ZeRO keeps its own);
        # after each step the parameter is its master rounded to nearest even
        self.bf16_masters: list[Optional[torch.Tensor]] = [
            master_of(p, layout) if p.dtype == torch.bfloat16 and self.kind != "zero" else None
            for p, layout in zip(self.params, self.layouts)]
        self._targets = [p if m is None else m for p, m in zip(self.params, self.bf16_masters)]
        cores = {"local": LocalCore, "distributed": DistributedCore, "zero": ZeroCore}
        self._core = cores[self.kind](param_groups, self._targets, self.layouts, qk_tags, options)
        self.core, self.names, self.device = self._core.native, self._core.names, self._core.device
        self.comm = getattr(self._core, "comm", None)  # the distributed core's communicator

    # ---- what the native core answers unchanged ----------------------------------------------------

    def options(self, g: int) -> Any:
        return self.core.options(g)

    def step_count(self, i: int) -> int:
        return self.core.step_count(i)

    def set_step_count(self, i: int, count: int) -> None:
        self.core.set_step_count(i, count)

    def last_stats(self) -> Optional[dict]:
        return self._core.last_stats()

    # ---- state and step ----------------------------------------------------------------------------

    def state(self, i: int) -> dict[str, torch.Tensor]:
        """State of parameter i as tensors aliasing the engine's memory (stable pointers), in the
        parameter's layout (a DTensor's mesh and placements; ZeRO's Shard(0) over its mesh), and its
        fp32 master (key "master") where it has one. Cached: the same objects each call."""
        cached = self._state_cache.get(i)
        if cached is None:
            layout = self._core.state_layout(i) or self.layouts[i]
            cached = {key: layout.wrap(self.core.state(i, key), key) for key in self.core.state_keys(i)}
            if self._core.masters is not None:
                cached[MASTER] = layout.wrap(self._core.masters[i], MASTER)
            _comms.track_engine_tensors(cached.values())  # emptied at exit (_comms)
            self._state_cache[i] = cached
        state = dict(cached)
        if self.bf16_masters[i] is not None:
            state[MASTER] = self.bf16_masters[i]
        return state

    def step(self, grads: list[Optional[torch.Tensor]], qk_logits: dict[int, list[float]]) -> bool:
        """One step of every parameter whose gradient is not None (the others untouched)."""
        applied = self._core.step(self._targets, grads, qk_logits)
        if applied:
            for p, m, g, layout in zip(self.params, self.bf16_masters, grads, self.layouts):
                if m is not None and g is not None:
                    layout.local_of(p).detach().copy_(layout.local_of(m).detach())  # RNE to bf16
        return applied
