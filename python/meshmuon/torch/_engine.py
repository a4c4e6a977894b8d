"""The engine behind meshmuon.torch.Muon: builds the engine's inventory from the torch param groups
once (again only when groups change), exposes its state as torch tensors, and runs steps.

One class over two native cores. meshmuon.Optimizer (kind "distributed") runs DTensor parameters
(FSDP2 / HSDP / TP / EP) over their local shards, and plain tensors of a job of several ranks with
a meshmuon communicator (init_distributed() or mpirun) as Replicate on a 1-D "world" mesh; it is
collective. meshmuon.LocalOptimizer (kind "local") runs one process, and plain tensors of a job meshmuon
has no communicator for (torchrun: each rank steps its replica alone). Either runs on the device of
the parameters' (local) tensors, the CPU or one CUDA device (_device.py), with the communicator of
that device (_comms.py); DTensor layouts map to the engine's through _layouts.py. The engine that
wraps it for bf16 parameters is in _master.py, ZeRO's in _zero.py; _factory.py picks one.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Optional

import torch

from .. import _core
from . import _comms, _device
from ._layouts import (as_layout, check_local_shards, engine_placement, is_dtensor, lift_to_job,
                       local_grad, mesh_key)
from ._options import make_group_options
from ._owned import owned_info

QK_KEYS = ("layer", "kind", "heads", "head_dim", "rope_dim", "v_dim")

# The distributed core's options (window, chunk_bytes, strategy pins, replica, machine, timeout_s,
# exact, offload_state; the local core reads offload_state only) for the Engines built inside `with engine_options(...)`: Muon sets them around building its
# engine, so they reach an Engine also when another engine class wraps it. None: the defaults.
_OPTIONS: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("meshmuon_engine_options",
                                                                         default=None)


@contextlib.contextmanager
def engine_options(options: dict) -> Iterator[None]:
    token = _OPTIONS.set(dict(options))
    try:
        yield
    finally:
        _OPTIONS.reset(token)


def current_engine_options() -> Optional[dict]:
    """The options of the engine being built (meshmuon.Optimizer keyword arguments), or None."""
    return _OPTIONS.get()


def engine_core_options(options: Optional[dict], device: str) -> dict:
    """The native core's keyword arguments: Muon's engine options with the device, and the cost
    model's constants those of the device the step runs on unless Muon's `machine` says otherwise."""
    out = dict(options or {})
    if out.get("machine") is None:
        out["machine"] = _device.default_machine(device)
    out["device"] = device
    return out


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


def param_name(group: dict, group_index: int, j: int) -> str:
    names = group.get("param_names")
    return str(names[j]) if names else f"param_groups[{group_index}][{j}]"


def engine_kind(params: list[torch.Tensor], requested: Optional[str]) -> str:
    """'distributed' for DTensor parameters, or plain ones in a job of several ranks that meshmuon has
    a communicator for; 'local' otherwise. `requested` ("local" / "distributed") overrides."""
    dtensors = any(is_dtensor(p) or owned_info(p) is not None for p in params)
    if requested == "local" and dtensors:
        raise ValueError("[torch] engine='local' cannot run DTensor or owned (meshmuon.torch.own) "
                         "parameters; leave engine=None")
    if requested is not None:
        return requested
    return "distributed" if dtensors or _comms.job_size() > 1 else "local"


class CoreDelegate:
    """What every engine forwards to its native core (`self.core`: meshmuon.Optimizer or
    meshmuon.LocalOptimizer) unchanged: group options and per-parameter step counts."""

    def options(self, g: int) -> "_core.GroupOptions":
        return self.core.options(g)

    def step_count(self, i: int) -> int:
        return self.core.step_count(i)

    def set_step_count(self, i: int, count: int) -> None:
        self.core.set_step_count(i, count)


class Engine(CoreDelegate):
    """One native core over the optimizer's parameters. `params` is the flat list in group order
    (the order of the optimizer's state_dict); `qk_tags` maps id(param) to its QkTag."""

    def __init__(self, param_groups: list[dict], qk_tags: dict[int, "_core.QkTag"],
                 non_finite: str, comm_dtype: str, threads: int = 0, kind: Optional[str] = None):
        self.params: list[torch.Tensor] = [p for group in param_groups for p in group["params"]]
        self.kind = engine_kind(self.params, kind)
        distributed = self.kind == "distributed"
        world = _comms.world_size() if distributed else 1
        inventory, groups = self._inventory(param_groups, qk_tags, world)
        self.names: list[str] = [spec.name for spec in inventory.params]
        # the parameters' device (all alike): the backend the step runs on
        self.device = _device.engine_device(self.params, self.names)
        self._state_cache: dict[int, dict[str, torch.Tensor]] = {}
        _comms.release_at_exit(self)  # native objects released in order at exit
        if not distributed:  # of Muon's engine options, the local core takes offload_state
            offload = bool((_OPTIONS.get() or {}).get("offload_state", False))
            self.core = _core.LocalOptimizer([_info(spec) for spec in inventory.params], groups,
                                             non_finite, comm_dtype, threads, offload, self.device)
            return
        inventory.validate()
        check_local_shards(self.params, inventory, self.names)  # before any collective
        self.comm = _comms.communicator(world, self.device)
        options = engine_core_options(_OPTIONS.get(), self.device)
        self.core = _core.Optimizer(self.comm, inventory, groups, non_finite, comm_dtype, **options)

    def _inventory(self, param_groups: list[dict], qk_tags: dict, world: int):
        """The engine's inventory (one meshmuon.Mesh per distinct DeviceMesh; plain tensors Replicate on
        a 1-D "world" mesh, no mesh dims in one process) and its groups; sets self.layouts (per
        parameter its DTensor's (mesh, placements), None for a plain tensor)."""
        inventory = _core.Inventory()
        inventory.model = "torch"
        mesh_index: dict[tuple, int] = {}
        specs, groups, meshes, mesh_names, self.layouts = [], [], [], [], []

        def engine_mesh(key: tuple) -> int:
            if key not in mesh_index:
                mesh_index[key] = len(meshes)
                meshes.append(_core.Mesh([(n, s) for n, s in key]))
                mesh_names.append("x".join(n for n, _ in key) or "world")
            return mesh_index[key]

        for g, group in enumerate(param_groups):
            pg = _core.ParamGroup()
            pg.options = make_group_options(group, g)
            muon = group.get("algorithm", "muon") == "muon"
            indices = []
            for j, p in enumerate(group["params"]):
                spec = _core.ParamSpec()
                spec.name = param_name(group, g, j)
                spec.shape = list(p.shape)
                spec.role = "muon" if muon else "adamw"
                spec.expert = muon and p.ndim == 3 and bool(group.get("expert_stacks"))
                owned = owned_info(p)
                if owned is not None:  # owner placement (_owned.py): whole on one world rank
                    spec.shape = list(owned.shape)
                    key = (("world", world),)
                    spec.mesh = engine_mesh(key)
                    spec.placements = [_core.Placement.owned(owned.owner)]
                    self.layouts.append(None)
                elif is_dtensor(p):
                    where = f"parameter '{spec.name}'"
                    mesh, placements = lift_to_job(p.device_mesh, list(p.placements), world, where)
                    spec.mesh = engine_mesh(mesh_key(mesh))
                    spec.placements = [engine_placement(pl, p.ndim, where) for pl in placements]
                    self.layouts.append((p.device_mesh, tuple(p.placements)))
                else:
                    key = (("world", world),) if world > 1 else ()
                    spec.mesh = engine_mesh(key)
                    spec.placements = [_core.Placement.replicate()] * len(key)
                    self.layouts.append(None)
                tag = qk_tags.get(id(p))
                if tag is not None:
                    spec.qk = tag
                indices.append(len(specs))
                specs.append(spec)
            pg.params = indices
            groups.append(pg)
        inventory.meshes, inventory.mesh_names, inventory.params = meshes, mesh_names, specs
        return inventory, groups

    # ---- the interface Muon uses -----------------------------------------------------------------

    def state(self, i: int) -> dict[str, torch.Tensor]:
        """State of parameter i as tensors aliasing the engine's memory (stable pointers): plain
        tensors for a plain parameter, DTensors with the parameter's mesh and placements for a
        DTensor one. Cached: the same objects each call."""
        cached = self._state_cache.get(i)
        if cached is None:
            cached = {key: as_layout(self.core.state(i, key), self.layouts[i], self.params[i], key)
                      for key in self.core.state_keys(i)}
            _comms.track_engine_tensors(cached.values())  # emptied at exit (_comms)
            self._state_cache[i] = cached
        return dict(cached)

    def last_stats(self) -> Optional[dict]:
        return self.core.last_stats()  # both cores: meshmuon::StepStats of the last step

    def step(self, params: list[torch.Tensor], grads: list[Optional[torch.Tensor]],
             qk_logits: dict[int, list[float]]) -> bool:
        # detach(): the engine writes the parameters in place, outside autograd; the views share
        # storage (zero-copy).
        local_params, local_grads, shadowed = [], [], []
        for i, (p, g) in enumerate(zip(params, grads)):
            if is_dtensor(p):
                p, g = p._local_tensor, local_grad(g, self.layouts[i], self.names[i])
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
        self.core.set_stream(_device.caller_stream(self.device))
        applied = self.core.step(_device.engine_arrays(local_params),
                                 _device.engine_arrays(local_grads), qk_logits)
        for p, shadow in shadowed:  # exact copies both ways: bitwise the contiguous step
            p.copy_(shadow)
        return applied


def _info(spec: "_core.ParamSpec") -> "_core.ParamInfo":
    """The local core's view of an inventory parameter (whole, unplaced)."""
    info = _core.ParamInfo()
    info.name, info.shape, info.expert_stack = spec.name, spec.shape, spec.expert
    if spec.qk is not None:
        info.qk = spec.qk
    return info
