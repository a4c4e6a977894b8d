"""Dion's Muon (microsoft/dion, dion/muon.py with megabatch_base.py) → meshmuon.torch.Muon, with the
groups' own keys (`mu`, `epsilon`, `beta1`, `beta2`, ...) kept as live aliases of meshmuon's."""
from __future__ import annotations

from typing import Any, Callable, Optional

from ._common import (GroupTranslation, bool_key, check_choice, muon_kwargs, no_state_keys,
                      plain_update, rate, source_groups, tensors, unit_beta)

PEER = "Dion Muon"
# What Dion checks of lr and mu (>= 0), for the message refusing a negative group value.
CHECKED = "Dion's Muon refuses it as a constructor argument (a group's own value is not checked)"


def from_dion(params: Any, distributed_mesh: Any = None, lr: float = 0.01, mu: float = 0.95,
              betas: tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.01,
              cautious_wd: bool = False, epsilon: float = 1e-8, nesterov: bool = False,
              adjust_lr: Optional[str] = "spectral_norm", flatten: bool = False,
              use_gram_newton_schulz: bool = False, use_triton: bool = False,
              use_polar_express: bool = True,
              newton_schulz_func: Optional[Callable] = None) -> dict:
    """Keyword arguments of meshmuon.torch.Muon equivalent to Dion's `Muon(params, ...)` with the same
    arguments: `opt = meshmuon.torch.Muon(**from_dion(param_groups, lr=0.02))`.

    `params`: Dion's groups (`algorithm` "muon" or "adamw"; keys `lr`, `mu`, `beta1`, `beta2`,
    `weight_decay`, `cautious_wd`, `epsilon`, `nesterov`, `adjust_lr`, `flatten`), or a Dion Muon
    that has not stepped. Muon groups map to heavy-ball momentum (`mu` aliased to `momentum`;
    buf ← mu·buf + g, Nesterov g + mu·buf), Polar Express with X / (|X|_F·1.02 + epsilon)
    (`use_polar_express=True`, also with `use_triton`) or You's schedule with X / (|X|_F + epsilon)
    (`epsilon` aliased to `eps`, `eps_mode='add'`), decay with the unadjusted lr (cautious if
    `cautious_wd`: the same mask U·p ≥ 0) and the update with the adjusted lr: `adjust_lr`
    "rms_norm" → `match_rms_adamw`, None → `none`, "spectral_norm" (lr·sqrt(A/B)) → `original`
    (lr·sqrt(max(1, A/B))), equal only when A ≥ B: a group with a wide matrix (A < B) under
    "spectral_norm" is refused, naming the parameter (meshmuon has no unclamped rule). 3-D
    parameters (flatten=False) become expert stacks. AdamW groups map `beta1` / `beta2` (aliased
    to `betas`), `epsilon` (to `eps`), `lr`, `weight_decay` to meshmuon's AdamW (torch's fused AdamW
    rule, as Dion). `distributed_mesh` is not needed (meshmuon reads DTensor layouts itself).
    `num_heads` / `split_sizes` (row blocks of dim 0, each orthogonalized and lr-adjusted as its
    own matrix, as Dion) carry over under the same names.
    Refused, naming them: Lion (or any other algorithm), Gram Newton-Schulz, a custom
    `newton_schulz_func`, `flatten` with 3-D+ parameters, cautious
    decay in AdamW groups, a nonzero group `step` (Dion has stepped)."""
    del distributed_mesh  # meshmuon takes the layout from the parameters (DTensors)
    if use_gram_newton_schulz or newton_schulz_func is not None:
        what = "use_gram_newton_schulz" if use_gram_newton_schulz else "newton_schulz_func"
        raise ValueError(f"[migrate] {PEER}: {what} is not translated (another orthogonalizer "
                         f"than Dion's polar_express / newton_schulz5); meshmuon's ns_method='gram' "
                         f"is Gram Newton-Schulz with its own normalization (docs/python.md)")
    ns = (dict(ns_schedule="polar_express", ns_scale=1.02) if use_polar_express or use_triton
          else dict(ns_schedule="you", ns_scale=1.0))
    defaults = dict(lr=lr, mu=mu, beta1=betas[0], beta2=betas[1], weight_decay=weight_decay,
                    cautious_wd=cautious_wd, algorithm="muon", step=0, epsilon=epsilon,
                    nesterov=nesterov, flatten=flatten, adjust_lr=adjust_lr)
    groups = []
    for index, group in enumerate(source_groups(params, PEER)):
        t = GroupTranslation(PEER, index, group, defaults)
        algorithm = t.get("algorithm")
        check_choice(t, "algorithm", algorithm, ("muon", "adamw"))
        no_state_keys(t, "step")
        t.set(algorithm=algorithm, lr=rate(t, "lr", t.get("lr"), CHECKED),
              weight_decay=rate(t, "weight_decay", t.get("weight_decay")),
              eps=_epsilon(t, algorithm))
        if algorithm == "muon":
            _muon_group(t, ns)
        else:
            if bool_key(t, "cautious_wd"):
                raise t.fail("cautious_wd=True in an AdamW group: meshmuon's AdamW has no cautious "
                             "weight decay; use cautious_wd=False for this group")
            t.set(betas=(unit_beta(t, "beta1", t.alias("beta1", "betas[0]")),
                         unit_beta(t, "beta2", t.alias("beta2", "betas[1]"))))
            t.ignore("mu", "nesterov", "flatten", "adjust_lr")
        groups.append(t.finish())
    return muon_kwargs(groups)


def _muon_group(t: GroupTranslation, ns: dict) -> None:
    params = tensors(t.source)
    flatten = bool_key(t, "flatten")
    t.fix("flatten")
    blocks = _split(t, params)  # per parameter, its row blocks (None: whole)
    for j, p in enumerate(params):
        if p.ndim > 3 or (p.ndim == 3 and flatten):
            raise t.fail(f"parameter {j} has shape {tuple(p.shape)} with flatten={flatten}: meshmuon "
                         f"takes 2-D matrices and 3-D [E, A, B] stacks (flatten=False)")
    rule = t.fix("adjust_lr")
    check_choice(t, "adjust_lr", rule, ("spectral_norm", "rms_norm", None))
    if rule == "spectral_norm":  # per block: Dion adjusts each split block's lr by its own shape
        for j, p in enumerate(params):
            rows, cols = min(blocks[j] or [p.shape[-2]]), p.shape[-1]
            if rows < cols:
                raise t.fail(f"parameter {j} has shape {tuple(p.shape)} {_wide(t, blocks[j], cols)}: Dion's "
                             f"spectral_norm lr·sqrt(A/B) = lr·{(rows / cols) ** 0.5:.3g} there, "
                             f"meshmuon's 'original' lr·sqrt(max(1, A/B)) = lr; meshmuon has no "
                             f"unclamped rule: use adjust_lr='rms_norm' or None, or put the "
                             f"wide matrices in a group with adjust_lr='rms_norm' or None")
    t.set(momentum=rate(t, "mu", t.alias("mu", "momentum"), CHECKED), nesterov=bool_key(t, "nesterov"),
          momentum_kind="heavy_ball", ns_steps=5, eps_mode="add",
          cautious_wd=bool_key(t, "cautious_wd"),
          adjust_lr_fn={"spectral_norm": "original", "rms_norm": "match_rms_adamw",
                        None: "none"}[rule],
          normuon=False, expert_stacks=any(p.ndim == 3 for p in params), **ns)
    plain_update(t)
    t.ignore("beta1", "beta2")


def _wide(t: GroupTranslation, blocks: Optional[list], cols: int) -> str:
    """What is wide (A < B): the matrix, or its row blocks (num_heads / split_sizes), named by shape."""
    if blocks is None:
        return "(A < B)"
    heads = t.source.get("num_heads")
    if heads is not None and heads > 1:
        return f"(A < B) in each of its {len(blocks)} row blocks (num_heads={heads}) of shape ({blocks[0]}, {cols})"
    k = next(i for i, rows in enumerate(blocks) if rows < cols)
    return (f"(A < B) in its row block {k} of shape ({blocks[k]}, {cols}) "
            f"(split_sizes={tuple(blocks)})")


def _epsilon(t: GroupTranslation, algorithm: str) -> Any:
    """Dion's `epsilon` (no check there), aliased to meshmuon's `eps`. Muon: X / (|X|_F·s + epsilon), so
    epsilon >= 0 (0 included); a negative one can zero or flip the denominator. AdamW: / (sqrt(v_hat)
    + epsilon), so epsilon > 0 (0 divides by zero where a gradient element has been 0)."""
    eps = rate(t, "epsilon", t.alias("epsilon", "eps"), "Dion does not check it (a negative epsilon "
               "can make its denominator |X|_F·s + epsilon zero or negative)",
               range_of="meshmuon's normalization X / (|X|_F·s + eps)")
    if algorithm == "adamw" and eps == 0:
        raise t.fail("epsilon=0 in an AdamW group: Dion's AdamW divides by sqrt(v_hat) + epsilon, 0 "
                     "where a gradient element has been 0 (NaN parameters); meshmuon's AdamW takes "
                     "eps > 0: use one")
    return eps


def _split(t: GroupTranslation, params: list) -> list:
    """Dion's `num_heads` (h equal row blocks of dim 0; 1 = off) and `split_sizes` (row blocks of
    dim 0, at least two) → meshmuon's keys of the same names and meaning (each block orthogonalized
    and lr-adjusted as its own matrix). Dion's own checks, raised naming the group: positive
    integers, not both, 2-D parameters only, h dividing / the sizes summing to dim 0. Dion's further
    condition on DTensors (sharded on dim 0 only, h divisible by the shard count) does not apply:
    meshmuon assembles blocks across any sharding. Returns each parameter's blocks (None: whole)."""
    def positive(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    t.read.update(("num_heads", "split_sizes"))
    heads, sizes = t.source.get("num_heads"), t.source.get("split_sizes")
    if heads is not None and not positive(heads):
        raise t.fail(f"num_heads={heads!r}: Dion takes a positive integer")
    if sizes is not None:
        if not isinstance(sizes, (list, tuple)) or len(sizes) < 2 or not all(positive(b) for b in sizes):
            raise t.fail(f"split_sizes={sizes!r}: Dion takes a tuple or list of at least 2 positive "
                         f"integers")
        if heads is not None and heads > 1:
            raise t.fail("num_heads > 1 and split_sizes are both set: Dion refuses the pair; use one")
    heads = heads if heads is not None and heads > 1 else None
    if heads is None and sizes is None:
        return [None] * len(params)
    key = "num_heads" if heads else "split_sizes"
    out = []
    for j, p in enumerate(params):
        if p.ndim != 2:
            raise t.fail(f"{key} with parameter {j} of shape {tuple(p.shape)}: Dion splits 2-D "
                         f"parameters only")
        if heads and p.shape[0] % heads:
            raise t.fail(f"num_heads={heads} does not divide dim 0 of parameter {j} {tuple(p.shape)}")
        if sizes is not None and sum(sizes) != p.shape[0]:
            raise t.fail(f"split_sizes {tuple(sizes)} do not sum to dim 0 of parameter {j} "
                         f"{tuple(p.shape)}")
        out.append([p.shape[0] // heads] * heads if heads else list(sizes))
    t.set(**({"num_heads": heads} if heads else {"split_sizes": tuple(sizes)}))
    return out
