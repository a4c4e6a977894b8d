"""Checks of the parameter lists meshmuon.torch.Muon is given, before any group is added: every
group's unknown keys at once, and torch's handling of a parameter listed twice in one group."""
from __future__ import annotations

import warnings
from typing import Any

import torch

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
