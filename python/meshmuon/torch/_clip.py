"""QK-clip configured by parameter names, as Motif's optimizer takes it (`clip_config`): name globs
for the query and key projections, the head size, the threshold and optionally which query heads
may be clipped. It resolves to meshmuon's QK tags (the same as an explicit `qk_layout`), so results are
bitwise those of the equivalent qk_layout.

    clip_config=dict(
        q_proj="*.attn.q_proj.weight",   # glob(s) over parameter names: query weights (kind "q")
        k_proj="*.attn.k_proj.weight",   # optional: key weights (kind "k"; GQA: fewer key heads)
        head_dim=64,                     # rows per head
        threshold=100.0,                 # optional: tau, the Muon groups' qk_clip_threshold default
        q_heads=None, k_heads=None,      # optional: heads per weight (default rows // head_dim)
        heads=None,                      # optional: the query heads that may be clipped (indices);
                                         # the others keep gamma = 1
        layer=None,                      # optional: regex whose group 1 is the layer index
                                         # (default: the first integer component, "layers.3." -> 3)
    )
"""
from __future__ import annotations

import difflib
import fnmatch
import math
import re
from typing import Any, Optional

import torch

CLIP_KEYS = ("q_proj", "k_proj", "head_dim", "threshold", "q_heads", "k_heads", "heads", "layer")
_DEFAULT_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def _globs(config: dict, key: str) -> list[str]:
    value = config.get(key)
    if value is None:
        return []
    values = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not values or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"[torch] clip_config[{key!r}]={value!r}: give a parameter name or glob, or a "
                         f"list of them ('*' any run of characters, dots included)")
    return values


def _positive_int(config: dict, key: str, required: bool) -> Optional[int]:
    value = config.get(key)
    if value is None:
        if required:
            raise ValueError(f"[torch] clip_config needs {key!r} (an int > 0)")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"[torch] clip_config[{key!r}]={value!r}: use an int > 0")
    return value


def check_clip_config(config: Optional[dict]) -> Optional[float]:
    """Checks keys and values (before anything is built); returns the threshold or None."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise TypeError(f"[torch] clip_config must be a dict with keys {list(CLIP_KEYS)}, got "
                        f"{type(config).__name__}")
    unknown = sorted(set(config) - set(CLIP_KEYS))
    if unknown:
        hints = [f"{k!r}" + (f" (use {c[0]!r})" if (c := difflib.get_close_matches(k, CLIP_KEYS, 1, 0.5))
                             else "") for k in unknown]
        raise ValueError(f"[torch] clip_config: unknown keys {', '.join(hints)}; the keys are "
                         f"{list(CLIP_KEYS)}")
    if not _globs(config, "q_proj"):
        raise ValueError("[torch] clip_config needs 'q_proj': the query weights' names or globs")
    _globs(config, "k_proj")
    for key, required in (("head_dim", True), ("q_heads", False), ("k_heads", False)):
        _positive_int(config, key, required)
    heads = config.get("heads")
    if heads is not None:
        if not isinstance(heads, (list, tuple, range)) or not heads or not all(
                isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in heads):
            raise ValueError(f"[torch] clip_config['heads']={heads!r}: give a non-empty list of query "
                             f"head indices >= 0 (the heads that may be clipped)")
    layer = config.get("layer")
    if layer is not None:
        try:
            pattern = re.compile(layer)
        except (re.error, TypeError) as e:
            raise ValueError(f"[torch] clip_config['layer']={layer!r} is not a regex: {e}") from None
        if pattern.groups < 1:
            raise ValueError(f"[torch] clip_config['layer']={layer!r} needs a group that captures the "
                             f"layer index, e.g. r'layers\\.(\\d+)\\.'")
    threshold = config.get("threshold")
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or \
            not math.isfinite(threshold) or threshold <= 0:
        raise ValueError(f"[torch] clip_config['threshold']={threshold!r}: use a finite number > 0")
    return float(threshold)


def resolve_clip_config(config: dict, named: dict[str, tuple[torch.Tensor, str]]
                        ) -> tuple[dict[str, dict], dict[int, list[int]]]:
    """(qk_layout entries {parameter name: tag dict}, {layer: query heads that may be clipped}) for a
    checked clip_config over the optimizer's named parameters {name: (tensor, algorithm)}. ValueError
    naming every glob that matches no Muon parameter, a weight matched twice, a layer index missing
    from a name, two weights of one kind in a layer, or a row count not divisible by head_dim."""
    if not named:
        raise ValueError("[torch] clip_config matches parameter names, but the optimizer's parameters "
                         "have none: pass meshmuon.torch.param_groups(model) or (name, parameter) pairs")
    head_dim = config["head_dim"]
    layer_re = re.compile(config["layer"]) if config.get("layer") is not None else _DEFAULT_LAYER
    layout: dict[str, dict] = {}
    kinds: dict[tuple[int, str], str] = {}
    for key, kind, heads_key in (("q_proj", "q", "q_heads"), ("k_proj", "k", "k_heads")):
        for glob in _globs(config, key):
            hits = [n for n in named if fnmatch.fnmatchcase(n, glob)]
            if not hits:
                close = difflib.get_close_matches(glob, list(named), n=3, cutoff=0.4)
                raise ValueError(f"[torch] clip_config[{key!r}]: {glob!r} matches no parameter name of "
                                 f"this optimizer" + (f"; close: {close}" if close else
                                                      f"; names look like {list(named)[:3]}"))
            for name in hits:
                p, algorithm = named[name]
                if algorithm != "muon":
                    raise ValueError(f"[torch] clip_config[{key!r}]: {glob!r} matches {name!r}, which is "
                                     f"in an AdamW group; QK-clip acts on Muon parameters")
                if name in layout:
                    raise ValueError(f"[torch] clip_config: {name!r} is matched by both q_proj and "
                                     f"k_proj globs (or twice); each weight is one kind")
                if p.ndim != 2:
                    raise ValueError(f"[torch] clip_config[{key!r}]: {name!r} has shape "
                                     f"{tuple(p.shape)}; QK-clip needs 2-D [heads * head_dim, in] weights")
                m = layer_re.search(name)
                if m is None:
                    raise ValueError(f"[torch] clip_config: no layer index in {name!r} (pattern "
                                     f"{layer_re.pattern!r}); give clip_config['layer'], a regex whose "
                                     f"group 1 is the layer index")
                try:
                    layer = int(m.group(1))
                except (TypeError, ValueError):
                    raise ValueError(f"[torch] clip_config['layer'] captured {m.group(1)!r} in {name!r}, "
                                     f"not an integer layer index") from None
                other = kinds.get((layer, kind))
                if other is not None:
                    raise ValueError(f"[torch] clip_config: layer {layer} has two {key} weights, "
                                     f"{other!r} and {name!r}; give globs that match one per layer "
                                     f"(or a 'layer' regex that tells them apart)")
                kinds[(layer, kind)] = name
                rows = int(p.shape[0])
                heads = config.get(heads_key)
                if heads is None:
                    if rows % head_dim != 0:
                        raise ValueError(f"[torch] clip_config: {name!r} has {rows} rows, not a multiple "
                                         f"of head_dim={head_dim}; give {heads_key!r} or the right "
                                         f"head_dim")
                    heads = rows // head_dim
                layout[name] = dict(layer=layer, kind=kind, heads=heads, head_dim=head_dim)
    masks: dict[int, list[int]] = {}
    if config.get("heads") is not None:
        selected = sorted(set(config["heads"]))
        for (layer, kind), name in kinds.items():
            if kind != "q":
                continue
            q_heads = layout[name]["heads"]
            if selected[-1] >= q_heads:
                raise ValueError(f"[torch] clip_config['heads'] names head {selected[-1]} but {name!r} "
                                 f"has {q_heads} query heads (indices 0..{q_heads - 1})")
            masks[layer] = selected
    return layout, masks


def mask_logits(logits: dict[int, list[float]], masks: dict[int, list[int]]) -> dict[int, list[float]]:
    """Query heads outside clip_config['heads'] get logit 0 (so gamma = 1: never clipped)."""
    if not masks:
        return logits
    out = dict(logits)
    for layer, heads in masks.items():
        values = out.get(layer)
        if values is None:
            continue
        keep = set(heads)
        out[layer] = [v if h in keep else 0.0 for h, v in enumerate(values)]
    return out


def logits_of(qk_logits: Any) -> dict:
    """step(qk_logits=...) as the engine takes it: {layer: [per-head max logits as floats]}."""
    if qk_logits is None:
        return {}
    if not isinstance(qk_logits, dict):
        raise TypeError("[torch] qk_logits must be a dict {layer: per-head max logits}")
    out = {}
    for layer, value in qk_logits.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().to(torch.float32).cpu().reshape(-1).tolist()
        out[int(layer)] = [float(v) for v in value]
    return out
