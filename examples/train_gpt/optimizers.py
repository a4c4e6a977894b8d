"""The optimizers the demo compares: torch.optim.AdamW (the baseline) and meshmuon.torch.Muon (Muon on
matrices and expert stacks, AdamW on embeddings, the LM head, norms and the router), both built on
the FSDP2 model, and torch_muon, the reference: PyTorch's own torch.optim.Muon on the 2-D hidden
matrices + torch.optim.AdamW on the rest, built on an unsharded model in one process (torch.optim.Muon
takes plain 2-D tensors, not FSDP2 shards); plus how each one's step time splits into communication
and compute."""
from __future__ import annotations

import os
import time
from typing import Optional

import torch


class MeshmuonUnavailable(RuntimeError):
    """meshmuon.torch is missing or cannot drive FSDP2 DTensors yet; the message says what to do."""


def adamw_groups(model, lr: float, weight_decay: float):
    # nanoGPT's split: decay matrices, not norms / gains (1-D); embeddings and head decay as matrices.
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def build_adamw(model, args) -> torch.optim.Optimizer:
    return torch.optim.AdamW(adamw_groups(model, args.adamw_lr, args.weight_decay),
                             lr=args.adamw_lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)


def build_meshmuon(model, args) -> torch.optim.Optimizer:
    """meshmuon.torch.Muon with groups from meshmuon.torch.param_groups, on the FSDP2 DTensors (the
    distributed engine; its MPI communicator comes up on first use under mpirun). Raises
    MeshmuonUnavailable when the package is not installed or cannot drive these parameters."""
    try:
        import meshmuon.torch as dtorch
    except ImportError as e:
        raise MeshmuonUnavailable(
            f"the meshmuon Python package is not importable ({e}); install it with "
            f"`pip install --no-build-isolation .` from the repository root, or run "
            f"--optimizers adamw") from e
    if args.strategy != "auto":
        os.environ["MESHMUON_STRATEGY"] = args.strategy  # the engine's documented override
    groups = dtorch.param_groups(
        model,
        muon=dict(lr=args.muon_lr, weight_decay=args.weight_decay),
        adamw=dict(lr=args.muon_adamw_lr, betas=(0.9, 0.95), eps=1e-8,
                   weight_decay=args.weight_decay))
    groups = _router_to_adamw(groups)
    kwargs = dict(lr=args.muon_lr, weight_decay=args.weight_decay, momentum=0.95, nesterov=True,
                  ns_schedule=args.schedule, ns_steps=5,
                  ns_matmul_dtype=getattr(args, "ns_matmul_dtype", "auto"))
    if args.qk_clip > 0:
        kwargs.update(qk_clip_threshold=args.qk_clip, qk_layout=model.qk_layout())
    try:
        return dtorch.Muon(groups, **kwargs)
    except (NotImplementedError, RuntimeError) as e:
        raise MeshmuonUnavailable(
            f"meshmuon.torch.Muon cannot drive these FSDP2 DTensors ({e}); run --optimizers adamw") from e


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


# torch.optim.Muon takes one (a, b, c) triple for all Newton-Schulz iterations: "jordan" is its
# default; meshmuon's other schedules (you, polar_express) vary per iteration and have no equivalent.
TORCH_MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


class MuonWithAdamW:
    """torch.optim.Muon on the hidden matrices and torch.optim.AdamW on the rest, stepped together
    (the recipe of torch.optim.Muon's documentation). param_groups lists both optimizers' groups
    (the same dicts), so set_lr_scale schedules them like the others."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list:
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)


def torch_muon_split(model) -> tuple[list, list]:
    """(Muon, AdamW) parameters: the 2-D weights inside the transformer blocks but the MoE router
    go to Muon, as meshmuon's groups in this demo; embedding, LM head and norms go to AdamW."""
    muon, adamw = [], []
    for name, p in model.named_parameters():
        hidden = name.startswith("blocks.") and p.ndim == 2 and not name.endswith("router.weight")
        (muon if hidden else adamw).append(p)
    return muon, adamw


def torch_bf16_slowdown() -> float:
    """torch's bf16 matmul time over its fp32 one on this CPU (meshmuon's probe; 1.0 without meshmuon)."""
    try:
        from meshmuon.torch._precision import torch_bf16_slowdown as probe
    except ImportError:
        return 1.0
    return probe()


def newton_schulz_fp32(grad: torch.Tensor, ns_coefficients, ns_steps: int, eps: float) -> torch.Tensor:
    """torch.optim.Muon's orthogonalization (REFERENCE.md section 1: X = G / max(|G|_F, eps) on the
    wide side, then X <- aX + (bA + cA^2)X with A = XX^T), in fp32 instead of bf16."""
    a, b, c = ns_coefficients
    x = grad.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if tall else x


def torch_muon_ns(args) -> str:
    """The Newton-Schulz precision of the torch_muon run: --torch-muon-ns, or for `auto` torch's own
    bf16 unless torch's bf16 matmul is over 3x slower than its fp32 one on this CPU (CPUs without
    AVX-512: ~100x, which would make one run take hours), then the same iteration in fp32."""
    if args.torch_muon_ns != "auto":
        return args.torch_muon_ns
    slowdown = torch_bf16_slowdown()
    args.torch_bf16_slowdown = slowdown
    return "fp32" if slowdown > 3 else "bf16"


def build_torch_muon(model, args) -> MuonWithAdamW:
    """torch.optim.Muon (lr --muon-lr, momentum 0.95 Nesterov, 5 Newton-Schulz steps with its
    default coefficients, in bf16 or, where this CPU's bf16 matmul is slow, fp32 (torch_muon_ns),
    adjust_lr_fn default = meshmuon's default) + torch.optim.AdamW with meshmuon's AdamW-group
    hyperparameters, on an unsharded model (one process)."""
    if any(p.ndim > 2 for p in model.parameters()):
        raise ValueError("[demo] torch_muon: torch.optim.Muon takes 2-D parameters only; run it "
                         "without --moe-experts")
    if getattr(args, "torch_muon_ns_resolved", None) is None:
        args.torch_muon_ns_resolved = torch_muon_ns(args)
    if args.torch_muon_ns_resolved == "fp32":
        import torch.optim._muon as torch_muon_impl  # the step calls this module's function by name
        torch_muon_impl._zeropower_via_newtonschulz = newton_schulz_fp32
    muon_params, adamw_params = torch_muon_split(model)
    muon = torch.optim.Muon(muon_params, lr=args.muon_lr, weight_decay=args.weight_decay,
                            momentum=0.95, nesterov=True, ns_coefficients=TORCH_MUON_COEFFICIENTS,
                            ns_steps=5)
    adamw = torch.optim.AdamW(adamw_params, lr=args.muon_adamw_lr, betas=(0.9, 0.95), eps=1e-8,
                              weight_decay=args.weight_decay, foreach=True)
    return MuonWithAdamW(muon, adamw)


def build(name: str, model, args):
    if name == "adamw":
        return build_adamw(model, args)
    if name == "meshmuon":
        return build_meshmuon(model, args)
    if name == "torch_muon":
        return build_torch_muon(model, args)
    raise ValueError(f"[demo] unknown optimizer {name!r}; use meshmuon, adamw or torch_muon")


def ns_precision(opt) -> str:
    """meshmuon's Newton-Schulz products as they ran (its last_step_stats): 'fp32' or 'bf16 <kind>'."""
    products = opt.last_step_stats.get("bf16_products", "unused")
    return "fp32" if products == "unused" else f"bf16 {products}"


def set_lr_scale(opt, scale: float) -> None:
    """Multiplies every group's initial lr by `scale` (the schedule; read by every optimizer at
    every step)."""
    for group in opt.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * scale


def timed_step(opt, qk_logits: Optional[dict]) -> tuple[float, float]:
    """Runs opt.step() and returns (comm_ms, compute_ms). torch's AdamW on FSDP2 shards is local,
    and torch_muon runs in one process: all of it is compute. meshmuon reports its own phases in
    `last_step_stats` (seconds, fields of meshmuon::StepStats): the communication is the time the step
    waited for collectives (comm_wait_seconds), the rest of the step is compute."""
    start = time.perf_counter()
    if qk_logits is not None:  # meshmuon with QK-clip: {layer: global per-head max logits}
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
