"""Motif Technologies' Muon (the `motif-technologies/optimizer` kernel, muon.py) → meshmuon.torch.Muon,
with the groups' own keys (`use_muon`, `names`, `adamw_betas`, ...) kept for the training script."""
from __future__ import annotations

import math
from typing import Any, Optional

from ._common import (GroupTranslation, bool_key, muon_kwargs, plain_update, rate, source_groups,
                      tensors, unit_beta)

PEER = "Motif Muon"
# Motif's Newton-Schulz: X / (|X|_F + 1e-7), then You's five (a, b, c) rows (meshmuon's `you`).
NS_EPS = 1e-7


def from_motif(params: Any, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
               nesterov: bool = True, ns_steps: int = 5,
               adamw_betas: tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8,
               none_grad: bool = True, debug: bool = False, clip_config: Optional[dict] = None,
               warmup_step: int = 5, chunk_size: int = -1, use_distributed_muon: bool = False,
               expert_keys: Optional[list] = None) -> dict:
    """Keyword arguments of meshmuon.torch.Muon equivalent to Motif's `Muon(params, ...)` with the same
    arguments: `opt = meshmuon.torch.Muon(**from_motif(get_default_muon_param_groups(model)))`.

    `params`: Motif's group list (every group has `use_muon`; Muon groups carry `names`), or a
    Motif Muon that has not stepped. Muon groups (`use_muon=True`) map to heavy-ball momentum
    (buf ← momentum·buf + g; Nesterov g + momentum·buf), You's 5-step schedule (any int `ns_steps`:
    Motif's Newton-Schulz ignores it and runs its 5 coefficient rows) with X / (|X|_F + 1e-7), decoupled decay with the
    unadjusted lr and the update with lr·0.2·sqrt(max(A, B)) (`match_rms_adamw`); 3-D parameters
    become expert stacks (Motif orthogonalizes each [A, B] slice; it needs `expert_keys` for them).
    AdamW groups (`use_muon=False`) map `adamw_betas` / `adamw_eps` (kept, aliased to meshmuon's
    `betas` / `eps`), `lr`, `weight_decay` to meshmuon's AdamW (torch's fused AdamW rule, as Motif).
    `names` become the parameters' names (and stay in the group; the parameters of groups without
    names are then named param_groups[i][j], as torch wants all groups named or none); `none_grad`
    (one value for all groups) becomes the constructor's `none_grad`. `debug`, `warmup_step`, `chunk_size` and
    `use_distributed_muon` only change how Motif schedules the same arithmetic and are not needed.
    A `clip_config` that clips heads (non-empty `q_indices` / `k_indices`) is refused: give meshmuon's
    `clip_config=dict(q_proj=..., k_proj=..., head_dim=..., threshold=..., heads=...)`
    (docs/python.md, QK-clip), whose per-head rule is the Kimi K2 one."""
    del debug, warmup_step, chunk_size, use_distributed_muon  # scheduling only: same arithmetic
    if clip_config and (clip_config.get("q_indices") or clip_config.get("k_indices")):
        raise ValueError("[migrate] Motif Muon: clip_config with q_indices / k_indices is not "
                         "translated; pass meshmuon's clip_config=dict(q_proj='*.q_proj.weight', "
                         "k_proj='*.k_proj.weight', head_dim=..., threshold=..., heads=[...]) to "
                         "meshmuon.torch.Muon (docs/python.md, QK-clip)")
    defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                    ns_steps=ns_steps, adamw_betas=adamw_betas, adamw_eps=adamw_eps,
                    none_grad=none_grad)
    groups, none_grads = [], set()
    for index, group in enumerate(source_groups(params, PEER)):
        t = GroupTranslation(PEER, index, group, defaults)
        if "use_muon" not in group:
            raise t.fail("has no 'use_muon'; Motif requires it in every group (True: Muon, False: "
                         "AdamW)")
        use_muon = bool_key(t, "use_muon")
        t.fix("use_muon")
        none_grads.add(bool_key(t, "none_grad"))
        t.fix("none_grad")
        t.set(lr=rate(t, "lr", t.get("lr")), weight_decay=rate(t, "weight_decay", t.get("weight_decay")))
        if use_muon:
            _muon_group(t, expert_keys)
        else:
            betas = tuple(t.alias("adamw_betas", "betas"))
            if len(betas) != 2:
                raise t.fail(f"adamw_betas={betas!r} must be (beta1, beta2)")
            t.set(algorithm="adamw", betas=tuple(unit_beta(t, f"adamw_betas[{i}]", b)
                                                 for i, b in enumerate(betas)),
                  eps=_adamw_eps(t, t.alias("adamw_eps", "eps")))
            t.ignore("momentum", "nesterov", "ns_steps", "names")
        groups.append(t.finish())
    _name_every_group(groups)
    if len(none_grads) > 1:
        raise ValueError("[migrate] Motif Muon: groups differ in none_grad; meshmuon's none_grad is "
                         "one constructor option: use one value")
    return muon_kwargs(groups, none_grad=none_grads.pop())


def _muon_group(t: GroupTranslation, expert_keys: Optional[list]) -> None:
    ns_steps = t.get("ns_steps")
    # Motif's _zeropower_via_newtonschulz5(G, steps) ignores `steps` (it always runs its 5 rows;
    # ns_steps only weighs the owner assignment's flop estimate): any int is those 5 steps.
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int):
        raise t.fail(f"ns_steps={ns_steps!r} must be an int (Motif multiplies its flop estimate by it)")
    params = tensors(t.source)
    names = t.source.get("names")
    t.read.add("names")
    if names is not None:
        names = list(names)
        if len(names) != len(params):
            raise t.fail(f"has {len(names)} names for {len(params)} parameters")
        t.set(params=list(zip(names, params)), names=names)  # meshmuon's parameter names
        t.foreign["names"] = None
    stacks = [j for j, p in enumerate(params) if p.ndim == 3]
    for j in stacks:
        name = names[j] if names is not None else None
        if not expert_keys or (name is not None and not any(k in name for k in expert_keys)):
            raise t.fail(f"parameter {j}{f' {name!r}' if name else ''} is 3-D and matches no "
                         f"expert_keys={expert_keys!r}; Motif refuses it too (each [A, B] slice of "
                         f"an expert stack is one matrix: name it in expert_keys)")
    t.set(algorithm="muon", momentum=rate(t, "momentum", t.get("momentum")), nesterov=t.get("nesterov"),
          momentum_kind="heavy_ball", ns_schedule="you", ns_steps=5, ns_scale=1.0, eps=NS_EPS,
          eps_mode="add", adjust_lr_fn="match_rms_adamw", cautious_wd=False, normuon=False,
          expert_stacks=bool(stacks))
    plain_update(t)
    t.ignore("adamw_betas", "adamw_eps")


def _name_every_group(groups: list[dict]) -> None:
    """torch wants names for all groups or none: when Muon groups carry Motif's `names`, the
    parameters of unnamed groups get meshmuon's fallback names param_groups[i][j]."""
    named = [any(isinstance(p, tuple) for p in g["params"]) for g in groups]
    if any(named) and not all(named):
        for i, (group, has) in enumerate(zip(groups, named)):
            if not has:
                group["params"] = [(f"param_groups[{i}][{j}]", p)
                                   for j, p in enumerate(tensors(group))]


def _adamw_eps(t: GroupTranslation, eps: Any) -> Any:
    """Motif's AdamW (torch's fused kernel) divides by sqrt(v_hat) + eps: eps <= 0 divides by zero
    where a gradient element has been 0 (NaN parameters); meshmuon's AdamW takes a finite eps > 0."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise t.fail(f"adamw_eps={eps!r}: Motif's AdamW divides by sqrt(v_hat) + adamw_eps, which is 0 "
                     f"(NaN parameters) where a gradient element has been 0 when adamw_eps <= 0; "
                     f"meshmuon's AdamW takes a finite eps > 0: use one")
    return eps
