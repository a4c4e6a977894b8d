"""NVIDIA-NeMo/Emerging-Optimizers' Muon (emerging_optimizers.orthogonalized_optimizers.Muon) → meshmuon.torch.Muon.

Its step, read from its source (orthogonalized_optimizer.py, muon.py, muon_utils.py, mixin.py):
decoupled decay p ← p − lr·wd·p, EMA momentum buf.lerp_(g, 1 − momentum) (Nesterov:
g.lerp(buf, momentum)), X = F.normalize(buf, eps=1e-7) (X / max(‖X‖_F, eps)), Newton–Schulz with
the named coefficient table and its iteration rule, then p ← p − lr·scale·X with scale
`extra_scale_factor` × sqrt(max(A, B)) ("spectral") or × sqrt(max(1, A/B)) ("shape_scaling").
meshmuon's LR rules are 0.2·sqrt(max(A, B)) (match_rms_adamw) and sqrt(max(1, A/B)) (original), so
the extra factor goes into lr, and weight_decay is divided by it (the decay lr·wd unchanged).
"""
from __future__ import annotations

from typing import Any, Optional

from ._common import GroupTranslation, muon_kwargs, plain_update, rate, source_groups, tensors

PEER = "Emerging-Optimizers' Muon"

# Its coefficient tables that meshmuon does not hold under the same name, with its iteration rule.
_QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
            (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]  # cycled
_POLAR_EXPRESS = [(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
                  (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                  (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)]  # the last repeated
_SAME_NAME = ("cans", "aol", "deepseekv4", "cubic5")  # meshmuon's schedules of these names
_COEFFICIENT_TYPES = ("simple", "quintic", "polar_express") + _SAME_NAME + ("custom",)
_PRECISIONS = {"highest": "fp32", "high": "fp32", "medium": "auto"}
_SCALE_RULES = {"spectral": ("match_rms_adamw", 0.2), "shape_scaling": ("original", 1.0)}


def from_emerging_optimizers(params: Any, lr: float = 3e-4, momentum: float = 0.95, weight_decay: float = 0.01, *,
                             nesterov: bool = False, weight_decay_method: str = "decoupled",
                             fp32_matmul_prec: str = "medium", coefficient_type: str = "quintic",
                             num_ns_steps: int = 5, scale_mode: str = "spectral", extra_scale_factor: float = 1.0,
                             use_syrk: bool = False, weight_update_hook: Any = None,
                             custom_coefficient_sets: Optional[list] = None) -> dict:
    """Keyword arguments of meshmuon.torch.Muon equivalent to Emerging-Optimizers'
    `Muon(params, lr, momentum, weight_decay, ...)` with the same arguments (its names and defaults):
    `opt = meshmuon.torch.Muon(**from_emerging_optimizers(params, lr=0.02))`. See the module
    docstring for the step. `coefficient_type`: "simple" (meshmuon's jordan), "quintic" (its 5
    triples, cycled), "polar_express" (its fixed 8-triple table, the last repeated; meshmuon's own
    polar_express computes its table), "cans", "aol", "deepseekv4", "cubic5" (meshmuon's schedules
    of those names, the same tables and rules), "custom" (`custom_coefficient_sets`, cycled).
    `fp32_matmul_prec`: "medium" (its bf16 Newton–Schulz) → ns_matmul_dtype "auto" (bf16 products
    where native, fp32 accumulation); "high" / "highest" → "fp32". `use_syrk` has no effect
    (meshmuon's symmetric products are its own). Refused by name: weight_decay_method other than
    "decoupled", scale_mode "unit_rms_norm", a weight_update_hook, extra_scale_factor <= 0."""
    if weight_decay_method != "decoupled":
        raise ValueError(f"[migrate] {PEER}: weight_decay_method={weight_decay_method!r} has no meshmuon rule; "
                         f"meshmuon decays decoupled (p - lr*wd*p): use 'decoupled'")
    if weight_update_hook is not None:
        raise ValueError(f"[migrate] {PEER}: weight_update_hook is not translated (meshmuon's step runs "
                         f"natively, no Python hook between update and parameter); drop it")
    if scale_mode not in _SCALE_RULES:
        raise ValueError(f"[migrate] {PEER}: scale_mode={scale_mode!r} has no meshmuon LR rule "
                         f"(sqrt(A/B) without the max); use 'spectral' or 'shape_scaling'")
    if isinstance(extra_scale_factor, bool) or not isinstance(extra_scale_factor, (int, float)) \
            or not extra_scale_factor > 0:
        raise ValueError(f"[migrate] {PEER}: extra_scale_factor={extra_scale_factor!r}; give a number > 0")
    if fp32_matmul_prec not in _PRECISIONS:
        raise ValueError(f"[migrate] {PEER}: fp32_matmul_prec={fp32_matmul_prec!r} is not one of "
                         f"{tuple(_PRECISIONS)}")
    if coefficient_type not in _COEFFICIENT_TYPES:
        raise ValueError(f"[migrate] {PEER}: coefficient_type={coefficient_type!r} is not one of "
                         f"{_COEFFICIENT_TYPES}")
    if isinstance(num_ns_steps, bool) or not isinstance(num_ns_steps, int) or num_ns_steps < 1:
        raise ValueError(f"[migrate] {PEER}: num_ns_steps={num_ns_steps!r}; give an int >= 1 (as it checks)")
    schedule = _schedule(coefficient_type, num_ns_steps, custom_coefficient_sets)
    rule, base = _SCALE_RULES[scale_mode]
    factor = float(extra_scale_factor) / base  # lr·factor·(meshmuon's rule) = lr·extra·(its scale)
    defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay)
    groups = []
    for index, group in enumerate(source_groups(params, PEER)):
        t = GroupTranslation(PEER, index, group, defaults)
        for j, p in enumerate(tensors(group)):
            if p.ndim != 2:
                raise t.fail(f"parameter {j} has shape {tuple(p.shape)}; {PEER} takes 2-D parameters only "
                             f"(put the rest in an AdamW group of meshmuon: algorithm='adamw')")
        group_lr = rate(t, "lr", t.get("lr"))
        group_wd = rate(t, "weight_decay", t.get("weight_decay"))
        t.set(algorithm="muon", lr=group_lr * factor, weight_decay=group_wd / factor,
              momentum=rate(t, "momentum", t.get("momentum")), nesterov=bool(nesterov), momentum_kind="ema",
              eps=1e-7, eps_mode="clamp", ns_scale=1.0, adjust_lr_fn=rule, cautious_wd=False, normuon=False,
              expert_stacks=False, ns_steps=num_ns_steps, ns_matmul_dtype=_PRECISIONS[fp32_matmul_prec],
              **schedule)
        plain_update(t)
        groups.append(t.finish())
    return muon_kwargs(groups)


def _schedule(name: str, steps: int, custom: Optional[list]) -> dict:
    """meshmuon's ns_schedule / ns_coefficients for Emerging-Optimizers' coefficient_type."""
    if name == "simple":
        return dict(ns_schedule="jordan")
    if name in _SAME_NAME:
        if name == "cubic5" and steps != 5:
            raise ValueError(f"[migrate] {PEER}: coefficient_type='cubic5' is a fixed 5-step schedule, got "
                             f"num_ns_steps={steps} (it refuses it too); use num_ns_steps=5")
        return dict(ns_schedule=name)
    if name == "custom":
        if not custom:
            raise ValueError(f"[migrate] {PEER}: coefficient_type='custom' needs custom_coefficient_sets")
        table, cycle = [tuple(float(c) for c in row) for row in custom], True
    else:
        table, cycle = (_QUINTIC, True) if name == "quintic" else (_POLAR_EXPRESS, False)
    rows = [table[t] if t < len(table) else table[t % len(table)] if cycle else table[-1] for t in range(steps)]
    return dict(ns_schedule="custom", ns_coefficients=rows)
