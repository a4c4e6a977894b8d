"""nanochat's MuonAdamW (karpathy/nanochat, nanochat/optim.py) → meshmuon.torch.Muon, with the groups'
own keys (`kind`, `beta2`, `initial_lr`) kept so that base_train.py's schedule loop runs unedited."""
from __future__ import annotations

import math
from typing import Any

from ... import _core
from ._common import (GroupTranslation, check_choice, engine_flag, has_key, muon_kwargs, rate,
                      source_groups, unit_beta)

PEER = "nanochat"
# nanochat's Polar Express: X / (|X|_F * 1.01 + 1e-6), then the 5-step table of arXiv 2505.16932
# (safety 0.02, cushion 0.02), which is meshmuon's `polar_express` schedule at 5 steps.
NS_EPS = 1e-6


def from_nanochat(params: Any, *, muon_eq: bool = True, muon_plus: bool = True,
                  decay_lr: str = "adjusted", ns_scale: float = 1.01) -> dict:
    """Keyword arguments of meshmuon.torch.Muon equivalent to nanochat's `MuonAdamW(param_groups)`:
    `opt = meshmuon.torch.Muon(**from_nanochat(param_groups))`.

    `params`: nanochat's group list (as `GPT.setup_optimizer` builds it: dicts with `kind='adamw'`
    (`lr`, `betas`, `eps`, `weight_decay`) or `kind='muon'` (`lr`, `momentum`, `ns_steps`, `beta2`,
    `weight_decay`)), or a MuonAdamW that has not stepped. nanochat has no defaults: a missing key is
    a ValueError, as it is a KeyError in nanochat's step.

    Each Muon group maps to: EMA Nesterov momentum (`momentum`), MuonEq row equilibration
    (`muon_eq`), normalization X / (|X|·ns_scale + 1e-6) (`ns_scale`, `eps=1e-6`,
    `eps_mode='add'`), Polar Express (`ns_schedule='polar_express'` for `ns_steps` >= 5; nanochat takes the
    first `ns_steps` rows of its 5-row table, so 1-4 become a custom schedule of those rows),
    Muon+ renormalization (`muon_plus`), NorMuon (`normuon=True`, `normuon_beta2` aliased to the
    group's `beta2`), cautious weight decay (`cautious_wd=True`) and lr·sqrt(max(1, A/B))
    (`adjust_lr_fn='original'`) in both the update and the decay (`decay_lr='adjusted'`).
    AdamW groups keep `lr`, `betas`, `eps`, `weight_decay` (the same update rule).

    `kind` and any other key nanochat does not read stay in the group as foreign keys, so a loop
    that reads `group['kind']` and writes `lr`, `momentum`, `weight_decay` (or `beta2`) works.
    The keyword arguments describe the nanochat version migrated from (this snapshot's values are
    the defaults): `muon_eq`, `muon_plus` (False for versions without MuonEq / Muon+), `decay_lr`
    ("adjusted": decay with the shape-adjusted lr, as nanochat; "unadjusted": meshmuon's default) and
    `ns_scale` (1.02 in earlier versions). Where this meshmuon build lacks a key a value needs
    (`muon_eq`, `muon_plus`, `decay_lr`), a ValueError names it."""
    if decay_lr not in ("adjusted", "unadjusted"):
        raise ValueError(f"[migrate] {PEER}: decay_lr={decay_lr!r}; use 'adjusted' (nanochat's) "
                         f"or 'unadjusted'")
    groups = []
    for index, group in enumerate(source_groups(params, PEER)):
        t = GroupTranslation(PEER, index, group, defaults={})
        kind = t.fix("kind")  # kept for the script (nanochat's loop reads it); meshmuon: algorithm
        check_choice(t, "kind", kind, ("muon", "adamw"))
        t.set(algorithm=kind, lr=rate(t, "lr", t.get("lr")),
              weight_decay=rate(t, "weight_decay", t.get("weight_decay")))
        if kind == "adamw":
            betas = tuple(t.get("betas"))
            if len(betas) != 2:
                raise t.fail(f"betas={betas!r} must be (beta1, beta2)")
            t.set(betas=(unit_beta(t, "betas[0]", betas[0]), unit_beta(t, "betas[1]", betas[1])),
                  eps=_adamw_eps(t))
        else:
            _muon_group(t, muon_eq, muon_plus, decay_lr, ns_scale)
        groups.append(t.finish())
    return muon_kwargs(groups)


def _muon_group(t: GroupTranslation, muon_eq: bool, muon_plus: bool, decay_lr: str,
                ns_scale: float) -> None:
    normuon = _normuon(t)
    t.set(momentum=rate(t, "momentum", t.get("momentum")), momentum_kind="ema", nesterov=True,
          **_ns_schedule(t), ns_scale=ns_scale, eps=NS_EPS, eps_mode="add",
          cautious_wd=True, adjust_lr_fn="original", expert_stacks=False, **normuon)
    engine_flag(t, "muon_eq", muon_eq, "nanochat's MuonEq row equilibration",
                "pass muon_eq=False to migrate without it (the update then differs from nanochat's)")
    engine_flag(t, "muon_plus", muon_plus, "nanochat's Muon+ renormalization",
                "pass muon_plus=False to migrate without it (the update then differs)")
    if has_key("decay_lr"):
        t.set(decay_lr=decay_lr)
    elif decay_lr != "unadjusted":
        raise t.fail("nanochat decays with the shape-adjusted lr, which needs meshmuon's group key "
                     "'decay_lr'; this meshmuon build does not have it: pass decay_lr='unadjusted' "
                     "to decay with the unadjusted lr (differs for tall matrices)")


def _ns_schedule(t: GroupTranslation) -> dict:
    """nanochat runs polar_express_coeffs[:ns_steps], a prefix of its 5-row table (arXiv 2505.16932,
    5 steps), which is meshmuon's polar_express schedule at 5 steps: ns_steps >= 5 is that schedule
    (the group then says ns_steps=5); 1-4 its first rows, as a custom schedule. ns_steps <= 0 runs
    no orthogonalization in nanochat: meshmuon's runs >= 1 step, so it is refused."""
    ns_steps = t.get("ns_steps")
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps < 1:
        raise t.fail(f"ns_steps={ns_steps!r}: nanochat then runs no Polar Express step (the update is "
                     f"not orthogonalized); meshmuon's orthogonalization runs >= 1 step: use an int "
                     f"ns_steps >= 1")
    if ns_steps >= 5:
        return dict(ns_schedule="polar_express", ns_steps=5)
    ns = _core.NsOptions()
    ns.schedule, ns.steps = "polar_express", 5
    return dict(ns_schedule="custom", ns_steps=ns_steps, ns_coefficients=ns.coefficients()[:ns_steps])


def _normuon(t: GroupTranslation) -> dict:
    """nanochat's `beta2` (no range check there; older versions read None as 0.0) as meshmuon's NorMuon
    keys: any finite beta2 >= 0 is NorMuon with `normuon_beta2` aliased to `beta2` (the script may
    write it). beta2 = 1 keeps v at its initial zeros in both (nanochat and meshmuon start v at 0):
    a uniform step that the renormalization divides out; beta2 > 1 extrapolates the lerp in both.
    None: 0.0, with `beta2` kept fixed (a write raises at the next step: translate again).
    Negative or non-finite beta2: a ValueError (meshmuon's range is Dion's NorMuon's, >= 0)."""
    beta2 = t.get("beta2")
    if beta2 is None:
        t.fix("beta2")
        return dict(normuon=True, normuon_beta2=0.0)
    rate(t, "beta2", beta2, "nanochat does not check it (its lerp weight 1 - beta2 then exceeds 1)",
         range_of="Dion's NorMuon's range for its muon_beta2")
    t.alias("beta2", "normuon_beta2")
    return dict(normuon=True, normuon_beta2=beta2)


def _adamw_eps(t: GroupTranslation) -> float:
    """nanochat's AdamW divides by sqrt(v / bias2) + eps: eps <= 0 divides by zero wherever a
    gradient element has been 0 (NaN parameters); meshmuon's AdamW takes eps > 0, finite."""
    eps = t.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise t.fail(f"eps={eps!r}: nanochat's AdamW divides by sqrt(v / (1 - beta2^t)) + eps, which is "
                     f"0 (NaN parameters) where a gradient element has been 0 when eps <= 0; "
                     f"meshmuon's AdamW takes a finite eps > 0: use one")
    return eps
