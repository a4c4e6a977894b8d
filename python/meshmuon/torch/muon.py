"""meshmuon.torch.Muon: a torch.optim.Optimizer whose step runs in meshmuon's native engine, with the
numerics of torch.optim.Muon (Muon groups) and torch.optim.AdamW (AdamW groups). See docs/python.md.
"""
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Optional, Union

import torch

from . import _clip, _comms, _group_checks, _options, _plan, _precision, _qk_layout, _rebind, _state_dict
from ._layout.owner.state_dict import drop_elsewhere_state
from ._engine import Engine, EngineOptions
from ._layout import copy_into
from ._options import MUON_DEFAULTS, MUON_ONLY, STRUCTURAL, apply_group, check_group_keys
from ._profile import StepPhases
from .options import Distribution, EngineConfig, Memory, merge

_GRAD_DTYPES = (torch.float32, torch.bfloat16)
# Muon.__init__'s locals that are not options by name
_NOT_OPTIONS = {"self", "params", "engine", "distribution", "memory", "option_fields", "__class__"}


class Muon(torch.optim.Optimizer):
    """Muon (and AdamW) with a native step. The arguments, in three groups:

    1. torch.optim.Muon's (positional as there): lr, weight_decay, momentum, nesterov,
       ns_coefficients, eps, ns_steps, adjust_lr_fn.
    2. meshmuon's algorithm options, keyword-only, each also a param-group key (docs/python.md):
       ns_schedule, ns_method, ns_scale, eps_mode, ns_bf16, ns_matmul_dtype, momentum_kind,
       cautious_wd, decay_lr, muon_eq, muon_plus, normuon, normuon_beta2, qk_clip_threshold; and
       qk_layout / clip_config (QK-clip tags), adamw_defaults (AdamW groups' defaults, torch.optim.AdamW's
       otherwise).
    3. How the step runs, in option objects (meshmuon.torch.options): `engine=EngineConfig(kind,
       threads, non_finite)` (or a kind string, "local" / "distributed"), `distribution=
       Distribution(comm_dtype, window, chunk_bytes, strategy, replica, machine, timeout_s,
       allow_inexact)`, `memory=Memory(offload_state, zero, reduce_grads, check_replicas, none_grad)`.
       Each field is also accepted as a keyword by its name (`Muon(..., window=4)`), never both ways.

    Groups are explicit: `algorithm="muon"` (the default; 2-D matrices, or 3-D expert stacks
    [E, A, B] in groups with `expert_stacks=True`) or `algorithm="adamw"` (any shape);
    `meshmuon.torch.param_groups(model)` builds them.

    QK-clip: `qk_layout={param_or_name_or_module: dict(layer=, kind=, heads=, head_dim=,
    rope_dim=0, v_dim=0)}` tags attention weights once (`clip_config` tags them by names,
    Motif-style); a Muon group with qk_clip_threshold > 0 then needs
    `step(qk_logits={layer: per-query-head max logits})`.

    State (created eagerly, the same keys for every parameter of an algorithm): Muon
    `momentum_buffer` (+ `normuon_v`, the factored second moment [A, 1] or [1, B], with NorMuon),
    AdamW `exp_avg`, `exp_avg_sq`; every parameter has `step` (fp32 0-dim tensor). The tensors
    alias the engine's memory: they are updated in place, their data_ptr never changes.

    DTensor parameters (FSDP2 / HSDP / TP / EP; launch with mpirun and call
    meshmuon.torch.init_distributed()) and owned ones (meshmuon.torch.own) run on the distributed
    core over their local shards; their state tensors are DTensors with the parameter's mesh and
    placements (DCP reshards them). Plain tensors of a job of several ranks with a meshmuon
    communicator (mpirun) run there too, replicated. Construction and step() are then collective.
    `engine="local"` / `"distributed"` overrides the choice (tests, diagnostics). Tensors replaced in
    param_groups after construction (Accelerate's FSDP2 prepare()) are noticed at the next step,
    state_dict or load_state_dict: the engine is rebuilt for them, state carried by position and
    global shape. See docs/python.md.

    The Distribution options are checked by both cores and ignored by the local one.
    `offload_state=True` (both cores) stages each chunk's state to the device ahead of use (bitwise
    the same results; on the cpu backend the same copies, a cost: it is there so the mechanism is
    tested); `last_step_stats` then reports offload_bytes_in / offload_bytes_out and
    peak_state_resident_bytes. `opt.plan()` returns the plan, `opt.last_step_stats` the last step's
    figures; the step opens torch.profiler ranges meshmuon.step / .collect_grads / .engine /
    .write_back.
    """

    def __init__(
        self,
        params,
        # torch.optim.Muon's hyperparameters, names and defaults
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = MUON_DEFAULTS["ns_coefficients"],
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: Optional[str] = None,
        *,
        # meshmuon's algorithm options (also group keys, docs/python.md)
        ns_schedule: Optional[str] = None,
        ns_method: str = "symmetric",
        ns_scale: float = 1.0,
        eps_mode: str = "clamp",
        ns_bf16: bool = False,
        ns_matmul_dtype: str = "auto",
        momentum_kind: str = "ema",
        cautious_wd: bool = False,
        decay_lr: str = "unadjusted",
        muon_eq: bool = False,
        muon_plus: bool = False,
        normuon: bool = False,
        normuon_beta2: float = 0.95,
        qk_clip_threshold: float = 0.0,
        qk_layout: Optional[dict] = None,
        clip_config: Optional[dict] = None,
        adamw_defaults: Optional[dict] = None,
        # how the step runs (meshmuon.torch.options); each field also accepted as a keyword
        engine: Union[None, str, EngineConfig] = None,
        distribution: Optional[Distribution] = None,
        memory: Optional[Memory] = None,
        **option_fields: Any,
    ) -> None:
        # Every argument by name: check_constructor reads the Muon group keys among them from
        # MUON_DEFAULTS (a new group key is one entry there) and checks the rest in one pass.
        given = {k: v for k, v in locals().items() if k not in _NOT_OPTIONS}
        given.update(merge(engine, distribution, memory, option_fields))
        given["engine"] = given.pop("kind")
        defaults, options = _options.check_constructor(given)
        vars(self).update(options)
        self._clip_masks, self._last_phases = {}, None
        self._engine = None
        self.engine_builds = 0  # how often the engine's inventory was built (tests, diagnostics)
        params = _group_checks.checked_param_list(params)  # every group's unknown keys named at once
        super().__init__(params, defaults)
        _comms.release_at_exit(self)  # its state aliases engine memory: cleared at exit
        self._rebuild_engine()

    # ---- groups --------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch.optim.Optimizer.add_param_group, with the group's algorithm defaults and
        meshmuon's checks first (TypeError / ValueError before anything changes); rebuilds the
        engine's inventory when the optimizer already exists (state of existing parameters kept)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        if self._engine is not None:
            self._follow_params()  # tensors swapped before keep their state by position
        index = len(self.param_groups)
        algorithm = check_group_keys(param_group, index)
        _group_checks.check_params(param_group, index, algorithm, self.param_groups,
                                   bool(self.defaults.get("expert_stacks", False)))
        user_keys = set(param_group)
        param_group["algorithm"] = algorithm
        if algorithm == "adamw":
            for key, value in self._adamw_defaults.items():
                param_group.setdefault(key, value)
        super().add_param_group(param_group)
        if algorithm == "adamw":  # drop the Muon keys the base class filled in from self.defaults
            for key in MUON_ONLY - user_keys:
                param_group.pop(key, None)
        if self._engine is not None:
            try:
                self._rebuild_engine()
            except Exception:
                self.param_groups.pop()
                raise

    def _qk_tags(self) -> dict:
        """The engine's QK tags by parameter id (qk_layout and clip_config resolved); sets the
        clip_config head masks."""
        tags, self._clip_masks = _qk_layout.qk_tags(self.param_groups, self._qk_layout,
                                                    self._clip_config)
        return tags

    def _engine_options(self) -> EngineOptions:
        """The engine's options: the constructor's, with the strategy pins of the constructor and of
        the groups' `strategy` keys (the local core ignores the distributed options)."""
        rules, default = self._strategy
        groups = [([n for n in g.get("param_names", [])] or
                   [f"param_groups[{i}][{j}]" for j in range(len(g["params"]))],
                   _plan.group_strategy(g, i)) for i, g in enumerate(self.param_groups)]
        dist = dict(self._dist_options, strategy=_plan.strategy_rules(rules, default, groups))
        return EngineOptions(non_finite=self._non_finite, comm_dtype=self._comm_dtype, threads=self._threads,
                             kind=self._engine_kind, offload_state=self._offload_state, dist=dist,
                             zero=self._zero)

    def _rebuild_engine(self, carry: Optional[dict] = None) -> None:
        """A new engine for the groups; the state of each parameter the old engine had (by id, or
        `carry`: {id(new tensor): index of the old one}) is copied into it."""
        old, old_index = self._engine, carry or {}
        if old is not None and carry is None:
            old_index = {id(p): i for i, p in enumerate(old.params)}
        # The core: distributed for DTensors, and for plain tensors of a multi-rank job with a
        # meshmuon communicator (replicated; the planner places the work); local otherwise.
        _precision.check_groups(self.param_groups)
        engine = Engine(self.param_groups, self._qk_tags(), self._engine_options())
        # Each parameter's "step" (a 0-d float32 tensor, as torch's optimizers keep it) is a view of
        # one counter vector, so a step counts them all with one add (a foreach add over 48 0-d CPU
        # tensors costs ~60 us a step; the vector's add ~2 us).
        counts = torch.zeros(len(engine.params), dtype=torch.float32, device="cpu")
        step_tensors = []
        for i, p in enumerate(engine.params):
            state = engine.state(i)
            j = old_index.get(id(p))
            if j is not None:  # carry the state of parameters the old engine had
                for key, value in old.state(j).items():
                    if key in state:
                        copy_into(state[key], value)
                engine.set_step_count(i, old.step_count(j))
            step = counts[i]
            step.fill_(float(engine.step_count(i)))
            state["step"] = step
            step_tensors.append(step)
            self.state[p] = state
        kept = {id(p) for p in engine.params}
        for p in (old.params if old is not None else []):  # a replaced tensor's state goes
            if id(p) not in kept:
                self.state.pop(p, None)
        self._engine, self._step_counts, self._step_tensors = engine, counts, step_tensors
        self._built_params = [list(g["params"]) for g in self.param_groups]
        self._built = [{k: g.get(k) for k in STRUCTURAL} for g in self.param_groups]
        self._built_strategy = [g.get("strategy") for g in self.param_groups]
        self.engine_builds += 1

    def _follow_params(self) -> None:
        """A new engine when param_groups hold other tensors than those it was built from
        (Accelerate's FSDP2 prepare() swaps them in place), the state carried by position; a
        ValueError naming the group and parameter when they do not match (_rebind.py). Collective
        like construction when the engine is distributed."""
        if _rebind.swapped(self._built_params, self.param_groups):
            carry = _rebind.carry_map(self._built_params, self.param_groups,
                                      bool(self.defaults.get("expert_stacks", False)))
            self._qk_layout = _rebind.remap_keys(self._qk_layout, self._built_params,
                                                 self.param_groups)
            self._rebuild_engine(carry)

    # ---- step ----------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, *,
             qk_logits: Optional[dict] = None) -> float | None:
        """One optimizer step (see torch.optim.Optimizer.step). `qk_logits` (keyword only, after
        the base class's `closure`): {layer: per-query-head max pre-softmax logits} for QK-clip.
        Parameters whose .grad is None are left untouched (state included), as torch does.
        With the distributed engine the step is COLLECTIVE: every rank calls it, also a rank whose
        gradients are all None, and the ranks agree on which gradients exist, step counts,
        hyperparameters and policies; any difference raises meshmuon.MeshmuonError on every rank,
        naming it, before anything is modified."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Profiler ranges meshmuon.step > meshmuon.collect_grads, meshmuon.engine, meshmuon.write_back (and
        # their wall times in last_step_stats).
        with StepPhases("meshmuon.step") as phases:
            return self._step(loss, qk_logits, phases)

    def _step(self, loss, qk_logits: Optional[dict], phases: StepPhases):
        phases.phase("meshmuon.collect_grads")
        self._follow_params()  # never a step of tensors the groups no longer hold
        engine = self._engine
        for g, group in enumerate(self.param_groups):
            for key in STRUCTURAL:
                if key in group and group[key] != self._built[g].get(key):
                    raise ValueError(f"[torch] param group {g}: {key} changed after construction "
                                     f"(the state layout depends on it); build a new optimizer")
            if group.get("strategy") != self._built_strategy[g]:
                raise ValueError(f"[torch] param group {g}: strategy changed after construction (the "
                                 f"plan is made once); build a new optimizer")
        grads, present = [], []
        for i, p in enumerate(engine.params):
            grad = p.grad
            if grad is None:  # left untouched by the engine (values, state, step), as torch does
                grads.append(None)
                continue
            if grad.dtype not in _GRAD_DTYPES:
                raise TypeError(f"[torch] gradient of '{engine.names[i]}' is {grad.dtype}; "
                                f"gradients must be float32 or bfloat16")
            if grad.is_sparse or grad.layout != torch.strided:
                raise TypeError(f"[torch] gradient of '{engine.names[i]}' is sparse; meshmuon needs "
                                f"dense gradients")
            grads.append(grad.detach() if grad.requires_grad else grad)
            present.append(i)
        if not present and engine.kind == "local":
            return loss  # one process, nothing to do (a distributed step is collective: it runs)
        _precision.check_groups(self.param_groups)
        for g, group in enumerate(self.param_groups):
            apply_group(engine.options(g), group, g)
        logits = _clip.mask_logits(_clip.logits_of(qk_logits), self._clip_masks)
        phases.phase("meshmuon.engine")
        self._last_phases = phases
        applied = engine.step(grads, logits)
        phases.phase("meshmuon.write_back")
        if applied:
            if len(present) == len(grads):
                self._step_counts.add_(1.0)
            elif present:
                counts = self._step_counts  # (not the default dtype or device: they may have changed)
                counts.index_add_(0, torch.tensor(present, device=counts.device),
                                  torch.ones(len(present), dtype=counts.dtype, device=counts.device))
        if self._none_grad:  # Motif's none_grad: the step has consumed the gradients
            for i in present:
                engine.params[i].grad = None
        return loss

    # ---- state dict ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """As torch.optim.Optimizer.state_dict; the state of a matrix owned by another rank
        (meshmuon.torch.own) holds its "step" only: each owned matrix's state is saved once, by its
        owner (DCP reshards it into any owner or layout). Follows swapped tensors, but only where the
        groups kept their shape: groups edited by hand (torch allows repeating them) serialize as
        torch serializes them, and the next step() names the edit."""
        if _rebind.same_structure(self._built_params, self.param_groups):
            self._follow_params()
        return drop_elsewhere_state(self, super().state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch.optim.Optimizer.load_state_dict, in its order: the load_state_dict pre-hooks
        (a returned dict replaces the input), the checks (ValueError before anything changes when
        groups, algorithms or state shapes differ, or the dict is another optimizer's), the values
        copied into the engine's state tensors (which stay the ones in self.state, same data_ptr),
        then the post-hooks (they see the loaded state; a value they replace in self.state is
        copied into the engine). Loads meshmuon's dicts and torch.optim.Muon's (docs/python.md)."""
        self._follow_params()
        _state_dict.load(self, state_dict)

    # ---- copy and pickle -----------------------------------------------------------------------

    # What a copy rebuilds its engine from: the constructor's checked options (not the engine).
    _CONFIG = ("_zero", "_dist_args", "_strategy", "_none_grad", "_clip_config", "_comm_dtype",
               "_threads", "_offload_state", "_engine_kind", "_adamw_defaults", "_non_finite",
               "_qk_layout", "engine_builds")

    def __getstate__(self) -> dict[str, Any]:
        """The base class's (defaults, state, param_groups) and the constructor's options; the
        engine is not pickled: __setstate__ builds a new one (copy.deepcopy and pickle)."""
        state = super().__getstate__()
        state.update({key: self.__dict__[key] for key in self._CONFIG})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (copy.deepcopy) or an unpickled optimizer: its own engine, built from its groups
        (as the constructor does), with the saved state loaded: its next step equals the
        original's. In a job of several ranks building the engine is collective: every rank copies
        (or unpickles) at the same point (docs/python.md)."""
        saved = state.get("state", {})
        had_differentiable = "differentiable" in state.get("defaults", {})
        super().__setstate__(dict(state, state={}))
        self.state = defaultdict(dict)
        if not had_differentiable:  # the base class adds it; meshmuon's groups have no such key
            self.defaults.pop("differentiable", None)
        # An older meshmuon's optimizer: options added since take their defaults (as torch's)
        self.__dict__.setdefault("_adamw_defaults", {})
        _state_dict.fill_defaults(self.defaults, self._adamw_defaults, self.param_groups)
        builds = self.engine_builds
        self._dist_options = _plan.check_dist_options(**self._dist_args)
        self._clip_masks, self._last_phases, self._engine = {}, None, None
        _comms.release_at_exit(self)
        self._rebuild_engine()
        self.engine_builds = builds
        _state_dict.load_entries(self, [saved.get(p, {}) for p in self._engine.params], fresh=True)
        for key, value in saved.items():  # entries not keyed by a parameter (hooks may add them)
            if not isinstance(key, torch.Tensor):
                self.state[key] = value

    @property
    def engine(self) -> str:
        """Which core runs the step: 'local' (meshmuon.LocalOptimizer in this process), 'distributed'
        (meshmuon.Optimizer: DTensor or owned parameters, or plain ones of a multi-rank job) or 'zero'."""
        return self._engine.kind

    @property
    def last_step_stats(self) -> dict:
        """This rank's counters of the last step that ran the engine, for both engines (all zero,
        `applied` False, before the first): the fields of meshmuon::StepStats (step_seconds,
        orthogonalize_seconds, update_seconds, pack_seconds; distributed also comm_wait_seconds,
        agree_seconds, comm_seconds, overlap, bytes_sent / bytes_recv and their predictions, chunks,
        collectives: zero on one rank; with offload_state offload_bytes_in / offload_bytes_out and
        peak_state_resident_bytes, zero without), the wall times of the Python phases (python_step_seconds,
        collect_grads_seconds, engine_call_seconds, write_back_seconds), `engine`, and the product
        precision: `cpu_model`, `bf16_native`, `bf16_products` (what formed the bf16 products:
        'unused' when every Muon group ran fp32 products, else 'native', 'widened',
        'onednn_emulated' or 'cuda').
        See docs/python.md."""
        stats = dict(self._engine.last_stats() or {})
        times = self._last_phases.times if self._last_phases is not None else {}
        stats.update(engine=self._engine.kind,
                     python_step_seconds=times.get("meshmuon.step", 0.0),
                     collect_grads_seconds=times.get("meshmuon.collect_grads", 0.0),
                     engine_call_seconds=times.get("meshmuon.engine", 0.0),
                     write_back_seconds=times.get("meshmuon.write_back", 0.0))
        info = _precision.cpu_info()
        stats.update(cpu_model=info["model"], bf16_native=bool(info["bf16_native"]),
                     bf16_products=_precision.products_of(self.param_groups))
        return stats

    def plan(self) -> _plan.Plan:
        """The plan the engine runs (docs/python.md, "Plans"): `str(plan)` prints like `meshmuon plan`,
        `plan.to_json()` / `plan.json` give its JSON, `plan.strategies` / `.decisions` / `.chunks`
        per Muon parameter, `plan.bytes_sent_max`, `.world_size`. The local engine's plan is one
        rank's: every matrix computed in place (`local`, `expert_local`), nothing sent."""
        return _plan.plan_of(self._engine)
