"""The engine behind dmuon.torch.Muon: builds the engine's inventory from the torch param groups
once (again only when groups change), exposes its state as torch tensors, and runs steps.

Single process (plain tensors): dmuon.LocalOptimizer. The distributed engine (DTensor parameters:
FSDP2 / HSDP / TP / EP) will plug in here behind the same four methods (`state`, `options`,
`step`, `step_count` / `set_step_count`), so Muon's API does not change.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import _core
from ._options import make_group_options

QK_KEYS = ("layer", "kind", "heads", "head_dim", "rope_dim", "v_dim")


def qk_tag(spec: Any, where: str) -> "_core.QkTag":
    """A QkTag from a dict(layer=, kind=, heads=, head_dim=, rope_dim=0, v_dim=0) or a QkTag."""
    if isinstance(spec, _core.QkTag):
        return spec
    if not isinstance(spec, dict):
        raise TypeError(f"[torch] qk_layout[{where}] must be a dict with keys {QK_KEYS}, "
                        f"got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(QK_KEYS))
    missing = sorted({"layer", "kind", "heads", "head_dim"} - set(spec))
    if unknown or missing:
        raise ValueError(f"[torch] qk_layout[{where}]: unknown keys {unknown}, missing keys "
                         f"{missing}; give layer, kind, heads, head_dim (rope_dim, v_dim optional)")
    tag = _core.QkTag()
    tag.layer, tag.kind = int(spec["layer"]), str(spec["kind"])
    tag.heads, tag.head_dim = int(spec["heads"]), int(spec["head_dim"])
    tag.rope_dim, tag.v_dim = int(spec.get("rope_dim", 0)), int(spec.get("v_dim", 0))
    return tag


def param_name(group: dict, group_index: int, j: int) -> str:
    names = group.get("param_names")
    return str(names[j]) if names else f"param_groups[{group_index}][{j}]"


class LocalEngine:
    """dmuon.LocalOptimizer over whole parameters. `params` is the flat list in group order (the
    order of the optimizer's state_dict); `qk_tags` maps id(param) to its QkTag."""

    kind = "local"

    def __init__(self, param_groups: list[dict], qk_tags: dict[int, "_core.QkTag"],
                 non_finite: str, comm_dtype: str):
        infos, groups, flat = [], [], []
        for g, group in enumerate(param_groups):
            pg = _core.ParamGroup()
            pg.options = make_group_options(group, g)
            muon = group.get("algorithm", "muon") == "muon"
            indices = []
            for j, p in enumerate(group["params"]):
                info = _core.ParamInfo()
                info.name = param_name(group, g, j)
                info.shape = list(p.shape)
                info.expert_stack = muon and p.ndim == 3 and bool(group.get("expert_stacks"))
                tag = qk_tags.get(id(p))
                if tag is not None:
                    info.qk = tag
                indices.append(len(infos))
                infos.append(info)
                flat.append(p)
            pg.params = indices
            groups.append(pg)
        self.core = _core.LocalOptimizer(infos, groups, non_finite, comm_dtype)
        self.params: list[torch.Tensor] = flat
        self.names: list[str] = [i.name for i in infos]

    def state(self, i: int) -> dict[str, torch.Tensor]:
        """The engine's state of parameter i as tensors aliasing its memory (stable pointers)."""
        return {key: self.core.state(i, key) for key in self.core.state_keys(i)}

    def options(self, g: int) -> "_core.GroupOptions":
        return self.core.options(g)

    def step_count(self, i: int) -> int:
        return self.core.step_count(i)

    def set_step_count(self, i: int, count: int) -> None:
        self.core.set_step_count(i, count)

    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor],
             qk_logits: dict[int, list[float]]) -> bool:
        # detach(): DLPack refuses tensors that require grad; the views share storage (zero-copy).
        return self.core.step([p.detach() for p in params], grads, qk_logits)
