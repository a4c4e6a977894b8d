"""torch.optim.Muon → meshmuon.torch.Muon. meshmuon's Muon keys extend torch's with the same names and
defaults, so this is mostly a check: every key torch reads is carried over, the rest of the rule
(EMA momentum, clamp normalization, one (a, b, c) triple per step) is spelled out."""
from __future__ import annotations

from typing import Any, Optional

from .._options import JORDAN
import math

from ._common import (GroupTranslation, check_choice, muon_kwargs, plain_update, rate,
                      source_groups, tensors)

PEER = "torch.optim.Muon"


def from_torch_muon(params: Any, lr: float = 1e-3, weight_decay: float = 0.1,
                    momentum: float = 0.95, nesterov: bool = True,
                    ns_coefficients: tuple[float, float, float] = JORDAN, eps: float = 1e-7,
                    ns_steps: int = 5, adjust_lr_fn: Optional[str] = None) -> dict:
    """Keyword arguments of meshmuon.torch.Muon equivalent to `torch.optim.Muon(params, ...)` with the
    same arguments: `opt = meshmuon.torch.Muon(**from_torch_muon(params, lr=0.02))`.

    `params`: what torch.optim.Muon takes (tensors, (name, tensor) pairs or group dicts), or a
    torch.optim.Muon that has not stepped. Per group: `lr`, `weight_decay` (decoupled, with the
    unadjusted lr), `momentum` with `nesterov` (EMA: buf.lerp_(g, 1 - momentum)),
    `ns_coefficients` used at each of `ns_steps` steps (meshmuon's `jordan` schedule for the default
    triple, else `custom`), `eps` (X / max(|X|_F, eps): `eps_mode='clamp'`) and `adjust_lr_fn`
    (None / "original": lr·sqrt(max(1, A/B)); "match_rms_adamw": lr·0.2·sqrt(max(A, B))). torch
    orthogonalizes in bf16, meshmuon in fp32 by default (`ns_bf16=True` rounds as torch does);
    docs/migration.md. Parameters must be 2-D, as torch requires; other keys are kept as foreign
    keys (torch ignores them too), except meshmuon's own keys, which are refused."""
    defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                    ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps,
                    adjust_lr_fn=adjust_lr_fn)
    groups = []
    for index, group in enumerate(source_groups(params, PEER)):
        t = GroupTranslation(PEER, index, group, defaults)
        for j, p in enumerate(tensors(group)):
            if p.ndim != 2:
                raise t.fail(f"parameter {j} has shape {tuple(p.shape)}; torch.optim.Muon takes "
                             f"2-D parameters only (put the rest in an AdamW group of meshmuon: "
                             f"algorithm='adamw')")
        rule = t.get("adjust_lr_fn")
        check_choice(t, "adjust_lr_fn", rule, (None, "original", "match_rms_adamw"))
        coefficients = tuple(float(c) for c in t.get("ns_coefficients"))
        if len(coefficients) != 3:
            raise t.fail(f"ns_coefficients={coefficients!r} must be one (a, b, c) triple")
        checked = "torch.optim.Muon refuses it as a constructor argument (a group's own value is not checked)"
        t.set(algorithm="muon", lr=rate(t, "lr", t.get("lr"), checked),
              weight_decay=rate(t, "weight_decay", t.get("weight_decay"), checked),
              momentum=rate(t, "momentum", t.get("momentum"), checked), nesterov=t.get("nesterov"),
              momentum_kind="ema", ns_coefficients=coefficients, ns_steps=_ns_steps(t),
              ns_schedule=None, eps=_eps(t), eps_mode="clamp", ns_scale=1.0, adjust_lr_fn=rule,
              cautious_wd=False, normuon=False, expert_stacks=False)
        plain_update(t)
        groups.append(t.finish())
    return muon_kwargs(groups)


def _ns_steps(t: GroupTranslation) -> int:
    """torch runs `range(ns_steps)` Newton-Schulz steps and raises at its first step for >= 100."""
    steps = t.get("ns_steps")
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise t.fail(f"ns_steps={steps!r} must be an int (torch.optim.Muon runs range(ns_steps))")
    if steps >= 100:
        raise t.fail(f"ns_steps={steps}: torch.optim.Muon raises at its first step (\"Number of steps "
                     f"must be less than 100\"); use ns_steps < 100")
    if steps < 1:
        raise t.fail(f"ns_steps={steps}: torch.optim.Muon then runs no Newton-Schulz step (its update "
                     f"is the normalized momentum, not orthogonalized); meshmuon's orthogonalization "
                     f"runs >= 1 step: use ns_steps >= 1, or plain SGD with momentum for this group")
    return steps


def _eps(t: GroupTranslation) -> float:
    """torch divides by norm.clamp(min=eps): a negative eps never acts (the norm is >= 0), exactly as
    eps = 0, which is what meshmuon is given; an infinite one makes every update zero: refused."""
    eps = t.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or math.isnan(eps):
        raise t.fail(f"eps={eps!r} is not a number")
    if math.isinf(eps):
        raise t.fail(f"eps={eps!r}: torch.optim.Muon divides by norm.clamp(min=inf), so its updates "
                     f"are all zero (only weight decay acts); meshmuon takes a finite eps >= 0: "
                     f"use one")
    return max(float(eps), 0.0)
