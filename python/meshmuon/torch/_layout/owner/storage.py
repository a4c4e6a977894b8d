"""Owner placement's storage (meshmuon.torch.own; the mechanism: placement.py's docstring): one owned
matrix (_Owned: the at-rest parameter P, its owner, its compute tensor W) and a unit (_Unit: a module
that directly holds owned matrices, unsharded and resharded together)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn


class _Owned:
    """One owned matrix: the at-rest parameter P of `module.attr`, its owner, its compute tensor W."""

    def __init__(self, name: str, module: nn.Module, attr: str, param: nn.Parameter, owner: int, rank: int,
                 compute_dtype: torch.dtype, why: str):
        self.name, self.module, self.attr, self.param, self.owner = name, module, attr, param, owner
        self.shape = tuple(param.shape)  # global
        self.is_owner = rank == owner
        self.why = why
        self.compute_dtype = compute_dtype
        self.aliases = self.is_owner and compute_dtype == param.dtype  # W shares P's storage
        self.W = nn.Parameter(torch.empty(0, dtype=compute_dtype, device=param.device),
                              requires_grad=param.requires_grad)
        self.local_acc: Optional[torch.Tensor] = None  # set_requires_gradient_sync(False)

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def materialize(self) -> None:
        """W as a full tensor of the global shape with storage (its values not yet written unless
        it aliases P)."""
        if self.aliases:
            self.W.data = self.param.data
            return
        if self.W.shape != self.shape:
            self.W.data = torch.empty(self.shape, dtype=self.compute_dtype, device=self.param.device)
        storage = self.W.untyped_storage()
        need = self.numel() * self.W.element_size()
        if storage.size() < need:
            storage.resize_(need)
        if self.is_owner:
            self.W.data.copy_(self.param.data)  # the compute dtype's rounding of the master (bf16: RNE)

    def free(self) -> None:
        if not self.aliases and self.W.untyped_storage().size():
            self.W.untyped_storage().resize_(0)


class _Unit:
    """A module that directly holds owned matrices: unsharded and resharded together."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.pos: Optional[int] = None  # its place in the recorded forward order
        self.absent_keys: list[str] = []  # state-dict keys this rank does not hold (the last load's)
        self.owned: list[_Owned] = []
        self.works: list[Any] = []   # posted broadcasts
        self.posted = False          # its broadcast is posted (prefetch) or done
        self.swapped = False         # W is in module._parameters


def output_tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for x in output for t in output_tensors(x)]
    if isinstance(output, dict):
        return [t for x in output.values() for t in output_tensors(x)]
    return []
