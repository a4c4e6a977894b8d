"""The options of meshmuon.torch.Muon. Param-group keys: defaults per algorithm, validation of group
dicts, and their translation to the engine's GroupOptions (done at every step, so LR schedulers and
edits to any key take effect). The constructor's keyword arguments: checked in one pass before
anything is built (check_constructor), the Muon group keys among them read from MUON_DEFAULTS, so a
new group key is one entry there (and, to be a constructor argument too, its keyword)."""
from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any, Optional

import torch

from .. import _core
from . import _clip, _foreign, _plan, _precision

# Keller Jordan's quintic coefficients, torch.optim.Muon's default.
JORDAN = (3.4445, -4.7750, 2.0315)

# Defaults of a Muon group: torch.optim.Muon's first, then meshmuon's extra options.
MUON_DEFAULTS: dict[str, Any] = {
    "lr": 1e-3,
    "weight_decay": 0.1,
    "momentum": 0.95,
    "nesterov": True,
    "ns_coefficients": JORDAN,
    "eps": 1e-7,
    "ns_steps": 5,
    "adjust_lr_fn": None,         # None / "original", "match_rms_adamw", "none"
    "ns_schedule": None,          # None: "jordan" for the default coefficients, else "custom";
                                  # or "jordan", "you", "polar_express", "custom", "cans", "aol",
                                  # "deepseekv4", "cubic5" (Emerging-Optimizers' tables)
    "ns_method": "symmetric",     # "plain", "symmetric" (SYRK), "gram" (Gram Newton-Schulz)
    "ns_scale": 1.0,              # X0 = G / max(|G|_F * ns_scale, eps)
    "eps_mode": "clamp",          # "clamp" as torch.optim.Muon, or "add": / (|G| * s + eps)
    "ns_bf16": False,             # emulate torch.optim.Muon's bf16 Newton-Schulz rounding
    "ns_matmul_dtype": "auto",    # "fp32", "bf16" (products from bf16 operands), or "auto": the
                                  # fastest of this machine (bf16 where native or on CUDA, else fp32)
    "momentum_kind": "ema",       # "ema" (torch lerp) or "heavy_ball" (buf = mu * buf + g)
    "cautious_wd": False,
    "decay_lr": "unadjusted",     # the weight decay's lr: "unadjusted" (the group's lr) or "adjusted"
                                  # (after adjust_lr_fn's shape rule, as nanochat)
    "muon_eq": False,             # MuonEq row equilibration before Newton-Schulz (nanochat)
    "muon_plus": False,           # Muon+ renormalization after it: |U|_F = sqrt(min(m, n)) (nanochat)
    "normuon": False,
    "normuon_beta2": 0.95,
    "qk_clip_threshold": 0.0,     # tau > 0 enables QK-clip on parameters tagged by qk_layout
    "expert_stacks": False,       # True: 3-D parameters are [E, A, B] stacks of E matrices
    # Split orthogonalization (Dion's keys), along dim 0 of each matrix (the output dim: rows of
    # [out, in], of each expert's [A, B]): num_heads=h cuts it into h equal row blocks (per-head
    # Muon), split_sizes=(a, b, ...) into blocks of those sizes (a fused QKV's q | k | v, GQA's
    # uneven ones). Each block is orthogonalized as a matrix of its own: normalization, MuonEq,
    # Muon+, NorMuon statistics and adjust_lr_fn on the block's shape (as Dion and Megatron).
    "num_heads": None,            # None / 1: off
    "split_sizes": None,          # None: off; at most one of the two
    "strategy": None,             # distributed engine: pin the group's parameters to a strategy
}

# Defaults of an AdamW group: torch.optim.AdamW's.
ADAMW_DEFAULTS: dict[str, Any] = {
    "lr": 1e-3,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.01,
}

SHARED_KEYS = {"lr", "weight_decay", "eps"}
MUON_ONLY = set(MUON_DEFAULTS) - SHARED_KEYS
ADAMW_ONLY = set(ADAMW_DEFAULTS) - SHARED_KEYS
# Keys fixed at construction: the engine's state layout depends on them.
STRUCTURAL = ("algorithm", "normuon", "expert_stacks", "num_heads", "split_sizes")
ALGORITHMS = ("muon", "adamw")


def _scalar(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


# Keys a group may carry besides the algorithms' options: torch's own (params; initial_lr, which LR
# schedulers add; param_names, which torch adds for named parameters, so a group dict used for one
# optimizer can build another, as with torch's optimizers) and a free-form label.
GENERIC_KEYS = {"params", "algorithm", "name", "initial_lr", "param_names"}
# What other Muon implementations call their group keys, and meshmuon's spelling (nanochat's `kind` and
# `beta2`, Motif's `use_muon`, Dion-style `mu`, ...): named in the error for an unknown key.
KEY_HINTS: dict[str, str] = {
    "kind": "algorithm='muon' or algorithm='adamw'",
    "use_muon": "algorithm='muon' (True) or algorithm='adamw' (False)",
    "beta2": "normuon=True, normuon_beta2=... in a Muon group (NorMuon's second moment), or "
             "betas=(beta1, beta2) in an AdamW group",
    "beta1": "momentum=... in a Muon group, or betas=(beta1, beta2) in an AdamW group",
    "mu": "momentum",
    "ns_coeffs": "ns_coefficients",
    "backend_steps": "ns_steps",
    "nesterov_momentum": "nesterov",
    "wd": "weight_decay",
    "learning_rate": "lr",
    "adjust_lr": "adjust_lr_fn",
    "cautious_weight_decay": "cautious_wd",
    "qk_clip_tau": "qk_clip_threshold",
    "muoneq": "muon_eq",
    "row_equilibration": "muon_eq",
    "muonplus": "muon_plus",
    "renormalize": "muon_plus",
    "adjusted_decay": "decay_lr='adjusted'",
    "pin": "strategy",
    "clip_config": "the constructor's clip_config=dict(q_proj=..., k_proj=..., head_dim=...)",
    "none_grad": "the constructor's none_grad=True",
}


def check_unknown_keys(group: dict, index: int) -> None:
    """ValueError naming every key no algorithm knows (silently ignoring one, e.g. nanochat's
    `beta2`, would quietly leave NorMuon off), with meshmuon's key for it."""
    hints = unknown_key_hints(group, index)
    if hints:
        raise ValueError(f"[torch] param group {index}: unknown keys {', '.join(hints)}; meshmuon's "
                         f"group keys are {known_keys()}")


def known_keys() -> list[str]:
    """The group keys meshmuon knows, sorted (without `params`)."""
    return sorted((GENERIC_KEYS | set(MUON_DEFAULTS) | set(ADAMW_DEFAULTS)) - {"params"})


def unknown_key_hints(group: dict, index: int) -> list[str]:
    """The group's keys no algorithm knows and the group does not declare foreign (`foreign_keys`),
    each with meshmuon's key for it where there is one."""
    known = GENERIC_KEYS | set(MUON_DEFAULTS) | set(ADAMW_DEFAULTS)
    unknown = sorted(k for k in group if k not in known | _foreign.declared(group, index, known))
    hints = []
    for key in unknown:
        hint = KEY_HINTS.get(key)
        if hint is None:
            close = difflib.get_close_matches(key, sorted(known - {"params"}), n=1, cutoff=0.6)
            hint = close[0] if close else None
        hints.append(f"{key!r} (use {hint})" if hint else f"{key!r}")
    return hints


def check_group_keys(group: dict, index: int) -> str:
    """Returns the group's algorithm; ValueError for an unknown key (naming meshmuon's key for it), an
    unknown algorithm or the other algorithm's keys (a typo guard: `betas` in a Muon group,
    `momentum` in an AdamW group)."""
    check_unknown_keys(group, index)
    algorithm = group.get("algorithm", "muon")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"[torch] param group {index}: algorithm {algorithm!r} is not one of "
                         f"{ALGORITHMS}")
    wrong = sorted((ADAMW_ONLY if algorithm == "muon" else MUON_ONLY) & set(group))
    if wrong:
        raise ValueError(f"[torch] param group {index} ({algorithm}): keys {wrong} belong to the "
                         f"other algorithm; remove them or set algorithm accordingly")
    return algorithm


DECAY_LRS = ("unadjusted", "adjusted")


def _flag(group: dict, key: str, index: int) -> bool:
    """A boolean key: True or False only (a typo such as "false" must not turn an option on)."""
    value = group[key]
    if not isinstance(value, bool):
        raise ValueError(f"[torch] param group {index}: {key}={value!r}; use True or False")
    return value


def _coefficient_rows(value: Any, index: int) -> list[tuple[float, float, float]]:
    """`ns_coefficients`: one (a, b, c) triple (torch.optim.Muon's, used at every step), or one triple
    per step (a custom schedule whose steps differ, e.g. a prefix of nanochat's Polar Express table)."""
    items = list(value)
    if items and all(isinstance(x, (int, float, torch.Tensor)) for x in items):
        items = [items]
    rows = [tuple(float(c) for c in row) for row in items]
    if not rows or any(len(row) != 3 for row in rows):
        raise ValueError(f"[torch] param group {index}: ns_coefficients must be (a, b, c), or one "
                         f"(a, b, c) per step")
    return rows


def _ns_options(group: dict, ns: "_core.NsOptions", index: int) -> None:
    schedule = group["ns_schedule"]
    rows = _coefficient_rows(group["ns_coefficients"], index)
    if schedule is None:
        schedule = "jordan" if rows == [JORDAN] else "custom"
    ns.schedule = schedule
    ns.steps = int(group["ns_steps"])
    if schedule == "custom":  # the engine checks that per-step rows number ns_steps
        ns.custom = rows * ns.steps if len(rows) == 1 else rows
    ns.method = group["ns_method"]
    ns.scale = float(group["ns_scale"])
    ns.eps = float(group["eps"])
    ns.eps_mode = group["eps_mode"]
    ns.bf16_rounding = bool(group["ns_bf16"])
    ns.muon_eq = _flag(group, "muon_eq", index)
    ns.muon_plus = _flag(group, "muon_plus", index)
    ns.matmul_dtype = _precision.matmul_dtype(group)


def _split(group: dict, index: int) -> tuple[int, list[int]]:
    """The group's split option as the engine's (num_heads, split_sizes): ValueError for a value
    that is not a positive integer (bools refused: True is not a head count) or both keys set."""
    def positive(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    heads, sizes = group.get("num_heads"), group.get("split_sizes")
    if heads is not None and not positive(heads):
        raise ValueError(f"[torch] param group {index}: num_heads={heads!r}; use a positive integer "
                         f"(the number of equal row blocks) or None")
    if sizes is not None:
        if not isinstance(sizes, (list, tuple)) or not sizes or not all(positive(b) for b in sizes):
            raise ValueError(f"[torch] param group {index}: split_sizes={sizes!r}; use a list of "
                             f"positive row counts summing to dim 0 of every parameter, or None")
        if heads is not None and heads > 1:
            raise ValueError(f"[torch] param group {index}: num_heads and split_sizes are both set; use "
                             f"num_heads for equal per-head blocks or split_sizes for uneven ones")
    return (heads or 0), [int(b) for b in sizes or ()]


def apply_group(options: "_core.GroupOptions", group: dict, index: int) -> None:
    """Writes the hyperparameters of torch param group `group` into the engine's GroupOptions.
    Enum names and ranges are checked by the engine (ValueError naming the group and field)."""
    _foreign.sync(group)  # aliased foreign keys (docs/migration.md) are the source of their values
    options.lr = _scalar(group["lr"])
    options.weight_decay = _scalar(group["weight_decay"])
    if group.get("algorithm", "muon") == "adamw":
        beta1, beta2 = group["betas"]
        options.beta1, options.beta2 = _scalar(beta1), _scalar(beta2)
        options.eps = _scalar(group["eps"])
        return
    options.momentum = _scalar(group["momentum"])
    options.nesterov = bool(group["nesterov"])
    options.momentum_kind = group["momentum_kind"]
    rule = group["adjust_lr_fn"]
    options.lr_rule = "original" if rule is None else rule
    options.cautious_wd = bool(group["cautious_wd"])
    decay_lr = group["decay_lr"]
    if decay_lr not in DECAY_LRS:
        raise ValueError(f"[torch] param group {index}: decay_lr={decay_lr!r}; use 'unadjusted' (the "
                         f"group's lr) or 'adjusted' (the lr after adjust_lr_fn, as nanochat)")
    options.decay_lr = decay_lr
    options.normuon_beta2 = _scalar(group["normuon_beta2"])
    options.qk_clip_threshold = _scalar(group["qk_clip_threshold"])
    options.num_heads, options.split_sizes = _split(group, index)
    ns = options.ns  # a copy: write it back whole
    _ns_options(group, ns, index)
    options.ns = ns


def make_group_options(group: dict, index: int) -> "_core.GroupOptions":
    """A fresh GroupOptions for a torch param group, validated (ValueError naming the field)."""
    options = _core.GroupOptions()
    options.algorithm = group.get("algorithm", "muon")
    options.normuon = bool(group.get("normuon", False))
    apply_group(options, group, index)
    options.validate(index)
    if not math.isfinite(options.lr):
        raise ValueError(f"[torch] param group {index}: lr must be finite")
    return options


# ---- the constructor's keyword arguments ----------------------------------------------------------

LR_RULES = (None, "original", "match_rms_adamw", "none")  # adjust_lr_fn: torch's two, and "none"
KINDS = ("local", "distributed")  # engine=: which core steps (None: chosen from the parameters)
REDUCE_GRADS = (None, "mean", "sum")
# The distributed engine's options (docs/python.md): checked for both engines; the local engine (one
# process) ignores them.
DIST_KEYS = ("window", "chunk_bytes", "replica", "timeout_s", "allow_inexact", "machine")
# Constructor arguments named like a Muon group key that are not that key's default: `strategy` there
# pins names to strategies for every group (a group's own `strategy` key pins its parameters).
NOT_GROUP_DEFAULTS = {"strategy"}

# The constructor's options with a fixed set of values: name -> (accepts the value, what to use);
# a refused value raises ValueError "[torch] name=value; <what to use>".
_CHOICES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "non_finite": (lambda v: v in ("raise", "skip"), "use 'raise' or 'skip'"),
    "comm_dtype": (lambda v: v in ("fp32", "bf16"), "use 'fp32' or 'bf16'"),
    "none_grad": (lambda v: isinstance(v, bool),
                  "use True (free each .grad once the step has used it) or False"),
    "threads": (lambda v: v is None or (isinstance(v, int) and v >= 1),
                "use an int >= 1, or None for the BLAS thread count"),
    "offload_state": (lambda v: isinstance(v, bool), "use True (optimizer state in pinned host memory, "
                      "staged to the device chunk by chunk) or False"),
    "engine": (lambda v: v is None or v in KINDS, "use None (automatic), 'local' or 'distributed'"),
}


def _choice(given: dict, name: str) -> Any:
    accepts, use = _CHOICES[name]
    value = given[name]
    if not accepts(value):
        raise ValueError(f"[torch] {name}={value!r}; {use}")
    return value


class ZeroOptions:
    """The ZeRO options of meshmuon.torch.Muon, checked (ValueError naming the option) before anything
    is built."""

    def __init__(self, zero: Any, reduce_grads: Any, check_replicas: Any, engine: Optional[str]):
        if not isinstance(zero, bool):
            raise ValueError(f"[torch] zero={zero!r}; use True (ZeRO: optimizer state and work "
                             f"split over the ranks) or False")
        if reduce_grads not in REDUCE_GRADS:
            raise ValueError(f"[torch] reduce_grads={reduce_grads!r}; use 'mean', 'sum' or None")
        if not isinstance(check_replicas, bool):
            raise ValueError(f"[torch] check_replicas={check_replicas!r}; use True or False")
        if reduce_grads is not None and not zero:
            raise ValueError(f"[torch] reduce_grads={reduce_grads!r} needs zero=True: the step "
                             f"reduces local gradients to the shard owners of ZeRO; without "
                             f"zero, all-reduce the gradients first (DDP) and leave reduce_grads=None")
        if check_replicas and (not zero or reduce_grads is not None):
            raise ValueError("[torch] check_replicas=True checks that the already-reduced gradients "
                             "agree on every rank: it needs zero=True and reduce_grads=None")
        if zero and engine is not None:
            raise ValueError(f"[torch] engine={engine!r} with zero=True: ZeRO has its own engine; "
                             f"leave engine=None")
        self.zero, self.reduce_grads, self.check_replicas = zero, reduce_grads, check_replicas


def check_constructor(given: dict[str, Any]) -> tuple[dict, dict]:
    """Muon's keyword arguments (`given`: every one, by name) checked in one pass, ValueError naming
    the first bad one before anything is built. Returns the Muon groups' defaults (MUON_DEFAULTS with
    the constructor's values of its keys) and the optimizer's checked options, by attribute name
    (what a copy rebuilds its engine from: Muon._CONFIG)."""
    lr = given["lr"]
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:  # torch's check and wording
        raise ValueError(f"[torch] Tensor lr must be 1-element (got shape {tuple(lr.shape)}); "
                         f"pass a float or a 1-element tensor")
    if given["adjust_lr_fn"] not in LR_RULES:  # torch's wording (code matches on it), meshmuon's rules
        raise ValueError(f"[torch] Adjust learning rate function {given['adjust_lr_fn']} is not "
                         f"supported; use one of {LR_RULES}")
    out: dict[str, Any] = {"_zero": ZeroOptions(given["zero"], given["reduce_grads"],  # docs/python.md, ZeRO
                                                given["check_replicas"], given["engine"])}
    out["_non_finite"] = _choice(given, "non_finite")
    out["_comm_dtype"] = _choice(given, "comm_dtype")
    out["_dist_args"] = {key: given[key] for key in DIST_KEYS}
    out["_dist_options"] = _plan.check_dist_options(**out["_dist_args"])
    out["_strategy"] = _plan.check_strategy(given["strategy"])
    out["_none_grad"] = _choice(given, "none_grad")
    qk_clip_threshold = given["qk_clip_threshold"]
    clip_threshold = _clip.check_clip_config(given["clip_config"])
    if clip_threshold is not None:
        if qk_clip_threshold not in (0.0, clip_threshold):
            raise ValueError(f"[torch] qk_clip_threshold={qk_clip_threshold!r} and "
                             f"clip_config['threshold']={clip_threshold!r} differ; give one")
        qk_clip_threshold = clip_threshold
    out["_clip_config"] = given["clip_config"]
    threads = _choice(given, "threads")
    out["_threads"] = 0 if threads is None else threads
    out["_offload_state"] = _choice(given, "offload_state")
    out["_engine_kind"] = _choice(given, "engine")
    group = {key: given[key] for key in MUON_DEFAULTS if key in given and key not in NOT_GROUP_DEFAULTS}
    defaults = dict(MUON_DEFAULTS, **group, algorithm="muon")
    defaults.update(ns_coefficients=tuple(defaults["ns_coefficients"]), qk_clip_threshold=qk_clip_threshold)
    out["_adamw_defaults"] = dict(ADAMW_DEFAULTS, **(given["adamw_defaults"] or {}))
    unknown = sorted(set(out["_adamw_defaults"]) - set(ADAMW_DEFAULTS))
    if unknown:
        raise ValueError(f"[torch] adamw_defaults: unknown keys {unknown}; use "
                         f"{sorted(ADAMW_DEFAULTS)}")
    out["_qk_layout"] = dict(given["qk_layout"] or {})
    return defaults, out
