"""Profiler ranges and wall times of meshmuon.torch.Muon's step phases: `meshmuon.step` around the whole
step, and inside it one phase at a time (`meshmuon.collect_grads`, `meshmuon.engine`, `meshmuon.write_back`),
each a torch.profiler.record_function range, so they show in torch.profiler traces."""
from __future__ import annotations

import time
from typing import Optional

import torch
from torch.profiler import record_function


class StepPhases:
    """`with StepPhases("meshmuon.step") as phases: phases.phase("a"); ...; phases.phase("b")`: an outer
    range and consecutive inner ranges (each phase() closes the previous one; leaving the block, also
    by an exception, closes both). `times` maps each range's name to its wall seconds. The ranges
    are opened only while a profiler runs (a record_function costs ~10 us even without one)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.times: dict[str, float] = {}
        self._outer: Optional[record_function] = None
        self._inner: Optional[tuple[str, Optional[record_function], float]] = None
        self._t0 = 0.0
        self._profiling = False

    def __enter__(self) -> "StepPhases":
        self._profiling = torch.autograd._profiler_enabled()
        if self._profiling:
            self._outer = record_function(self.name)
            self._outer.__enter__()
        self._t0 = time.perf_counter()
        return self

    def phase(self, name: str) -> None:
        self._close_inner()
        rf = None
        if self._profiling:
            rf = record_function(name)
            rf.__enter__()
        self._inner = (name, rf, time.perf_counter())

    def _close_inner(self) -> None:
        if self._inner is not None:
            name, rf, t0 = self._inner
            self._inner = None
            if rf is not None:
                rf.__exit__(None, None, None)
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0

    def __exit__(self, *exc) -> None:
        self._close_inner()
        self.times[self.name] = time.perf_counter() - self._t0
        if self._outer is not None:
            self._outer.__exit__(*exc)
