"""Owner placement for FSDP2 models (docs/python.md "Owner placement"): chosen weight matrices
live WHOLE on one owner rank of the data-parallel world, the others hold an empty [0, cols] tensor;
the rest of the model stays with torch's fully_shard.

    placement = meshmuon.torch.own(model, mesh, select="auto")        # before fully_shard
    for block in model.blocks:
        fully_shard(block, mesh=mesh, ignored_params=placement.params)
    fully_shard(model, mesh=mesh, ignored_params=placement.params)
    opt = meshmuon.torch.Muon(meshmuon.torch.param_groups(model), ...)   # owned: no step communication

Mechanism (one concept per hook, FSDP2's own model; FSDP2's internals are not touched):
- At rest: each owned matrix stays the module's registered nn.Parameter P (the same object on every
  rank, so param groups, zero_grad and named_parameters work): the full tensor on its owner, an empty
  [0, cols] tensor elsewhere (the Owned(k) local box the engine steps; no memory).
- Forward: a forward pre-hook of each module holding owned matrices (a "unit") broadcasts each from
  its owner into a full compute tensor W (param_dtype, default P's dtype; the owner's W aliases P when
  the dtypes agree) and swaps W into module._parameters; the next unit of the recorded forward order
  is prefetched (its broadcast posted, waited in its own pre-hook). A forward hook swaps P back and,
  with reshard_after_forward, frees W's storage on the non-owners; a hook on the unit's outputs
  re-broadcasts W before the unit's backward (and prefetches the previous unit).
- Backward: W's post-accumulate-grad hook takes W.grad and posts its reduction to the owner (below),
  overlapped with the rest of the backward; a callback at the end of the backward waits for them and
  writes P.grad: on the owner the mean over the world in fp32, ADDED to an existing P.grad (gradient
  accumulation as torch's); elsewhere an empty [0, cols] gradient, so zero_grad() and the optimizer's
  "which gradients exist" agree on every rank.
- The reduction's order is fixed and documented: each rank's gradient converted to reduce_dtype
  (fp32 default; bf16 rounds once before it travels), every element summed in fp32 in rank order
  0, 1, ..., W-1, one division by W. Bitwise reproducible, and the same whatever the process group's
  algorithms. Two ways to get there, the same bits: reduce="scatter_gather" (auto's above 2 ranks) sends row block
  b of every rank's gradient to rank b (an all-to-all: a reduce-scatter by data movement), which sums
  it and sends the sum to the owner (a second all-to-all): the owner's link carries ~2 (W-1)/W of one
  gradient; reduce="gather" gathers every rank's gradient to the owner in row blocks of at most
  `bucket_bytes` in all (the owner's link carries W-1 gradients: a star, ShardedParams' way).
- set_requires_gradient_sync(False) (as FSDP2's): backwards accumulate the local gradient in fp32 on
  every rank, the next synchronised backward reduces the sum.
- State dicts: model.state_dict() holds an owned matrix only on its owner (the full tensor, under its
  usual name); DCP saves it as one item and loads it into any owner, world size or placement (an
  FSDP2 Shard(0) parameter too), and vice versa. Muon's state_dict likewise (_state_dict.py).
- Collectives run on two process groups of their own (unshard, reduce), so they never interleave with
  FSDP2's; every wait has the groups' timeout.

By concept: select.py (which matrices, which owners), storage.py (an owned matrix, a unit), hooks.py
(forward and backward), reduce.py (the gradient reduction), state_dict.py, checks.py (misuses); each
placed matrix registers its Owned(k) layout with the layout model (_layout/__init__.py). Why this is
not ShardedParams' owner placement: docs/decisions/058-one-owner-placement.md.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from .. import register_owned
from ...groups import classify
from . import checks
from .hooks import ForwardBackward
from .reduce import REDUCE_MODES, GradReducer
from .select import candidates, choose, mesh_sizes
from .state_dict import load_post_hook, load_pre_hook, state_dict_hook
from .storage import _Owned, _Unit


class OwnerPlacement(ForwardBackward):
    """What meshmuon.torch.own() returns (see the module docstring). COLLECTIVE: built on every rank
    with the same model; its hooks run collectives, so every rank runs the same forward / backward."""

    def __init__(self, model: nn.Module, mesh: Any, select: Any, param_dtype: Optional[torch.dtype],
                 reduce_dtype: torch.dtype, reshard_after_forward: bool, machine: Any,
                 bucket_bytes: int, timeout_s: Optional[float], reduce: str = "auto"):
        if not dist.is_initialized():
            raise ValueError("[torch] own() needs torch.distributed: call meshmuon.torch.init_distributed() "
                             "(or torch.distributed.init_process_group) first")
        if reduce_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"[torch] own(reduce_dtype={reduce_dtype}): use torch.float32 or torch.bfloat16")
        if param_dtype is not None and param_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"[torch] own(param_dtype={param_dtype}): use None (the parameter's dtype), "
                             f"torch.float32 or torch.bfloat16")
        if reduce not in REDUCE_MODES:
            raise ValueError(f"[torch] own(reduce={reduce!r}): use 'scatter_gather' (reduce-scatter, then the "
                             f"sums to the owner), 'gather' (every rank's gradient to the owner) or 'auto' "
                             f"(gather on 2 ranks, where it is one exchange of the same bytes)")
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"[torch] own(bucket_bytes={bucket_bytes!r}): give a positive int")
        checks.check_mesh(mesh)
        checks.check_not_sharded(model, classify(model), select)
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        if reduce == "auto":
            reduce = "gather" if self.world <= 2 else "scatter_gather"
        R, S = mesh_sizes(mesh, self.world)
        self.mesh, self.reduce_dtype, self.reshard_after_forward = mesh, reduce_dtype, reshard_after_forward
        self.bucket_bytes, self.reduce = bucket_bytes, reduce
        chosen = choose(candidates(model), select, R, S, machine, reduce == "scatter_gather")
        self.choices = {name: why for name, (_, _, _, why, _) in chosen.items()}
        kw = {} if timeout_s is None else {"timeout": timedelta(seconds=float(timeout_s))}
        # two groups of our own over the same ranks: unshard broadcasts and gradient gathers never
        # interleave with each other's or FSDP2's collectives
        self._bcast_pg = dist.new_group(list(range(self.world)), **kw)
        self._reduce_pg = dist.new_group(list(range(self.world)), **kw)
        self.units: list[_Unit] = []
        self.owned: list[_Owned] = []
        unit_of: dict[int, _Unit] = {}
        for name, (module, attr, p, why, owner) in chosen.items():
            if owner < 0:
                continue
            u = unit_of.get(id(module))
            if u is None:
                u = unit_of[id(module)] = _Unit(module)
                self.units.append(u)
            o = _Owned(name, module, attr, p, owner, self.rank, param_dtype or p.dtype, why)
            u.owned.append(o)
            self.owned.append(o)
        for o in self.owned:  # at rest: the owner keeps the full tensor, the others an empty box
            if not o.is_owner:
                o.param.data = o.param.data.new_empty((0, o.shape[1]))
            register_owned(o)
            if o.param.requires_grad:
                o.W.register_post_accumulate_grad_hook(self._grad_hook(o))
        for u in self.units:
            u.module.register_forward_pre_hook(self._pre_forward(u), prepend=True)
            u.module.register_forward_hook(self._post_forward(u))
            u.module.register_state_dict_post_hook(state_dict_hook(u))
            u.module.register_load_state_dict_pre_hook(load_pre_hook(u))
            u.module.register_load_state_dict_post_hook(load_post_hook(u))
        self._order: list[_Unit] = []    # units in forward order (recorded on the first forward)
        self._recording = True
        self._reducer = GradReducer(self.world, self.rank, self._reduce_pg, reduce, reduce_dtype, bucket_bytes)
        self._callback_queued = False
        self._sync = True
        checks.check_at_first_forward(model, self)  # owned matrices not also sharded by fully_shard

    # ---- public -------------------------------------------------------------------------------------

    @property
    def params(self) -> set:
        """The owned parameters: pass them as fully_shard(..., ignored_params=placement.params)."""
        return {o.param for o in self.owned}

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.owned]

    def owner(self, p_or_name: Union[nn.Parameter, str]) -> int:
        """The world rank that holds an owned matrix (by parameter or name); -1 when not owned."""
        for o in self.owned:
            if o.param is p_or_name or o.name == p_or_name:
                return o.owner
        return -1

    def memory_per_rank(self) -> list[int]:
        """Bytes of owned matrices each rank holds at rest (parameters only)."""
        out = [0] * self.world
        for o in self.owned:
            out[o.owner] += o.numel() * o.param.element_size()
        return out

    def set_requires_gradient_sync(self, sync: bool) -> None:
        """As FSDP2's: False accumulates each rank's local gradient (fp32, full size on every rank)
        over backwards without communication; the next backward with True reduces the sum."""
        self._sync = bool(sync)

    def full_tensor(self, p: nn.Parameter) -> torch.Tensor:
        """COLLECTIVE. The owned matrix `p` whole on every rank (a broadcast from its owner)."""
        o = next((o for o in self.owned if o.param is p), None)
        if o is None:
            raise ValueError("[torch] full_tensor: the parameter is not owned by this placement")
        out = o.param.detach().clone() if o.is_owner else torch.empty(o.shape, dtype=o.param.dtype,
                                                                        device=o.param.device)
        dist.broadcast(out, src=o.owner, group=self._bcast_pg)
        return out


def own(model: nn.Module, mesh: Any = None, *, select: Any = "auto", param_dtype: Optional[torch.dtype] = None,
        reduce_dtype: torch.dtype = torch.float32, reshard_after_forward: bool = True, machine: Any = None,
        bucket_bytes: int = 64 << 20, timeout_s: Optional[float] = None,
        reduce: str = "auto") -> OwnerPlacement:
    """COLLECTIVE. Places chosen weight matrices of `model` whole on one owner rank each (see the
    module docstring); call it before fully_shard and pass `placement.params` as its ignored_params.

    mesh: the FSDP (1-D) or HSDP (2-D replicate x shard) DeviceMesh the rest is sharded on (the cost
    model's R x S; default the whole world as one shard group). select: "auto" (the planner's cost
    model chooses, per matrix: memory, reduce + broadcast traffic and latency, step traffic and
    Newton–Schulz; `placement.choices` says why), "owner" / "all" (every eligible matrix: Muon 2-D
    weights held by one module), a list of names / globs, or a callable (name, param) -> bool. Owners:
    longest-processing-time on Newton–Schulz flops and memory, matrices of one layer on different
    ranks. param_dtype: the forward's dtype of owned weights (None: theirs; torch.bfloat16 as FSDP2's
    MixedPrecisionPolicy). reduce_dtype: what gradients travel as (sums in fp32). reduce:
    "scatter_gather", "gather" or "auto" (gather on 2 ranks; the same sums, module docstring).
    machine: the cost model's profile (name, dict or JSON path; default "cpu")."""
    return OwnerPlacement(model, mesh, select, param_dtype, reduce_dtype, reshard_after_forward, machine,
                          bucket_bytes, timeout_s, reduce)
