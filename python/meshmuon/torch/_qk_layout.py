"""QK-clip tags of meshmuon.torch.Muon's parameters: the constructor's qk_layout (keyed by parameter,
module or parameter name) and Motif-style clip_config (_clip.py) resolved to the engine's tags."""
from __future__ import annotations

from typing import Any, Optional

import torch

from .. import _core
from . import _clip

QK_KEYS = ("layer", "kind", "heads", "head_dim", "rope_dim", "v_dim")


def qk_tags(groups: list[dict], qk_layout: dict, clip_config: Optional[dict]) -> tuple[dict, dict]:
    """The QK tags of the groups' parameters by id, and clip_config's head masks (empty without
    one). qk_layout keys are parameters, modules with .weight, or parameter names; every tagged
    parameter must be in a Muon group; one tagged by both qk_layout and clip_config raises."""
    by_name = {}
    for group in groups:
        for name, p in zip(group.get("param_names", []), group["params"]):
            by_name[name] = p
    muon_ids = {id(p) for g in groups if g["algorithm"] == "muon"
                for p in g["params"]}
    tags, masks = {}, {}
    for key, spec in qk_layout.items():
        if isinstance(key, str):
            if key not in by_name:
                raise ValueError(f"[torch] qk_layout names {key!r}, which is not a parameter "
                                 f"name of this optimizer (pass named parameters or the "
                                 f"tensor itself)")
            p, where = by_name[key], key
        elif isinstance(key, torch.nn.Module):
            p, where = getattr(key, "weight", None), type(key).__name__
        else:
            p, where = key, f"tensor of shape {tuple(getattr(key, 'shape', ()))}"
        if not isinstance(p, torch.Tensor) or id(p) not in muon_ids:
            raise ValueError(f"[torch] qk_layout[{where}] is not a parameter of a Muon group "
                             f"of this optimizer")
        tags[id(p)] = qk_tag(spec, where)
    if clip_config is not None:  # Motif-style names and head indices -> the same tags
        named = {name: (by_name[name], g["algorithm"]) for g in groups
                 for name in g.get("param_names", [])}
        layout, masks = _clip.resolve_clip_config(clip_config, named)
        for name, spec in layout.items():
            if id(by_name[name]) in tags:
                raise ValueError(f"[torch] {name!r} is tagged by both qk_layout and clip_config; "
                                 f"use one")
            tags[id(by_name[name])] = qk_tag(spec, name)
    return tags, masks


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
