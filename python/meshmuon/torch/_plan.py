"""The distributed engine's options of meshmuon.torch.Muon (pipeline window and chunk size, strategy
pins, HSDP replica mode, cost-model machine, timeout), checked once at construction, and the plan
object `opt.plan()` returns. The local engine (one process) accepts the same options, checked the
same way, and ignores them: one rank computes every matrix itself (docs/python.md)."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Optional, Union

from .. import _core

# The planner's strategies and replica modes, as the engine spells them (strategy.h, plan.h).
STRATEGIES = tuple(_core.strategy_names())
REPLICA_MODES = tuple(_core.replica_modes())
MACHINES = ("h100", "h200", "h100-ib", "h200-ib", "cpu")  # meshmuon.machine_profile names (docs/plan.md)


def _fail(option: str, value: Any, what: str) -> ValueError:
    return ValueError(f"[torch] {option}={value!r}: {what}")


def _rule_text(pattern: str, strategy: Any, where: str) -> str:
    if not isinstance(pattern, str) or not pattern or ";" in pattern or ":" in pattern:
        raise ValueError(f"[torch] {where}: pattern {pattern!r} must be a non-empty string "
                         f"without ';' or ':' (a glob on parameter names: '*' any run, '?' one "
                         f"character)")
    if strategy not in STRATEGIES:
        raise ValueError(f"[torch] {where}: strategy {strategy!r} for {pattern!r} is not one of "
                         f"{list(STRATEGIES)}")
    return f"{pattern}:{strategy}"


def check_strategy(strategy: Union[None, str, dict]) -> tuple[list[str], Optional[str]]:
    """The constructor's `strategy` as (pattern rules in order, default strategy or None).
    A dict {glob: strategy, "default": strategy} or a rule string as MESHMUON_STRATEGY
    ("*.experts.*:expert_local;default:owner_a2a"). ValueError naming the option otherwise."""
    if strategy is None:
        return [], None
    if isinstance(strategy, str):
        try:
            canonical = _core.strategy_rules(strategy)
        except ValueError as e:
            raise _fail("strategy", strategy, f"{e}; give 'pattern:strategy;...;default:strategy' "
                        f"with strategies {list(STRATEGIES)}") from None
        items = [item for item in canonical.split(";") if item]
        rules = [i for i in items if not i.startswith("default:")]
        default = next((i.split(":", 1)[1] for i in items if i.startswith("default:")), None)
        return rules, default
    if isinstance(strategy, dict):
        rules, default = [], None
        for pattern, name in strategy.items():
            if pattern == "default":
                if name not in STRATEGIES:
                    raise ValueError(f"[torch] strategy['default']={name!r} is not one of "
                                     f"{list(STRATEGIES)}")
                default = name
            else:
                rules.append(_rule_text(pattern, name, "strategy"))
        return rules, default
    raise TypeError(f"[torch] strategy must be None, a dict {{glob: strategy, 'default': strategy}} "
                    f"or a rule string 'glob:strategy;...', got {type(strategy).__name__}")


def group_strategy(group: dict, index: int) -> Optional[str]:
    """The group key `strategy` (a strategy name for every parameter of the group, or None)."""
    name = group.get("strategy")
    if name is not None and name not in STRATEGIES:
        raise ValueError(f"[torch] param group {index}: strategy={name!r} is not one of "
                         f"{list(STRATEGIES)} (or None: the constructor's rules / the cost model)")
    return name


def strategy_rules(rules: list[str], default: Optional[str], groups: list[tuple[list[str], Optional[str]]]) -> str:
    """The engine's pin text: the constructor's pattern rules first (they name parameters), then each
    group's `strategy` for the names of its parameters, then the constructor's default."""
    items = list(rules)
    for g, (names, name) in enumerate(groups):
        if name is None:
            continue
        for pname in names:
            items.append(_rule_text(pname, name, f"param group {g} strategy"))
    if default is not None:
        items.append(f"default:{default}")
    return ";".join(items)


def check_machine(machine: Union[None, str, dict, os.PathLike]) -> Optional["_core.MachineProfile"]:
    """The cost model's constants: None (kept: the profile of the device the step runs on, `cpu`
    for CPU parameters and `h100` for CUDA ones, chosen when the engine is built), a profile name
    ('h100', 'h200', 'h100-ib', 'h200-ib', 'cpu'), a path to a JSON file of measured constants (as `meshmuon plan --machine`), a
    dict of them (bandwidth_Bps, replicate_bandwidth_Bps, latency_s, flops_per_s, name), or a
    meshmuon.MachineProfile."""
    if machine is None:
        return None
    if isinstance(machine, _core.MachineProfile):
        return machine
    if isinstance(machine, dict):
        try:
            return _core.MachineProfile.from_json(json.dumps(machine))
        except (ValueError, TypeError) as e:
            raise _fail("machine", machine, str(e)) from None
    if isinstance(machine, os.PathLike) or (isinstance(machine, str) and machine.endswith(".json")):
        path = os.fspath(machine)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise _fail("machine", machine, f"cannot read the profile file ({e.strerror})") from None
        try:
            return _core.MachineProfile.from_json(text)
        except ValueError as e:
            raise _fail("machine", machine, str(e)) from None
    if isinstance(machine, str):
        if machine not in MACHINES:
            raise _fail("machine", machine, f"use one of {list(MACHINES)}, a path to a JSON file "
                        f"of measured constants (*.json) or a dict of them")
        return _core.MachineProfile.named(machine)
    raise TypeError(f"[torch] machine must be None, a profile name, a *.json path, a dict or a "
                    f"meshmuon.MachineProfile, got {type(machine).__name__}")


def check_dist_options(*, window: int, chunk_bytes: int, replica: str, timeout_s: Optional[float],
                       allow_inexact: bool, machine: Any) -> dict:
    """The distributed engine's keyword arguments, checked (ValueError / TypeError naming the
    option and the allowed values) before anything is built."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise _fail("window", window, "use an int >= 1 (chunks in flight; 1 disables the overlap "
                    "of communication and compute)")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or not 1 <= chunk_bytes <= 1 << 62:
        raise _fail("chunk_bytes", chunk_bytes, "use an int >= 1 (cap on a pipeline chunk's buffer "
                    "bytes per rank)")
    if replica not in REPLICA_MODES:
        raise _fail("replica", replica, f"use one of {list(REPLICA_MODES)}")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not math.isfinite(timeout_s) or timeout_s <= 0):
        raise _fail("timeout_s", timeout_s, "use a finite number of seconds > 0, or None for the "
                    "communicator's default")
    if not isinstance(allow_inexact, bool):
        raise _fail("allow_inexact", allow_inexact, "use True or False")
    return dict(window=window, chunk_bytes=chunk_bytes, replica=replica,
                timeout_s=0.0 if timeout_s is None else float(timeout_s), exact=not allow_inexact,
                machine=check_machine(machine))


class Plan:
    """How the engine distributes each Muon parameter's orthogonalization, and what it predicts
    that costs (docs/plan.md). `str(plan)` is `meshmuon plan`'s table, `plan.to_json()` its JSON text
    and `plan.json` the parsed dict; the attributes below read from it."""

    def __init__(self, text: str, json_text: str, engine: str) -> None:
        self._text, self._json_text = text, json_text
        self.json: dict = json.loads(json_text)
        self.engine = engine  # "local" (one rank) or "distributed"

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return (f"<meshmuon Plan: {self.engine} engine, {self.world_size} rank(s), "
                f"{len(self.strategies)} Muon parameters, {self.num_chunks} chunk(s)>")

    def to_json(self) -> str:
        return self._json_text

    @property
    def world_size(self) -> int:
        return int(self.json["world_size"])

    @property
    def strategies(self) -> dict[str, str]:
        """Per Muon parameter name, its strategy (local, owner_a2a, allgather, ...)."""
        return {e["name"]: e["strategy"] for e in self.json["entries"]}

    @property
    def decisions(self) -> dict[str, str]:
        """Per Muon parameter name, why it has its strategy: pin, env, cost or fallback."""
        return {e["name"]: e["decision"] for e in self.json["entries"]}

    @property
    def chunks(self) -> dict[str, int]:
        """Per Muon parameter name, the pipeline chunk it travels in."""
        return {e["name"]: int(e["chunk"]) for e in self.json["entries"]}

    @property
    def num_chunks(self) -> int:
        return int(self.json["num_chunks"])

    @property
    def options(self) -> dict:
        """The planner's options: window, chunk_bytes, replica, exact, machine, comm_dtype, ..."""
        return dict(self.json["options"])

    @property
    def bytes_sent_max(self) -> float:
        """Predicted bytes the busiest rank sends per step (NorMuon state included)."""
        return float(self.json["per_rank"]["bytes_sent_max"])

    @property
    def bytes_recv_max(self) -> float:
        return float(self.json["per_rank"]["bytes_recv_max"])

    @property
    def predicted_step_seconds(self) -> float:
        return float(self.json["predicted_step_seconds"])


def plan_of(engine: Any) -> Plan:
    """The Plan of a meshmuon.torch engine (_engine.Engine): its native core's (meshmuon.Optimizer or
    meshmuon.LocalOptimizer)."""
    core = getattr(engine, "core", None)
    if core is not None and hasattr(core, "plan_json"):
        return Plan(core.plan_string(), core.plan_json(), engine.kind)
    raise TypeError(f"[torch] this engine ({type(engine).__name__}) has no plan to show")
