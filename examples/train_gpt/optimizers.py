"""The two optimizers the demo compares, built the same way on an FSDP2 model: torch.optim.AdamW
(the baseline) and dmuon.torch.Muon (Muon on matrices and expert stacks, AdamW on embeddings, the LM
head, norms and the router), plus how each one's step time splits into communication and compute."""
from __future__ import annotations

import os
import time
from typing import Optional

import torch


class DmuonUnavailable(RuntimeError):
    """dmuon.torch is missing or cannot drive FSDP2 DTensors yet; the message says what to do."""


def adamw_groups(model, lr: float, weight_decay: float):
    # nanoGPT's split: decay matrices, not norms / gains (1-D); embeddings and head decay as matrices.
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def build_adamw(model, args) -> torch.optim.Optimizer:
    return torch.optim.AdamW(adamw_groups(model, args.adamw_lr, args.weight_decay),
                             lr=args.adamw_lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)


def build_dmuon(model, args) -> torch.optim.Optimizer:
    """dmuon.torch.Muon with groups from dmuon.torch.param_groups, on the FSDP2 DTensors (the
    distributed engine; its MPI communicator comes up on first use under mpirun). Raises
    DmuonUnavailable when the package is not installed or cannot drive these parameters."""
    try:
        import dmuon.torch as dtorch
    except ImportError as e:
        raise DmuonUnavailable(
            f"the dmuon Python package is not importable ({e}); install it with "
            f"`pip install --no-build-isolation .` from the repository root, or run "
            f"--optimizers adamw") from e
    if args.strategy != "auto":
        os.environ["DMUON_STRATEGY"] = args.strategy  # the engine's documented override
    groups = dtorch.param_groups(
        model,
        muon=dict(lr=args.muon_lr, weight_decay=args.weight_decay),
        adamw=dict(lr=args.adamw_lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.weight_decay))
    groups = _router_to_adamw(groups)
    kwargs = dict(lr=args.muon_lr, weight_decay=args.weight_decay, momentum=0.95, nesterov=True,
                  ns_schedule=args.schedule, ns_steps=5)
    if args.qk_clip > 0:
        kwargs.update(qk_clip_threshold=args.qk_clip, qk_layout=model.qk_layout())
    try:
        return dtorch.Muon(groups, **kwargs)
    except (NotImplementedError, RuntimeError) as e:
        raise DmuonUnavailable(
            f"dmuon.torch.Muon cannot drive these FSDP2 DTensors ({e}); run --optimizers adamw") from e


def _router_to_adamw(groups):
    # The MoE router [E, d] is a 2-D Linear that param_groups sends to Muon; like most MoE recipes
    # the demo keeps it on AdamW (a few rows that steer routing, not a hidden-layer matrix).
    muon = [g for g in groups if g.get("algorithm") == "muon" and not g.get("expert_stacks")]
    adamw = [g for g in groups if g.get("algorithm") == "adamw"]
    if not muon or not adamw:
        return groups
    moved = [(n, p) for n, p in muon[0]["params"] if n.endswith("router.weight")]
    if moved:
        muon[0]["params"] = [(n, p) for n, p in muon[0]["params"] if not n.endswith("router.weight")]
        adamw[0]["params"] = list(adamw[0]["params"]) + moved
    return [g for g in groups if g["params"]]


def build(name: str, model, args) -> torch.optim.Optimizer:
    if name == "adamw":
        return build_adamw(model, args)
    if name == "dmuon":
        return build_dmuon(model, args)
    raise ValueError(f"[demo] unknown optimizer {name!r}; use dmuon or adamw")


def set_lr_scale(opt: torch.optim.Optimizer, scale: float) -> None:
    """Multiplies every group's initial lr by `scale` (the schedule; read by both optimizers at
    every step)."""
    for group in opt.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * scale


def timed_step(opt: torch.optim.Optimizer, qk_logits: Optional[dict]) -> tuple[float, float]:
    """Runs opt.step() and returns (comm_ms, compute_ms). torch's AdamW on FSDP2 shards is local:
    all of it is compute. dmuon reports its own phases in `last_step_stats` (seconds, fields of
    dmuon::StepStats): the communication is the time the step waited for collectives
    (comm_wait_seconds), the rest of the step is compute."""
    start = time.perf_counter()
    if qk_logits is not None:  # dmuon with QK-clip: {layer: global per-head max logits}
        opt.step(qk_logits=qk_logits)
    else:
        opt.step()
    wall_ms = (time.perf_counter() - start) * 1e3
    stats = getattr(opt, "last_step_stats", None)
    if stats is None:
        return 0.0, wall_ms
    get = stats.get if isinstance(stats, dict) else (lambda k, d=0.0: getattr(stats, k, d))
    comm_ms = 1e3 * float(get("comm_wait_seconds", 0.0))
    return comm_ms, max(0.0, wall_ms - comm_ms)
