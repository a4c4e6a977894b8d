"""The option objects of meshmuon.torch.Muon: how the step runs, not what it computes.

    opt = meshmuon.torch.Muon(groups, lr=0.02,
                              engine=meshmuon.torch.EngineConfig(threads=2),
                              distribution=meshmuon.torch.Distribution(window=4, comm_dtype="bf16"),
                              memory=meshmuon.torch.Memory(zero=True, reduce_grads="mean"))

Each field is also accepted as a keyword of Muon by its name (`Muon(..., window=4)`, as before these
objects existed), never both ways at once. The values are checked by Muon, with the same messages
either way (ValueError / TypeError naming the option, before anything is built).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional


@dataclass(frozen=True)
class EngineConfig:
    """Which native core steps and how. kind: None (chosen from the parameters: distributed for
    DTensor or owned ones, or plain ones in a job with a meshmuon communicator; else local), "local"
    or "distributed". threads: intra-op threads (None: the BLAS thread count). non_finite: "raise"
    (meshmuon.MeshmuonError on a NaN / inf gradient, nothing modified) or "skip" (the step is
    skipped on every rank)."""
    kind: Optional[str] = None
    threads: Optional[int] = None
    non_finite: str = "raise"


@dataclass(frozen=True)
class Distribution:
    """The distributed core's communication and planning (checked by both cores, used by the
    distributed one). comm_dtype: "fp32" or "bf16" (what gradients and updates travel as). window:
    chunks in flight (1: no overlap). chunk_bytes: a pipeline chunk's buffer bytes per rank.
    strategy: pins {glob: strategy, "default": strategy} or "glob:strategy;...". replica: the
    replica mode of HSDP meshes. machine: the cost model's profile (name, dict, JSON path or
    meshmuon.MachineProfile; None: the device's). timeout_s: every wait's deadline (None: the
    communicator's). allow_inexact: let the planner pick strategies that are not bitwise the
    one-process result."""
    comm_dtype: str = "fp32"
    window: int = 2
    chunk_bytes: int = 32 << 20
    strategy: Any = None
    replica: str = "auto"
    machine: Any = None
    timeout_s: Optional[float] = None
    allow_inexact: bool = False


@dataclass(frozen=True)
class Memory:
    """Where state and gradients live. offload_state: optimizer state in pinned host memory, staged
    to the device chunk by chunk. zero: ZeRO over plain replicated parameters (state and work split
    over the ranks). reduce_grads: with zero, reduce each rank's local gradient inside step()
    ("mean" / "sum"; None: the gradients are already reduced). check_replicas: with zero and
    reduce_grads=None, check that every rank holds the same gradient. none_grad: free each .grad the
    step used."""
    offload_state: bool = False
    zero: bool = False
    reduce_grads: Optional[str] = None
    check_replicas: bool = False
    none_grad: bool = False


# Muon's keyword -> the option object that holds it (engine=: EngineConfig.kind is `engine` itself).
GROUPS = {"engine": EngineConfig, "distribution": Distribution, "memory": Memory}
FIELD_OF = {f.name: (arg, cls) for arg, cls in GROUPS.items() for f in fields(cls)}


def merge(engine: Any, distribution: Any, memory: Any, keywords: dict) -> dict:
    """Muon's engine / distribution / memory arguments and its keywords named like their fields, as
    one {field: value} over every field (the defaults where neither gives one). `engine` may be a
    kind string ("local", "distributed"; as before EngineConfig) or an EngineConfig. TypeError for
    an unknown keyword, a wrong object type, or a field given both ways."""
    unknown = sorted(set(keywords) - set(FIELD_OF))
    if unknown:
        import difflib
        known = sorted(set(FIELD_OF) - {"kind"})
        hints = [f"{k!r}" + (f" (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(k, known, 1))
                             else "") for k in unknown]
        raise TypeError(f"[torch] Muon() got unexpected keyword arguments {', '.join(hints)}")
    if "kind" in keywords:
        raise TypeError("[torch] Muon() got an unexpected keyword argument 'kind': use engine='local' / "
                        "'distributed' or engine=EngineConfig(kind=...)")
    objects = {"engine": engine, "distribution": distribution, "memory": memory}
    if engine is None or isinstance(engine, str):
        objects["engine"] = None
    out: dict = {}
    for arg, cls in GROUPS.items():
        obj = objects[arg]
        if obj is not None and not isinstance(obj, cls):
            what = " or a kind string ('local', 'distributed')" if arg == "engine" else ""
            raise TypeError(f"[torch] Muon({arg}=...) takes a meshmuon.torch.{cls.__name__}{what} or "
                            f"None, got {type(obj).__name__}")
        given = obj if obj is not None else cls()  # the object, or the defaults
        for f in fields(cls):
            if f.name in keywords and obj is not None:
                raise TypeError(f"[torch] Muon(): {f.name!r} is given twice, as a keyword and in "
                                f"{arg}={cls.__name__}(...); give it once")
            out[f.name] = keywords[f.name] if f.name in keywords else getattr(given, f.name)
    if objects["engine"] is None:
        out["kind"] = engine  # None or the kind string, checked with the other options
    return out
