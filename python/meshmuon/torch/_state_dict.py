"""Reading a state dict into meshmuon.torch.Muon: what kind of dict it is (meshmuon's own, torch.optim.Muon's,
or another optimizer's), torch.optim.Muon's translated to meshmuon's, the checks made before
anything is modified (docs/python.md, "State dicts"), and the load itself: values copied into the
engine's state tensors, which stay the ones in Muon.state (load, load_entries, adopt_replaced_state)."""
from __future__ import annotations

import copy
from typing import Any, Optional

import torch

from ._layout import copy_into, layout_of, local_tensor
from ._options import ADAMW_DEFAULTS, GENERIC_KEYS, MUON_DEFAULTS, STRUCTURAL

# torch.optim.Muon's group keys (torch 2.9+; its defaults are meshmuon's Muon defaults) and state keys.
TORCH_MUON_KEYS = {"lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps",
                   "ns_steps", "adjust_lr_fn"}
TORCH_MUON_STATE = {"momentum_buffer"}

# Group keys that give away another optimizer's state dict, and its name.
_FOREIGN = (
    ("kind", "nanochat's MuonAdamW / DistMuonAdamW (groups with 'kind')"),
    ("use_muon", "a Moonlight / Motif-style Muon (groups with 'use_muon')"),
    ("amsgrad", "torch.optim.Adam / AdamW (groups with 'betas' and 'amsgrad')"),
    ("betas", "an Adam-family optimizer (groups with 'betas')"),
    ("dampening", "torch.optim.SGD (groups with 'dampening')"),
)


def kind_of(state_dict: Any) -> str:
    """'meshmuon' (groups carry `algorithm`), 'torch_muon' (torch.optim.Muon's keys only), or a
    ValueError saying which optimizer's dict this is and what to do."""
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list):
        raise ValueError(f"[torch] load_state_dict takes an optimizer state dict (a dict with "
                         f"'state' and 'param_groups'), got {type(state_dict).__name__}")
    groups = state_dict["param_groups"]
    if groups and all("algorithm" in g for g in groups):
        return "meshmuon"
    keys = set().union(*(set(g) for g in groups)) if groups else set()
    state_keys = set().union(*(set(v) for v in state_dict.get("state", {}).values()
                               if isinstance(v, dict)))
    foreign = keys - TORCH_MUON_KEYS - GENERIC_KEYS
    if not foreign and "algorithm" not in keys and state_keys <= TORCH_MUON_STATE:
        return "torch_muon"
    name = next((name for key, name in _FOREIGN if key in keys), None)
    if name is not None:
        what = f"it looks like a state dict of {name}"
    elif foreign or state_keys - TORCH_MUON_STATE:
        what = (f"it is another optimizer's (group keys {sorted(foreign)}, state keys "
                f"{sorted(state_keys)})")
    else:
        what = "its groups mix meshmuon's (with 'algorithm') and groups without"
    raise ValueError(f"[torch] this state dict is not meshmuon.torch.Muon's or torch.optim.Muon's (the "
                     f"two meshmuon loads): {what}. meshmuon does not convert other optimizers' state: "
                     f"load it into the optimizer that saved it, or start meshmuon's state fresh "
                     f"(load the model's weights only)")


def from_torch_muon(state_dict: dict, groups: list[dict]) -> dict:
    """torch.optim.Muon's dict as meshmuon's: each group a Muon group (ValueError where this
    optimizer's group at that index is not), `momentum_buffer` kept (torch's and meshmuon's EMA
    momentum are the same: buf = lerp(buf, g, 1 - momentum), Nesterov input lerp(g, buf,
    momentum)), `step` 0 where torch keeps none, a parameter without state (torch makes it at its
    first gradient) a zero buffer. The dict itself is not modified."""
    saved_groups = state_dict["param_groups"]
    for g, (saved, group) in enumerate(zip(saved_groups, groups)):
        if group.get("algorithm", "muon") != "muon":
            raise ValueError(f"[torch] param group {g}: the loaded torch.optim.Muon group is a Muon "
                             f"group but this optimizer's is {group.get('algorithm')!r}; give the "
                             f"Muon parameters' groups first, in torch.optim.Muon's order")
        if group.get("normuon"):
            raise ValueError(f"[torch] param group {g}: normuon=True needs NorMuon's second moment "
                             f"(normuon_v), which torch.optim.Muon does not keep; load it into a "
                             f"group with normuon=False")
        if group.get("momentum_kind", "ema") != "ema":
            raise ValueError(f"[torch] param group {g}: momentum_kind={group.get('momentum_kind')!r}"
                             f" but torch.optim.Muon's momentum buffer is an EMA (lerp); load it "
                             f"into a group with momentum_kind='ema'")
    state = {}
    saved_state = state_dict.get("state", {})
    for saved in saved_groups:
        for key in saved.get("params", []):
            entry = dict(saved_state.get(key, {}))
            entry.setdefault("step", torch.tensor(0.0))
            state[key] = entry
    return dict(state_dict, state=state,
                param_groups=[dict(g, algorithm="muon") for g in saved_groups])


def check(state_dict: dict, groups: list[dict], engine: Any, fresh_ok: bool) -> list[dict]:
    """The per-parameter saved state of `state_dict` in engine order, after checking groups,
    algorithms, structural keys and state shapes (ValueError naming the first difference) before
    anything is modified. `fresh_ok`: a parameter without saved state (or without a key) starts
    from zeros (torch.optim.Muon's dicts) instead of raising."""
    saved_groups = state_dict.get("param_groups", [])
    if len(saved_groups) != len(groups):
        raise ValueError(f"[torch] loaded state dict has {len(saved_groups)} parameter groups, "
                         f"this optimizer has {len(groups)}")
    for g, (saved, group) in enumerate(zip(saved_groups, groups)):
        for key in STRUCTURAL:
            default = "muon" if key == "algorithm" else MUON_DEFAULTS.get(key)
            if saved.get(key, default) != group.get(key, default):
                raise ValueError(f"[torch] param group {g}: loaded {key}={saved.get(key, default)!r} "
                                 f"but this optimizer has {group.get(key, default)!r}")
        if len(saved.get("params", [])) != len(group["params"]):
            raise ValueError(f"[torch] param group {g}: loaded state dict has "
                             f"{len(saved.get('params', []))} parameters in it, this optimizer "
                             f"{len(group['params'])}")
    saved_state = state_dict.get("state", {})
    # As the base class: saved parameters map to ours by position in the groups (their keys are
    # indices, or FQNs in DCP's get_optimizer_state_dict / set_optimizer_state_dict).
    saved_keys = [k for saved in saved_groups for k in saved.get("params", [])]
    entries = []
    for i, key in enumerate(saved_keys):
        entry = saved_state.get(key)
        if entry is None and not fresh_ok:
            raise ValueError(f"[torch] loaded state dict has no state for parameter {key!r} "
                             f"('{engine.names[i]}')")
        entry = entry or {}
        if not layout_of(engine.params[i]).held_here:  # owned by another rank: no value here
            entries.append(entry)
            continue
        for name, tensor in engine.state(i).items():
            value = entry.get(name)
            if value is None and fresh_ok:
                continue
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(tensor.shape):
                raise ValueError(f"[torch] loaded state of '{engine.names[i]}' lacks "
                                 f"'{name}' of shape {tuple(tensor.shape)}")
        entries.append(entry)
    return entries


def loaded_groups(state_dict: dict, groups: list[dict]) -> list[dict]:
    """The param groups after loading, as the base class makes them: the saved groups (copied),
    with this optimizer's params (and param_names where the dict has none); keys the saved group
    lacks (torch.optim.Muon's dicts, or dicts older than a key) keep this optimizer's values."""
    out = []
    for saved, group in zip(copy.deepcopy(state_dict["param_groups"]), groups):
        saved["params"] = group["params"]
        for key, value in group.items():
            saved.setdefault(key, value)
        out.append(saved)
    return out


def fill_defaults(defaults: dict, adamw_defaults: dict, groups: list[dict]) -> None:
    """An optimizer pickled by an older meshmuon (copy.deepcopy / pickle, __setstate__): keys its
    defaults and groups lack (options added since) are filled in place, as torch's optimizers'
    __setstate__ fill theirs (group.setdefault("foreach", None), ...): the defaults from meshmuon's
    (MUON_DEFAULTS, ADAMW_DEFAULTS), then each group from the optimizer's defaults for its algorithm
    (a group without `algorithm` is a Muon group). A key an older meshmuon lacked has the default
    that keeps the older behaviour, so the copy steps as the older optimizer did."""
    defaults.setdefault("algorithm", "muon")
    for key, value in MUON_DEFAULTS.items():
        defaults.setdefault(key, copy.deepcopy(value))
    for key, value in ADAMW_DEFAULTS.items():
        adamw_defaults.setdefault(key, copy.deepcopy(value))
    for group in groups:
        algorithm = group.setdefault("algorithm", "muon")
        source = adamw_defaults if algorithm == "adamw" else defaults
        for key, value in source.items():
            if key != "differentiable":
                group.setdefault(key, copy.deepcopy(value))


def step_count(entry: dict) -> Optional[int]:
    """The saved step count (a tensor or a number), None where there is none."""
    step = entry.get("step")
    if step is None:
        return None
    return int(step.item() if isinstance(step, torch.Tensor) else step)


def load(opt: Any, state_dict: dict[str, Any]) -> None:
    """Muon.load_state_dict (its docstring has the contract): pre-hooks, checks, values copied into
    the engine's state tensors, post-hooks, then what they replaced adopted into the engine."""
    state_dict = dict(state_dict)  # as the base class: hooks may edit the (shallow) copy
    for hook in opt._optimizer_load_state_dict_pre_hooks.values():
        result = hook(opt, state_dict)
        if result is not None:
            state_dict = result
    kind = kind_of(state_dict)
    if kind == "torch_muon":
        if len(state_dict["param_groups"]) != len(opt.param_groups):
            raise ValueError(f"[torch] loaded torch.optim.Muon state dict has "
                             f"{len(state_dict['param_groups'])} parameter groups, this "
                             f"optimizer has {len(opt.param_groups)}")
        state_dict = from_torch_muon(state_dict, opt.param_groups)
    entries = check(state_dict, opt.param_groups, opt._engine, fresh_ok=kind == "torch_muon")
    groups = loaded_groups(state_dict, opt.param_groups)
    for group, built in zip(groups, opt._built_strategy):
        if group.get("strategy") != built:  # the plan was made with these; a checkpoint keeps it
            group["strategy"] = built
    opt.param_groups = groups
    load_entries(opt, entries, fresh=kind == "torch_muon")
    opt._built = [{k: g.get(k) for k in STRUCTURAL} for g in opt.param_groups]
    for hook in opt._optimizer_load_state_dict_post_hooks.values():
        hook(opt)
    adopt_replaced_state(opt)


def load_entries(opt: Any, entries: list[dict], fresh: bool = False) -> None:
    """Copies saved per-parameter state (engine order) into the engine's state tensors and
    step counts; opt.state[p] is the engine's state again. `fresh`: what an entry lacks
    starts from zero (torch.optim.Muon's dicts)."""
    engine = opt._engine
    for i, (p, entry) in enumerate(zip(engine.params, entries)):
        bound = engine.state(i)
        for key, tensor in bound.items():
            value = entry.get(key)
            if value is None and not layout_of(p).held_here:
                continue  # owned by another rank: nothing held here
            if value is None and fresh:
                _device_zero(tensor)
            elif value is not tensor:  # the values as saved (bf16 masters kept fp32)
                copy_into(tensor, value)
        count = step_count(entry) or 0
        engine.set_step_count(i, count)
        bound["step"] = opt._step_tensors[i]
        bound["step"].fill_(float(count))
        opt.state[p] = bound


def adopt_replaced_state(opt: Any) -> None:
    """A state value replaced in opt.state (by a load_state_dict post-hook) is copied into
    the engine's tensor, which takes its place again; the step count likewise."""
    engine = opt._engine
    for i, p in enumerate(engine.params):
        current = opt.state.get(p, {})
        bound = engine.state(i)
        for key, tensor in bound.items():
            value = current.get(key)
            if value is not None and value is not tensor:
                copy_into(tensor, value)
        step = current.get("step")
        if step is not None and step is not opt._step_tensors[i]:
            count = step_count(current)
            engine.set_step_count(i, count)
            opt._step_tensors[i].fill_(float(count))
        bound["step"] = opt._step_tensors[i]
        opt.state[p] = bound


def _device_zero(tensor: torch.Tensor) -> None:
    local_tensor(tensor).zero_()
