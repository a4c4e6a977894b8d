"""Data-parallel ZeRO for meshmuon.torch.Muon (docs/python.md, "ZeRO", "reduce_grads").

ZeroOptions (_options.py) checks Muon's zero / reduce_grads / check_replicas. ZeroCore (`zero=True`;
a core of the engine, _engine.py, with the interface of _cores.py): plain parameters replicated on
every rank (a data-parallel job) are sharded Shard(0) over the world INSIDE the optimizer by a
native meshmuon.ShardedParams: fp32 master shards in one flat buffer (state key "master", as the
engine's bf16 masters), optimizer state only for this rank's rows, a meshmuon.Optimizer over the
shards (the planner's usual sharded strategies), then one all-gather (direct landing) writes the
masters into every rank's full torch parameters (fp32 bits, or bf16 rounded to nearest even). With
`reduce_grads` the step reduces each rank's local .grad to the shard owners in the documented fixed
order (fp32 sums in rank order, one division); without it the (DDP-reduced) .grad is sliced locally.
Bitwise the one-process step given the same (reduced) gradients.
"""
from __future__ import annotations

import time
from typing import Any, Optional

import torch

from .. import _core
from . import _comms, _device, _inventory
from ._layout import Layout


class ZeroCore:
    """ZeRO-1/2 over plain replicated parameters (see the module docstring). COLLECTIVE: construction
    and step() on every rank in the same order."""

    kind = "zero"

    def __init__(self, param_groups: list[dict], targets: list[torch.Tensor], layouts: list[Layout],
                 qk_tags: dict, options: Any):
        self.params = targets
        _comms.release_at_exit(self)  # native objects released in order at exit
        zero = options.zero
        self.reduce_grads, self.check_replicas = zero.reduce_grads, zero.check_replicas

        def check(name: str, p: torch.Tensor, layout: Layout) -> None:  # every check before any collective
            if layout.placed:
                raise ValueError(f"[torch] zero=True shards plain (replicated) parameters, but "
                                 f"parameter '{name}' is {layout.describe()}: leave zero=False, "
                                 f"such parameters already keep their state on their ranks")
            if p.ndim == 0:
                raise ValueError(f"[torch] zero=True shards parameters by rows, but parameter "
                                 f"'{name}' is a 0-dim scalar: make it shape [1] or leave zero=False")

        inventory, groups, self.names = _inventory.build(param_groups, layouts, qk_tags, None, check)
        specs = list(inventory.params)
        self.device = _device.engine_device(self.params, self.names)
        world = _comms.world_size()
        self.mesh, self._layouts = None, None
        if world > 1:
            if not torch.distributed.is_initialized():
                raise ValueError(f"[torch] zero=True on {world} ranks needs torch.distributed (its "
                                 f"state is DTensors over the ranks): call "
                                 f"meshmuon.torch.init_distributed() before building the optimizer")
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Shard
            self.mesh = init_device_mesh(self.device.split(":")[0], (world,), mesh_dim_names=("zero",))
            self._layouts = [Layout(shape=lay.shape, local=lay.local, mesh=self.mesh, placements=(Shard(0),),
                                    stride=tuple(torch.empty(lay.shape, device="meta").stride()))
                             for lay in layouts]
        comm = _comms.communicator(world, self.device)
        mesh = _core.Mesh([("dp_shard", world)] if world > 1 else [])
        self.sp = _core.ShardedParams(comm, mesh, specs, reduce=self.reduce_grads or "mean",
                                      device=self.device)
        # the distributed engine's options of the constructor (window, chunk_bytes, strategy pins,
        # replica, machine, timeout_s, exact), as for _engine.Engine; the device's cost model by
        # default; the optimizer runs on the masters' device
        kwargs = options.core_kwargs(self.device)
        del kwargs["device"]
        self.native = self.sp.make_optimizer(groups, options.non_finite, options.comm_dtype, **kwargs)
        self.rows = []
        for i, p in enumerate(self.params):  # masters from this rank's rows of its replica
            rows = self.sp.local_box(i)
            begin, end = rows[0] if rows else (0, 0)
            self.rows.append((begin, end))
            self.sp.param(i).copy_(p.detach()[begin:end])
        self.masters = [self.sp.param(i) for i in range(len(self.params))]
        self.grad_shards = list(self.sp.grads())
        _comms.track_engine_tensors(self.masters + self.grad_shards)  # emptied at exit (_comms)
        self._stats: dict = {}

    # ---- the interface of a core (_cores.py) -------------------------------------------------------

    def state_layout(self, i: int) -> Optional[Layout]:
        """Shard(0) over the "zero" mesh (None on one rank: the parameter's own, whole)."""
        return None if self._layouts is None else self._layouts[i]

    def last_stats(self) -> Optional[dict]:
        """The optimizer step's counters (meshmuon::StepStats) plus reduce_seconds, reduce_bytes_sent,
        reduce_bytes_recv (reduce_grads) and unshard_seconds."""
        return dict(self.native.last_stats(), **self._stats) if self._stats else None

    def step(self, params: list[torch.Tensor], grads: list[Optional[torch.Tensor]],
             qk_logits: dict[int, list[float]]) -> bool:
        stats = {}
        if self.reduce_grads is not None:
            full = [None if g is None else g.detach().contiguous() for g in grads]
            _device.wait_for_caller(self.device)  # what the caller's stream writes into them
            t0 = time.perf_counter()
            self.sp.reduce_grads_from(full)
            r = self.sp.last_reduce_stats()
            stats.update(reduce_seconds=time.perf_counter() - t0, reduce_bytes_sent=r["bytes_sent"],
                         reduce_bytes_recv=r["bytes_recv"])
            # a gradient absent on one rank only: the step's agreement raises on every rank
            shards = [None if g is None else self.grad_shards[i] for i, g in enumerate(grads)]
        else:
            if self.check_replicas:
                self._check_replicas(grads)
            shards = []
            for (begin, end), g in zip(self.rows, grads):
                shards.append(None if g is None else g.detach().contiguous()[begin:end])
        self.native.set_stream(_device.caller_stream(self.device))  # ordered on the device, as _engine's
        applied = self.native.step(_device.engine_arrays(self.masters), _device.engine_arrays(shards), qk_logits)
        if applied:  # agreed on every rank, so the all-gather is collective
            # The masters the step wrote are read on this thread's stream, after the step's tail
            # (the step queued it there); unshard_into completes before it returns.
            t0 = time.perf_counter()
            targets = [p.detach() for p in params]
            shadows = [t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
                       for t in targets]
            self.sp.unshard_into(shadows)  # a non-contiguous parameter through a contiguous copy
            for t, shadow in zip(targets, shadows):
                if shadow is not t:
                    t.copy_(shadow)
            stats["unshard_seconds"] = time.perf_counter() - t0
        self._stats = stats
        return applied

    def _check_replicas(self, grads: list[Optional[torch.Tensor]]) -> None:
        """check_replicas=True: every rank's gradient must be bitwise the same (DDP-reduced). One
        all-reduce of per-parameter digests (presence, bit sums); ValueError on every rank naming the
        first parameter that differs."""
        import torch.distributed as dist
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return
        digests = torch.zeros(len(grads), 3, dtype=torch.int64)
        for i, g in enumerate(grads):
            if g is None:
                continue
            bits = g.detach().contiguous().view(torch.int16 if g.element_size() == 2 else torch.int32)
            wide = bits.reshape(-1).to(torch.int64)
            digests[i, 0] = 1
            digests[i, 1] = wide.sum()
            digests[i, 2] = (wide * (torch.arange(wide.numel(), dtype=torch.int64, device=wide.device)
                                     % 65521 + 1)).sum()
        both = torch.cat([digests.reshape(-1), -digests.reshape(-1)])
        if self.device != "cpu" and "gloo" not in str(dist.get_backend()):
            both = both.to(self.device)  # a process group without gloo reduces device tensors only
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        n = digests.numel()
        both = both.cpu()
        differs = (both[:n] != -both[n:]).reshape(-1, 3).any(dim=1)
        if bool(differs.any()):
            i = int(differs.nonzero()[0, 0])
            raise ValueError(f"[torch] check_replicas: the gradient of '{self.names[i]}' differs "
                             f"between ranks (or is None on some); with zero=True and "
                             f"reduce_grads=None every rank must hold the same, already reduced "
                             f"gradient (DDP); pass reduce_grads='mean' to reduce local gradients "
                             f"inside step()")
