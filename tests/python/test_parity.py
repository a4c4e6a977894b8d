# Numerics against PyTorch: meshmuon.torch.Muon vs torch.optim.Muon (+ torch.optim.AdamW).
#
# Tolerance (docs/python.md, tolerances.py): torch.optim.Muon orthogonalizes in bf16 and meshmuon in
# fp32 (to < 0.001 of these bounds from a float64 iteration), so the difference is torch's bf16
# error: over T steps |p_meshmuon - p_torch| <= T * lr_adj * B(m, n), B = min(1.5, 3 sqrt(ln(mn) /
# max(m, n))) (2^-5 for vectors), lr_adj the parameter's adjusted lr. With ns_bf16=True meshmuon rounds
# like torch and the bound is B/8; the emulation must also be at least 4x closer on average.
# tests/python/test_tolerances.py checks the bounds per step and per shape class on random seeds.
import math
import copy

import pytest
import torch

import meshmuon.torch as dt
from tolerances import per_step_bound

STEPS, LR = 10, 0.02
FP32_TOL = STEPS * LR * 2**-6  # a scale for the negative control only


def lr_adj(shape, adjust_lr_fn):
    a, b = shape
    if adjust_lr_fn == "match_rms_adamw":
        return LR * 0.2 * math.sqrt(max(a, b))
    return LR * math.sqrt(max(1.0, a / b))


def worst(d, params, adjust_lr_fn, mode):
    """Largest |dp| in units of its tolerance T * lr_adj * (the mode's per-step bound)."""
    return max(x / (STEPS * lr_adj(tuple(p.shape), adjust_lr_fn) * per_step_bound(mode, *p.shape))
               for x, p in zip(d, params))


def mlp(bias=False):
    return torch.nn.Sequential(torch.nn.Linear(32, 64, bias=bias), torch.nn.GELU(),
                               torch.nn.Linear(64, 48, bias=bias), torch.nn.GELU(),
                               torch.nn.Linear(48, 16, bias=bias))


def train(model, optimizers, x, y):
    for _ in range(STEPS):
        for o in optimizers:
            o.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for o in optimizers:
            o.step()
    return [p.detach().clone() for p in model.parameters()]


def diffs(a, b):
    return [(u - v).abs().max().item() for u, v in zip(a, b)], \
           sum((u - v).abs().mean().item() for u, v in zip(a, b))


@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"])
def test_mlp_training_matches_torch_muon(adjust_lr_fn):
    # Each step's gradient comes from the torch-trained reference model and is given to every
    # optimizer, so the comparison measures the optimizers, not the loss landscape's feedback
    # (which amplifies any difference; the next test trains each model on its own gradients).
    base, x, y = mlp(), torch.randn(128, 32), torch.randn(128, 16)
    kw = dict(lr=LR, weight_decay=0.1, momentum=0.95, adjust_lr_fn=adjust_lr_fn)
    other = "match_rms_adamw" if adjust_lr_fn is None else "original"
    m_ref = copy.deepcopy(base)
    runs = {"ref": (m_ref, torch.optim.Muon(m_ref.parameters(), **kw))}
    for name, extra in (("fp32", dict(ns_matmul_dtype="fp32")), ("bf16", dict(ns_bf16=True)),
                        ("off", dict(adjust_lr_fn=other, ns_matmul_dtype="fp32"))):
        m = copy.deepcopy(base)
        runs[name] = (m, dt.Muon(m.parameters(), **dict(kw, **extra)))
    for _ in range(STEPS):
        m_ref.zero_grad()
        torch.nn.functional.mse_loss(m_ref(x), y).backward()
        for model, opt in runs.values():
            for p, r in zip(model.parameters(), m_ref.parameters()):
                p.grad = r.grad.clone()
            opt.step()
    final = {k: [p.detach() for p in m.parameters()] for k, (m, _) in runs.items()}
    max32, mean32 = diffs(final["fp32"], final["ref"])
    max16, mean16 = diffs(final["bf16"], final["ref"])
    w32 = worst(max32, final["ref"], adjust_lr_fn, "fp32")
    w16 = worst(max16, final["ref"], adjust_lr_fn, "ns_bf16")
    print(f"max |dp| / tolerance: fp32 {w32:.2f}, bf16 emulation {w16:.2f}; mean |dp| "
          f"{mean32:.2e} vs {mean16:.2e}")
    assert w32 < 1 and w16 < 1
    assert mean16 * 4 < mean32
    # Negative control: a different lr rule is far outside the tolerance.
    assert max(diffs(final["off"], final["ref"])[0]) > 10 * FP32_TOL


def test_mlp_trained_on_its_own_gradients_stays_within_the_fp32_tolerance():
    base, x, y = mlp(), torch.randn(128, 32), torch.randn(128, 16)
    m_ref, m = copy.deepcopy(base), copy.deepcopy(base)
    ref = train(m_ref, [torch.optim.Muon(m_ref.parameters(), lr=LR)], x, y)
    got = train(m, [dt.Muon(m.parameters(), lr=LR, ns_matmul_dtype="fp32")], x, y)
    # Not a bound (the loss landscape feeds differences back), but well inside the fp32 one.
    assert worst(diffs(got, ref)[0], ref, None, "fp32") < 1


@pytest.mark.parametrize("ns_method", ["plain", "symmetric", "gram"])
def test_fixed_gradients_match_torch_muon_including_tall_and_square(ns_method):
    shapes = [(64, 32), (48, 64), (33, 33), (5, 70)]
    p0 = [torch.randn(s) * 0.1 for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(STEPS)]

    def run(make):
        ps = [torch.nn.Parameter(p.clone()) for p in p0]
        opt = make(ps)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            opt.step()
        return [p.detach() for p in ps]

    ref = run(lambda ps: torch.optim.Muon(ps, lr=LR))
    max32, mean32 = diffs(run(lambda ps: dt.Muon(ps, lr=LR, ns_method=ns_method, ns_matmul_dtype="fp32")), ref)
    max16, mean16 = diffs(run(lambda ps: dt.Muon(ps, lr=LR, ns_bf16=True)), ref)
    assert worst(max32, ref, None, "fp32") < 1 and worst(max16, ref, None, "ns_bf16") < 1
    assert mean16 * 4 < mean32


def test_adamw_groups_match_torch_adamw():
    model = mlp(bias=True)
    x, y = torch.randn(64, 32), torch.randn(64, 16)
    biases = [p for p in model.parameters() if p.ndim == 1]
    mats = [p for p in model.parameters() if p.ndim == 2]
    m_ref = copy.deepcopy(model)
    ref_b = [p for p in m_ref.parameters() if p.ndim == 1]
    ref_m = [p for p in m_ref.parameters() if p.ndim == 2]
    # Only the AdamW parameters train here (the matrices are frozen in both runs).
    for p in mats + ref_m:
        p.requires_grad_(False)
    ref = train(m_ref, [torch.optim.AdamW(ref_b, lr=1e-2, foreach=False)], x, y)
    got = train(model, [dt.Muon([dict(params=biases, algorithm="adamw", lr=1e-2)])], x, y)
    for a, b in zip(got, ref):
        # fp32 elementwise arithmetic: agreement to a few ulps (torch fuses some products).
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
