"""The native cores the engine (_engine.py) steps with, all with one interface: `kind`, `native` (the
meshmuon object: options(g), step_count, set_step_count, state, plan, last_stats, set_stream), `names`,
`state_layout(i)` (the layout model's Layout its state takes, or None: the parameter's own),
`masters` (fp32 masters the core keeps itself, or None), `step(targets, grads, qk_logits)`.

- LocalCore: meshmuon.LocalOptimizer, one process (and plain tensors of a job meshmuon has no
  communicator for: torchrun, each rank stepping its replica alone).
- DistributedCore: meshmuon.Optimizer over the job's communicator: DTensor parameters (FSDP2 / HSDP /
  TP / EP) over their local shards, owned ones (Owned(k)), plain ones Replicate on a "world" mesh;
  collective.
- ZeroCore (_zero.py): ZeRO over plain replicated parameters through meshmuon.ShardedParams.
Each runs on the device of the parameters' (local) tensors (_device.py) with the communicator of
that device (_comms.py).
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import _core
from . import _comms, _device, _inventory
from ._layout import Layout, check_local_shards


class InPlaceCore:
    """What the local and distributed cores share: the parameters' local tensors stepped in place."""

    masters = None

    def __init__(self, layouts: list[Layout]):
        self.layouts = layouts
        _comms.release_at_exit(self)  # native objects released in order at exit

    def last_stats(self) -> Optional[dict]:
        return self.native.last_stats()  # both cores: meshmuon::StepStats of the last step

    def state_layout(self, i: int) -> Optional[Layout]:
        return None  # the parameter's own

    def step(self, targets: list[torch.Tensor], grads: list[Optional[torch.Tensor]],
             qk_logits: dict[int, list[float]]) -> bool:
        """Steps `targets` (the parameters, or their fp32 masters: tensors of the parameters' layouts)
        in place. detach(): the engine writes outside autograd; the views share storage (zero-copy)."""
        local_params, local_grads, shadowed = [], [], []
        for i, (p, g) in enumerate(zip(targets, grads)):
            layout = self.layouts[i]
            p, g = layout.local_of(p), layout.local_grad(g, self.names[i])
            p = p.detach()
            if not p.is_contiguous() and g is not None:
                # The engine steps a contiguous copy, copied back after the step; made at each step
                # (p may have been written between steps). Contiguous parameters stay zero-copy.
                shadow = p.contiguous()
                shadowed.append((p, shadow))
                p = shadow
            local_params.append(p)
            if g is not None and (self.kind == "distributed" or not g.is_contiguous()):
                g = g.detach().contiguous()  # no copy when contiguous (FSDP2's are)
            local_grads.append(g)  # None: the engine leaves the parameter untouched
        # Ordered with the caller's current stream on the device (None on the CPU): _device.caller_stream.
        self.native.set_stream(_device.caller_stream(self.device))
        applied = self.native.step(_device.engine_arrays(local_params),
                                   _device.engine_arrays(local_grads), qk_logits)
        for p, shadow in shadowed:  # exact copies both ways: bitwise the contiguous step
            p.copy_(shadow)
        return applied


class LocalCore(InPlaceCore):
    """meshmuon.LocalOptimizer over whole tensors in this process."""

    kind = "local"

    def __init__(self, param_groups: list[dict], targets: list[torch.Tensor], layouts: list[Layout],
                 qk_tags: dict, options: "EngineOptions"):
        super().__init__(layouts)
        inventory, groups, self.names = _inventory.build(param_groups, layouts, qk_tags, world=1)
        self.device = _device.engine_device(targets, self.names)
        self.native = _core.LocalOptimizer([_inventory.param_info(spec) for spec in inventory.params],
                                           groups, options.non_finite, options.comm_dtype, options.threads,
                                           options.offload_state, self.device)


class DistributedCore(InPlaceCore):
    """meshmuon.Optimizer over the job's communicator (collective: construction and step)."""

    kind = "distributed"

    def __init__(self, param_groups: list[dict], targets: list[torch.Tensor], layouts: list[Layout],
                 qk_tags: dict, options: "EngineOptions"):
        super().__init__(layouts)
        world = _comms.world_size()
        inventory, groups, self.names = _inventory.build(param_groups, layouts, qk_tags, world=world)
        self.device = _device.engine_device(targets, self.names)
        inventory.validate()
        local = [lay.local_of(t) for t, lay in zip(targets, layouts)]
        check_local_shards(local, layouts, self.names, world)  # before any collective
        self.comm = _comms.communicator(world, self.device)
        self.native = _core.Optimizer(self.comm, inventory, groups, options.non_finite, options.comm_dtype,
                                      **options.core_kwargs(self.device))

