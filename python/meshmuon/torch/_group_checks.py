"""Checks of the parameter lists meshmuon.torch.Muon is given, before any group is added: every
group's unknown keys at once, torch's handling of a parameter listed twice in one group, and each
group's parameters (dtype, device, shape for its algorithm, in one group only)."""
from __future__ import annotations

import warnings
from typing import Any

import torch

from . import _device
from ._layout import owned_records
from ._layout.owner import checks as _owned_checks
from ._options import known_keys, unknown_key_hints

# torch.optim.Optimizer.add_param_group's warning, word for word (code and tests match on it).
DUPLICATE_WARNING = ("optimizer contains a parameter group with duplicate parameters; "
                     "in future, this will cause an error; "
                     "see github.com/pytorch/pytorch/issues/40967 for more information")


def checked_param_list(params: Any) -> Any:
    """`params` as the base class will read it (a list; a Tensor or an empty list are left for the
    base class's own errors), after checking the keys of every group dict: one ValueError naming
    each group with unknown keys and those keys, before any group is added."""
    if isinstance(params, torch.Tensor):
        return params
    params = list(params)
    offending = [f"param group {i}: unknown keys {', '.join(hints)}"
                 for i, group in enumerate(params) if isinstance(group, dict)
                 for hints in [unknown_key_hints(group, i)] if hints]
    if offending:
        raise ValueError(f"[torch] {'; '.join(offending)}; meshmuon's group keys are {known_keys()}")
    return params


def without_duplicates(raw: list) -> list:
    """The group's parameters (tensors or (name, tensor) pairs), each once, in first-seen order;
    warns as torch does when one is listed twice (torch warns and keeps both, which would step
    the parameter twice: meshmuon keeps one)."""
    seen, out = set(), []
    for entry in raw:
        p = entry[1] if isinstance(entry, tuple) and len(entry) == 2 else entry
        if id(p) in seen:
            continue
        seen.add(id(p))
        out.append(entry)
    if len(out) != len(raw):
        warnings.warn(DUPLICATE_WARNING, UserWarning, stacklevel=4)
    return out


def check_params(group: dict, index: int, algorithm: str, groups: list[dict], expert_default: bool) -> None:
    """The parameters of a group about to be added after `groups` (Muon.add_param_group): each a
    fp32 or bf16 tensor on a device the engine runs, in no other group, and for Muon 2-D (3-D with
    expert_stacks); TypeError / ValueError naming the group and parameter before anything changes.
    group["params"] becomes the list, each parameter once (torch's warning for a repeated one)."""
    raw = group.get("params")
    if raw is None:
        raise ValueError(f"[torch] param group {index} has no 'params'")
    if isinstance(raw, torch.Tensor):
        raw = [raw]
    elif isinstance(raw, set):
        raise TypeError("optimizer parameters need to be organized in ordered collections, "
                        "but the ordering of tensors in sets will change between runs. "
                        "Please use a list instead.")
    raw = without_duplicates(list(raw))  # torch's warning; each kept once
    group["params"] = raw  # a generator is consumed once: the base class gets the list
    lr = group.get("lr")
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError(f"[torch] param group {index}: Tensor lr must be 1-element (got shape "
                         f"{tuple(lr.shape)}); pass a float or a 1-element tensor")
    params = [p[1] if isinstance(p, tuple) and len(p) == 2 else p for p in raw]
    owner = {id(p): k for k, g in enumerate(groups) for p in g["params"]}
    _owned_checks.check_optimizer_params(params, f"Muon(), param group {index} ({algorithm})",
                                         owned_records())
    expert = bool(group.get("expert_stacks", expert_default))
    for j, p in enumerate(params):
        name = f" '{raw[j][0]}'" if isinstance(raw[j], tuple) else ""
        where = f"param group {index} ({algorithm}), parameter {j}{name}"
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"[torch] {where} is a {torch.typename(p)}, not a Tensor")
        if p.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"[torch] {where} is {p.dtype}; meshmuon takes fp32 parameters, or "
                            f"bf16 ones with fp32 masters (gradients may be fp32 or bf16)")
        _device.check_tensor_device(p, where)
        # Non-contiguous plain parameters are stepped through a contiguous shadow
        # (_cores.InPlaceCore.step); a DTensor's local shard must be contiguous (_layout).
        if id(p) in owner:  # the base class's wording, which code matches on
            raise ValueError(f"[torch] some parameters appear in more than one parameter group: "
                             f"{where} (shape {tuple(p.shape)}) is already in param group "
                             f"{owner[id(p)]}; put each parameter in exactly one group")
        if algorithm == "muon":
            if p.ndim == 3 and not expert:
                raise ValueError(f"[torch] {where} has shape {tuple(p.shape)} (3-D) in a Muon "
                                 f"group; set expert_stacks=True on the group for [E, A, B] "
                                 f"expert stacks, or put it in an AdamW group")
            if p.ndim not in (2, 3):
                raise ValueError(f"[torch] {where} has shape {tuple(p.shape)} ({p.ndim}-D); "
                                 f"Muon takes 2-D matrices (and 3-D expert stacks): put it "
                                 f"in an AdamW group (meshmuon.torch.param_groups does this)")
