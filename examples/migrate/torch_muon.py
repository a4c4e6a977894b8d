"""Migrating from torch.optim.Muon: the same arguments through meshmuon.torch.from_torch_muon, checked
against torch's own steps. Run: PYTHONPATH=build/python-stage python3 examples/migrate/torch_muon.py

Before:  opt = torch.optim.Muon(model.parameters(), lr=0.02, weight_decay=0.05, momentum=0.9)
After:   opt = meshmuon.torch.Muon(**meshmuon.torch.from_torch_muon(model.parameters(), lr=0.02,
                                                               weight_decay=0.05, momentum=0.9))
torch orthogonalizes in bf16; meshmuon in fp32 unless told otherwise. After T steps the two agree within
the project's bound T * lr_adj * beta (tests/python/tolerances.py, docs/python.md "Numerics vs
torch.optim.Muon"); with ns_bf16=True (meshmuon rounds as torch does) the bound is 8x tighter and the
parameters agree to 2% of how far training moved them, which a mistranslated
hyperparameter (here: nesterov) does not."""
import copy
import math
import os
import sys

import torch

import meshmuon.torch as dt

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
from tolerances import per_step_bound  # noqa: E402  (the project's bounds, one definition)

STEPS = 10
TORCH_ARGS = dict(lr=0.02, weight_decay=0.05, momentum=0.9, adjust_lr_fn="original")


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # 2-D weights only: torch.optim.Muon refuses anything else
    return torch.nn.Sequential(torch.nn.Linear(48, 96, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(96, 64, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(64, 8, bias=False))


def train(net: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 48, generator=gen), torch.randn(64, 8, generator=gen)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], f"loss did not decrease: {losses}"
    return [p.detach().clone() for p in net.parameters()]


def lr_adj(shape: torch.Size) -> float:
    return TORCH_ARGS["lr"] * math.sqrt(max(1.0, shape[0] / shape[1]))


def main() -> None:
    start = model()
    initial = [p.detach().clone() for p in start.parameters()]
    runs = {}
    for name in ("torch", "meshmuon_fp32", "meshmuon_ns_bf16", "meshmuon_wrong_nesterov"):
        net = copy.deepcopy(start)
        if name == "torch":
            opt = torch.optim.Muon(net.parameters(), **TORCH_ARGS)
        else:
            args = dict(TORCH_ARGS, nesterov=False) if name == "meshmuon_wrong_nesterov" else TORCH_ARGS
            extra = dict(ns_bf16=True) if name != "meshmuon_fp32" else dict(ns_matmul_dtype="fp32")
            opt = dt.Muon(**dt.from_torch_muon(net.parameters(), **args), **extra)
        runs[name] = train(net, opt)
    ref = runs["torch"]
    moved = sum((r - p0).abs().mean().item() for r, p0 in zip(ref, initial))
    for name, mode in (("meshmuon_fp32", "fp32"), ("meshmuon_ns_bf16", "ns_bf16")):
        for p, r in zip(runs[name], ref):
            bound = STEPS * lr_adj(p.shape) * per_step_bound(mode, *p.shape)
            diff = (p - r).abs().max().item()
            assert diff <= bound, f"{name} {tuple(p.shape)}: max |dp| {diff:.3g} > bound {bound:.3g}"
    for name in ("meshmuon_ns_bf16", "meshmuon_wrong_nesterov"):
        rel = sum((p - r).abs().mean().item() for p, r in zip(runs[name], ref)) / moved
        print(f"{name}: mean |p - p_torch| / mean |p_torch - p_0| = {rel:.4f}")
        runs[name + "_rel"] = rel
    assert runs["meshmuon_ns_bf16_rel"] < 0.02, "meshmuon (ns_bf16) is not close to torch.optim.Muon"
    assert runs["meshmuon_wrong_nesterov_rel"] > 4 * runs["meshmuon_ns_bf16_rel"], \
        "negative control: a mistranslated nesterov should be visibly farther from torch"
    print(f"torch_muon: {STEPS} steps agree with torch.optim.Muon within the per-step bounds")


if __name__ == "__main__":
    main()
