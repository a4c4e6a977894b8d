"""torchtitan (0.3.0) with meshmuon.torch.Muon selected by configuration: `optimizer_name="MeshMuon"`
in the ParamGroupConfig entries of MeshMuonOptimizers.Config, torchtitan's OptimizersContainer
with one more name in its optimizer table (a subclass: torchtitan's Configurable wiring builds it
from its own Config; nothing patched). torchtitan builds the groups (first pattern wins, each with
`param_names` FQNs), its LRSchedulersContainer wraps every optimizer of the container, its
checkpointer saves the container's flat FQN-keyed state through DCP (DTensor state reshards).

    from meshmuon.integrations.torchtitan import MeshMuonOptimizers
    from torchtitan.components.optimizer import ParamGroupConfig

    optimizer = MeshMuonOptimizers.Config(param_groups=[
        ParamGroupConfig(pattern=r"norm|tok_embeddings|output|bias", optimizer_name="MeshMuon",
                         optimizer_kwargs=dict(algorithm="adamw", lr=3e-3, weight_decay=0.0)),
        ParamGroupConfig(pattern=r".*", optimizer_name="MeshMuon",
                         optimizer_kwargs=dict(lr=0.02, weight_decay=0.1)),
    ], optimizer_factory_kwargs_by_name={"MeshMuon": dict(comm_dtype="bf16")})

Groups named "AdamW" / "Adam" / "DistMuon" stay torchtitan's own optimizers. See
docs/integrations.md."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch.optim import Optimizer
from torchtitan.components.optimizer import OptimizersContainer

from .. import torch as mt

NAME = "MeshMuon"
# OptimizersContainer copies its `implementation` (fused / foreach) into every group; they select
# torch's kernels and mean nothing to meshmuon's engine.
IMPLEMENTATION_KEYS = ("fused", "foreach")


def build_meshmuon(param_groups: list[dict], **options: Any) -> mt.Muon:
    """The "MeshMuon" factory: meshmuon.torch.Muon over torchtitan's groups (params, param_names
    and the ParamGroupConfig's optimizer_kwargs: Muon's group keys, algorithm="adamw" for AdamW
    groups); `options` are Muon's keyword options (optimizer_factory_kwargs_by_name["MeshMuon"])."""
    groups = [{k: v for k, v in g.items() if k not in IMPLEMENTATION_KEYS} for g in param_groups]
    return mt.Muon(groups, **options)


class MeshMuonOptimizers(OptimizersContainer):
    """torchtitan's OptimizersContainer, whose optimizer table also has "MeshMuon"."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        pass

    @staticmethod
    def _resolve_optimizer_factory(name: str) -> Callable[..., Optimizer]:
        if name == NAME:
            return build_meshmuon
        return OptimizersContainer._resolve_optimizer_factory(name)
