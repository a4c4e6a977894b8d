"""Owner placement for FSDP2 models (issue 38, docs/python.md "Owner placement"): chosen weight matrices
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
"""
from __future__ import annotations

import fnmatch
import weakref
from datetime import timedelta
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from .. import _core
from . import _owned_checks
from .groups import classify

SELECT_MODES = ("auto", "owner", "all")
REDUCE_MODES = ("auto", "scatter_gather", "gather")

# id(P) -> _Owned, for the engine (_engine.py), Muon's state dict and clip_grad_norm_. Weak values:
# a placement dropped with its model leaves no entry behind.
_REGISTRY: "weakref.WeakValueDictionary[int, _Owned]" = weakref.WeakValueDictionary()


def owned_info(p: Any) -> Optional["_Owned"]:
    """The owner placement record of parameter `p` (its global shape, owner rank), or None."""
    o = _REGISTRY.get(id(p))
    return o if o is not None and o.param is p else None


def held_elsewhere(p: Any) -> bool:
    """An owned matrix whose owner is another rank: this rank holds no value or state of it."""
    o = owned_info(p)
    return o is not None and not o.is_owner


def drop_elsewhere_state(opt: Any, state_dict: dict) -> dict:
    """Muon.state_dict(): the state tensors of matrices owned by other ranks left out (their "step"
    kept), so a checkpoint holds each owned matrix's state once, from its owner (DCP saves and loads
    it as one item, into any owner or a Shard(0) layout)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    keys = [k for g in state_dict["param_groups"] for k in g["params"]]
    for p, k in zip(params, keys):
        entry = state_dict["state"].get(k)
        if entry is not None and held_elsewhere(p):
            state_dict["state"][k] = {key: v for key, v in entry.items() if key == "step"}
    return state_dict


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


class OwnerPlacement:
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
        _owned_checks.check_mesh(mesh)
        _owned_checks.check_not_sharded(model, classify(model), select)
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        if reduce == "auto":
            reduce = "gather" if self.world <= 2 else "scatter_gather"
        R, S = _mesh_sizes(mesh, self.world)
        self.mesh, self.reduce_dtype, self.reshard_after_forward = mesh, reduce_dtype, reshard_after_forward
        self.bucket_bytes, self.reduce = bucket_bytes, reduce
        candidates = _candidates(model)
        chosen = _choose(candidates, select, R, S, machine, reduce == "scatter_gather")
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
            _REGISTRY[id(o.param)] = o
            if o.param.requires_grad:
                o.W.register_post_accumulate_grad_hook(self._grad_hook(o))
        for u in self.units:
            u.module.register_forward_pre_hook(self._pre_forward(u), prepend=True)
            u.module.register_forward_hook(self._post_forward(u))
            u.module.register_state_dict_post_hook(self._state_dict_hook(u))
            u.module.register_load_state_dict_pre_hook(self._load_pre_hook(u))
            u.module.register_load_state_dict_post_hook(self._load_post_hook(u))
        self._order: list[_Unit] = []    # units in forward order (recorded on the first forward)
        self._recording = True
        self._pending: list[tuple[_Owned, list[Any], list[Any], list[tuple[int, int]]]] = []
        self._scattering: list[tuple[_Owned, Any, torch.Tensor, int]] = []  # scatter_gather's first stage
        self._callback_queued = False
        self._sync = True
        _owned_checks.check_at_first_forward(model, self)  # owned matrices not also sharded by fully_shard

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
        o = owned_info(p)
        if o is None:
            raise ValueError("[torch] full_tensor: the parameter is not owned by this placement")
        out = o.param.detach().clone() if o.is_owner else torch.empty(o.shape, dtype=o.param.dtype,
                                                                        device=o.param.device)
        dist.broadcast(out, src=o.owner, group=self._bcast_pg)
        return out

    # ---- forward / backward hooks --------------------------------------------------------------------

    def _post_unshard(self, u: _Unit) -> None:
        if u.posted:
            return
        for o in u.owned:
            o.materialize()
            if self.world > 1:
                u.works.append(dist.broadcast(o.W.data, src=o.owner, group=self._bcast_pg, async_op=True))
        u.posted = True

    def _wait_unshard(self, u: _Unit) -> None:
        self._post_unshard(u)
        for w in u.works:
            w.wait()
        u.works = []

    def _reshard(self, u: _Unit) -> None:
        for w in u.works:  # a prefetch nobody used (the unit did not run): complete it first
            w.wait()
        u.works = []
        for o in u.owned:
            o.free()
        u.posted = False

    def _neighbour(self, u: _Unit, step: int) -> Optional[_Unit]:
        if self._recording or u.pos is None:
            return None
        i = u.pos + step
        return self._order[i] if 0 <= i < len(self._order) else None

    def _pre_forward(self, u: _Unit) -> Callable:
        def hook(module: nn.Module, args: Any) -> None:
            _owned_checks.check_forward(u.owned)  # before any collective of this forward
            if self._recording:
                if u.pos is not None:       # a unit runs twice: the order is complete
                    self._recording = False
                else:
                    u.pos = len(self._order)
                    self._order.append(u)
            self._wait_unshard(u)
            for o in u.owned:
                module._parameters[o.attr] = o.W
            u.swapped = True
            nxt = self._neighbour(u, +1)
            if nxt is not None and not nxt.swapped:
                self._post_unshard(nxt)
        return hook

    def _post_forward(self, u: _Unit) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            for o in u.owned:
                module._parameters[o.attr] = o.param
            u.swapped = False
            tensors = [t for t in _tensors(output) if t.requires_grad]
            if tensors and any(o.param.requires_grad for o in u.owned):
                if self.reshard_after_forward:
                    self._reshard(u)
                torch.autograd.graph.register_multi_grad_hook(tensors, self._pre_backward(u), mode="any")
            elif self.reshard_after_forward or not torch.is_grad_enabled():
                self._reshard(u)
            return output
        return hook

    def _pre_backward(self, u: _Unit) -> Callable:
        def hook(grad: Any) -> None:
            self._queue_callback()
            self._recording = False
            self._wait_unshard(u)
            prev = self._neighbour(u, -1)
            if prev is not None:
                self._post_unshard(prev)
        return hook

    def _queue_callback(self) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _grad_hook(self, o: _Owned) -> Callable:
        def hook(W: torch.Tensor) -> None:
            self._queue_callback()
            g = W.grad
            W.grad = None
            if g is None:
                return
            if not self._sync:  # accumulate locally, reduce later
                g32 = g.detach().to(torch.float32)
                o.local_acc = g32.clone() if o.local_acc is None else o.local_acc.add_(g32)
            else:
                if o.local_acc is not None:
                    g = o.local_acc.add_(g.detach().to(torch.float32))
                    o.local_acc = None
                self._post_reduce(o, g.detach())
            if self.reshard_after_forward:
                o.free()
        return hook

    def _blocks(self, o: _Owned) -> list[tuple[int, int]]:
        per_row = o.shape[1] * (4 if self.reduce_dtype == torch.float32 else 2) * max(self.world, 1)
        rows = max(1, self.bucket_bytes // max(per_row, 1))
        return [(b, min(b + rows, o.shape[0])) for b in range(0, o.shape[0], rows)] or [(0, 0)]

    def _rows(self, o: _Owned) -> list[int]:
        """scatter_gather's row blocks: rank b sums rows [sum(rows[:b]), +rows[b]) (as even as can be)."""
        base, extra = divmod(o.shape[0], self.world)
        return [base + (1 if b < extra else 0) for b in range(self.world)]

    def _post_reduce(self, o: _Owned, g: torch.Tensor) -> None:
        g = g.to(self.reduce_dtype).contiguous()
        if self.world == 1:
            self._pending.append((o, [], [g], []))
            return
        if self.reduce == "scatter_gather":
            # stage 1: every rank sends row block b to rank b (a reduce-scatter by data movement)
            rows = self._rows(o)
            mine = rows[self.rank]
            recv = g.new_empty((self.world * mine, o.shape[1]))
            work = dist.all_to_all_single(recv, g, [mine] * self.world, rows, group=self._reduce_pg, async_op=True)
            self._scattering.append((o, work, recv, mine))
            while len(self._scattering) > 2:  # stage 2 of the oldest, deterministically two behind
                self._gather_sums(*self._scattering.pop(0))
            return
        works, parts, blocks = [], [], self._blocks(o)
        for b, e in blocks:
            mine = g[b:e]
            gather = [torch.empty_like(mine) for _ in range(self.world)] if o.is_owner else None
            works.append(dist.gather(mine, gather, dst=o.owner, group=self._reduce_pg, async_op=True))
            parts.append((mine, gather))
        self._pending.append((o, works, parts, blocks))

    def _gather_sums(self, o: _Owned, work: Any, recv: torch.Tensor, mine: int) -> None:
        """scatter_gather's stage 2: this rank's block summed in fp32 in rank order, sent to the owner."""
        work.wait()
        acc = torch.empty((mine, o.shape[1]), dtype=torch.float32, device=recv.device)
        if mine:
            acc.copy_(recv[:mine])
            for r in range(1, self.world):
                acc.add_(recv[r * mine:(r + 1) * mine].to(torch.float32))
        rows = self._rows(o)
        send = [0] * self.world
        send[o.owner] = mine
        out = acc.new_empty((o.shape[0] if o.is_owner else 0, o.shape[1]))
        w2 = dist.all_to_all_single(out, acc, rows if o.is_owner else [0] * self.world, send,
                                    group=self._reduce_pg, async_op=True)
        self._pending.append((o, [w2], [("sums", out, acc)], [(0, o.shape[0])]))

    def _finish_backward(self) -> None:
        """End of a backward: wait for the reductions, write P.grad, free what the backward left."""
        self._callback_queued = False
        while self._scattering:
            self._gather_sums(*self._scattering.pop(0))
        for o, works, parts, blocks in self._pending:
            for w in works:
                w.wait()
            if not o.is_owner:
                if o.param.grad is None:
                    o.param.grad = o.param.data.new_empty((0, o.shape[1]))
                continue
            if self.world == 1:
                total = parts[0].to(torch.float32, copy=True)
            elif parts and isinstance(parts[0], tuple) and parts[0][0] == "sums":
                total = parts[0][1]  # scatter_gather: the owner received every block's fp32 sum
            else:
                total = torch.empty(o.shape, dtype=torch.float32, device=o.param.device)
                for (b, e), (_, gather) in zip(blocks, parts):
                    acc = total[b:e]
                    acc.copy_(gather[0])
                    for r in range(1, self.world):  # fp32, rank order
                        acc.add_(gather[r].to(torch.float32))
            total.div_(self.world)
            if o.param.grad is None:
                o.param.grad = total.to(o.param.dtype)
            else:
                o.param.grad.add_(total.to(o.param.grad.dtype))
        self._pending = []
        for u in self.units:
            if not u.swapped:
                self._reshard(u)

    # ---- state dict hooks ----------------------------------------------------------------------------

    def _state_dict_hook(self, u: _Unit) -> Callable:
        def hook(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
            for o in u.owned:  # owner only: one item in a checkpoint, loadable anywhere
                if not o.is_owner:
                    state_dict.pop(prefix + o.attr, None)
        return hook

    def _load_pre_hook(self, u: _Unit) -> Callable:
        def hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs) -> None:
            u.absent_keys = [prefix + o.attr for o in u.owned if not o.is_owner]
            for o in u.owned:
                key = prefix + o.attr
                value = state_dict.get(key)
                if value is not None and type(value).__name__ == "DTensor":
                    value = value.full_tensor()  # collective: every rank holds the key
                    state_dict[key] = value
                if value is not None and not o.is_owner:
                    state_dict.pop(key)  # the others hold no data
        return hook

    def _load_post_hook(self, u: _Unit) -> Callable:
        def hook(module: nn.Module, incompatible: Any) -> None:
            for k in u.absent_keys:  # exactly this module's keys held elsewhere (the pre-hook's)
                if k in incompatible.missing_keys:
                    incompatible.missing_keys.remove(k)
        return hook


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for x in output for t in _tensors(x)]
    if isinstance(output, dict):
        return [t for x in output.values() for t in _tensors(x)]
    return []


def _mesh_sizes(mesh: Any, world: int) -> tuple[int, int]:
    """(replicate, shard) of an FSDP (1-D) or HSDP (2-D: replicate, shard) mesh over the whole job."""
    if mesh is None:
        return 1, world
    shape = [int(s) for s in mesh.mesh.shape]
    if mesh.mesh.numel() != world or mesh.mesh.flatten().tolist() != list(range(world)):
        raise ValueError(f"[torch] own(mesh=...): the mesh {mesh.mesh.tolist()} must span all {world} ranks "
                         f"row-major (init_device_mesh over the world); owner placement is data parallel")
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    raise ValueError(f"[torch] own(mesh=...): a {len(shape)}-D mesh; give the FSDP (1-D) or HSDP (2-D "
                     f"replicate x shard) data-parallel mesh")


def _candidates(model: nn.Module) -> dict[str, tuple[nn.Module, str, nn.Parameter]]:
    """Eligible matrices by name: Muon 2-D weights (param_groups' rule), held by exactly one module
    under one name (a tied weight is not eligible), not yet a DTensor."""
    kinds = classify(model)
    holders: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for attr, p in module._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((f"{mname}.{attr}" if mname else attr, module, attr))
    out = {}
    for name, p in model.named_parameters():
        if kinds.get(name) != "muon" or p.ndim != 2 or type(p).__name__ == "DTensor":
            continue
        where = holders.get(id(p), [])
        if len(where) != 1 or owned_info(p) is not None:
            continue
        _, module, attr = where[0]
        out[name] = (module, attr, p)
    return out


def _choose(candidates: dict, select: Any, R: int, S: int, machine: Any, scatter_gather: bool) -> dict:
    """name -> (module, attr, param, why, owner rank or -1)."""
    names = list(candidates)
    if isinstance(select, str):
        if select not in SELECT_MODES:
            raise ValueError(f"[torch] own(select={select!r}): use 'auto' (the cost model), 'owner' / 'all' "
                             f"(every eligible matrix), a list of parameter names or globs, or a callable "
                             f"(name, param) -> bool")
        mode = "owner" if select in ("owner", "all") else "auto"
        picked = names
    elif callable(select):
        mode, picked = "owner", [n for n in names if select(n, candidates[n][2])]
    elif isinstance(select, Iterable):
        patterns = list(select)
        mode = "owner"
        picked = [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
        unmatched = [pat for pat in patterns if not any(fnmatch.fnmatchcase(n, pat) for n in names)]
        if unmatched:
            raise ValueError(f"[torch] own(select=...): {unmatched} match no eligible matrix (Muon 2-D "
                             f"weights held by one module); eligible: {names[:8]}{' ...' if len(names) > 8 else ''}")
    else:
        raise TypeError(f"[torch] own(select=...) takes a str, a list of names or a callable, "
                        f"got {type(select).__name__}")
    specs = []
    for n in picked:
        spec = _core.ParamSpec()
        spec.name, spec.shape, spec.role = n, list(candidates[n][2].shape), "muon"
        specs.append(spec)
    from ._plan import check_machine
    profile = check_machine(machine)
    choices = _core.choose_owner_placement(specs, R, S, mode, profile if profile is not None else "cpu",
                                           scatter_gather_reduce=scatter_gather) if specs else []
    out = {}
    for n, c in zip(picked, choices):
        module, attr, p = candidates[n]
        out[n] = (module, attr, p, c["why"], c["owner"] if c["owned"] else -1)
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
