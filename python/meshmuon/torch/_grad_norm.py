"""meshmuon.torch.clip_grad_norm_: torch.nn.utils.clip_grad_norm_ for a model that mixes FSDP2's DTensor
gradients, owner-placed matrices (meshmuon.torch.own: the gradient whole on its owner, empty elsewhere)
and plain replicated gradients. torch's own refuses the mix ("mixed torch.Tensor and DTensor") and
would count an owned gradient on its owner only. The total norm is the norm of the three norms:
DTensors' through their full_tensor(), owned ones' p-th powers summed over the world (max for inf),
plain ones as they are (every rank holds the same): by how each parameter's gradient spreads over the
ranks (the layout model's Layout.spread). COLLECTIVE when any gradient is a DTensor or owned.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Union

import torch
import torch.distributed as dist

from ._layout import SPREAD_MESH, SPREAD_WORLD, layout_of


def _norm(grads: list[torch.Tensor], norm_type: float, foreach: Optional[bool]) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    return torch.nn.utils.get_total_norm(grads, norm_type, False, foreach).to(torch.float32)


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> torch.Tensor:
    """As torch.nn.utils.clip_grad_norm_ (same arguments, returns the total norm, a plain fp32 0-dim
    tensor on every rank), over DTensor, owned and plain gradients together (module docstring)."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    norm_type = float(norm_type)
    dtensors, owned, plain = [], [], []  # spread over a DTensor mesh, over the world, replicated
    for p in params:
        if p.grad is None:
            continue
        spread = layout_of(p).spread
        (dtensors if spread == SPREAD_MESH else owned if spread == SPREAD_WORLD else plain).append(p)
    parts = []
    if dtensors:
        n = torch.nn.utils.get_total_norm([p.grad for p in dtensors], norm_type, False, foreach)
        parts.append(n.full_tensor().to(torch.float32).cpu())
    if owned:
        local = _norm([p.grad for p in owned if p.grad.numel()], norm_type, foreach).cpu()
        if math.isinf(norm_type):
            dist.all_reduce(local, op=dist.ReduceOp.MAX)
        else:
            local = local.pow(norm_type)
            dist.all_reduce(local, op=dist.ReduceOp.SUM)
            local = local.pow(1.0 / norm_type)
        parts.append(local)
    if plain:
        parts.append(_norm([p.grad for p in plain], norm_type, foreach).cpu())
    if not parts:
        return torch.zeros((), dtype=torch.float32)
    stacked = torch.stack(parts)
    total = stacked.max() if math.isinf(norm_type) else torch.linalg.vector_norm(stacked, norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"[torch] clip_grad_norm_: the total norm of order {norm_type} of the gradients "
                           f"is non-finite ({float(total)}); pass error_if_nonfinite=False to clip anyway")
    for group in (dtensors, owned, plain):
        if group:
            device = group[0].grad.device
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total.to(device), foreach)
    return total
