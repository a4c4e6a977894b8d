# Agreement bounds with torch.optim.Muon per step and per shape class (docs/python.md, "Numerics vs
# torch.optim.Muon"), on fixed seeds and on seeds drawn at test time: MESHMUON_TEST_SEED=<n> pins the
# drawn seed; every failure message names the seed, shape, input kind, step and mode.
#
# The bound after T steps is |p_meshmuon - p_torch| <= T * lr_adj * beta (tolerances.py): beta a
# multiple of B(m, n) for any input, or a fixed bound for dense inputs (full rank, min(m, n) >= 34,
# no cluster of near-zero singular values: i.i.d. entries). Why B has this form: torch rounds X to bf16, so X's
# near-null singular directions receive rounding noise, which 5 Jordan steps amplify by up to
# a^5 = 485 until the noise becomes singular values of order 1 (p^5 maps [0, 1] into [0, 1.2]);
# entries of such a spurious component are those of a random partial isometry,
# <= ~sqrt(2 ln(mn) / max(m, n)). meshmuon's fp32 iteration has no such noise (2^-24 * 485).
import math
import os

import pytest
import torch

import meshmuon.torch as dt
from tolerances import bound_any, per_step_bound

LR, WD, MU = 0.02, 0.1, 0.95
A, B_, C = 3.4445, -4.7750, 2.0315
SEED = int(os.environ.get("MESHMUON_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
MODES = {"fp32": dict(ns_matmul_dtype="fp32"), "ns_bf16": dict(ns_bf16=True), "bf16_products": dict(ns_matmul_dtype="bf16")}


def lr_adj(shape):
    a, b = shape[-2:]
    return LR * math.sqrt(max(1.0, a / b))


def haar(n, gen):
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def matrix_grads(kind, m, n, steps, gen):
    if kind == "gauss":
        return [torch.randn(m, n, generator=gen) for _ in range(steps)]
    if kind.startswith("rank"):
        r = int(kind[4:])
        return [torch.randn(m, r, generator=gen) @ torch.randn(r, n, generator=gen) for _ in range(steps)]
    assert kind == "window"  # one singular value at ||G||_F * 10^-2..10^-4.5, where a^5 amplifies most
    s = min(m, n)
    u, v = haar(m, gen)[:, :s], haar(n, gen)[:, :s]
    sig = torch.rand(s, generator=gen, dtype=torch.float64) + 0.2
    sig[-1] = 10 ** (-2 - 2.5 * torch.rand(1, generator=gen).item()) * sig.norm()
    return [((u * sig) @ v.T).float()] * steps


def problem(shape, kind, seed, steps):
    gen = torch.Generator().manual_seed(seed)
    p0 = torch.randn(shape, generator=gen) * 0.1
    if len(shape) == 2:
        return p0, matrix_grads(kind, *shape, steps, gen)
    per = [matrix_grads(kind, *shape[1:], steps, gen) for _ in range(shape[0])]
    return p0, [torch.stack([e[t] for e in per]) for t in range(steps)]


def trajectory(make, p0, grads, split):
    """Parameters after each step; `split`: a [E, m, n] stack as E separate 2-D parameters."""
    ps = [torch.nn.Parameter(e.clone()) for e in (p0.unbind(0) if split else [p0])]
    opt, out = make(ps), []
    for g in grads:
        for p, e in zip(ps, g.unbind(0) if split else [g]):
            p.grad = e.clone()
        opt.step()
        out.append(torch.stack([p.detach().clone() for p in ps]) if split else ps[0].detach().clone())
    return out


def meshmuon_trajectory(mode, p0, grads, nesterov=True):
    kw = dict(lr=LR, weight_decay=WD, momentum=MU, nesterov=nesterov, **MODES[mode])
    if p0.ndim == 3:
        return trajectory(lambda ps: dt.Muon([dict(params=ps, expert_stacks=True)], **kw), p0, grads, False)
    return trajectory(lambda ps: dt.Muon(ps, **kw), p0, grads, False)


def torch_trajectory(p0, grads, nesterov=True):
    return trajectory(lambda ps: torch.optim.Muon(ps, lr=LR, weight_decay=WD, momentum=MU, nesterov=nesterov),
                      p0, grads, p0.ndim == 3)


def per_step_ratios(got, ref, shape, per_step):
    """max|dp| after step t over t * lr_adj * per_step, for t = 1..T."""
    return [(a - b).abs().max().item() / (t * lr_adj(shape) * per_step)
            for t, (a, b) in enumerate(zip(got, ref), 1)]


def check_bounds(shape, kind, seed, steps=3, dense=False):
    p0, grads = problem(shape, kind, seed, steps)
    ref = torch_trajectory(p0, grads)
    m, n = shape[-2:]
    worst = {}
    for mode in MODES:
        per_step = per_step_bound(mode, m, n, dense)
        r = per_step_ratios(meshmuon_trajectory(mode, p0, grads), ref, shape, per_step)
        for t, x in enumerate(r, 1):
            assert x < 1, (f"seed {seed} (MESHMUON_TEST_SEED={SEED}): {mode} vs torch.optim.Muon on "
                           f"{shape} {kind} inputs, step {t}: |dp| = {x:.2f} x the bound")
        worst[mode] = max(r)
    return worst


CLASSES = {
    "vector": ([(1, 1), (1, 7), (64, 1), (1, 300)], ["gauss"]),
    "tiny": ([(2, 2), (3, 3), (8, 8), (16, 16), (33, 33)], ["gauss", "rank1", "window"]),
    "tall": ([(300, 140), (64, 8), (40, 2)], ["gauss", "rank1", "window"]),
    "wide": ([(96, 160), (5, 70), (2, 200)], ["gauss", "rank1", "window"]),
    "stack": ([(4, 96, 160), (3, 8, 8)], ["gauss", "rank1", "window"]),
    "rank_deficient": ([(128, 128), (48, 200), (200, 48), (33, 33)], ["rank1", "rank4", "rank16"]),
}


@pytest.mark.parametrize("cls", list(CLASSES))
def test_every_step_is_within_the_class_bound(cls):
    shapes, kinds = CLASSES[cls]
    seeds = [0, 1, SEED, SEED + 1]
    worst = {}
    for shape in shapes:
        for kind in kinds:
            for seed in seeds:
                for mode, x in check_bounds(shape, kind, seed).items():
                    worst[mode] = max(worst.get(mode, 0), x)
    print(f"{cls}: worst |dp| / bound " + ", ".join(f"{k} {v:.2f}" for k, v in worst.items()))


def test_dense_inputs_are_within_the_dense_bound():
    worst = {}
    for shape in [(34, 34), (64, 64), (48, 200), (200, 48), (300, 140)]:
        for seed in (0, 1, SEED, SEED + 1):
            for mode, x in check_bounds(shape, "gauss", seed, dense=True).items():
                worst[mode] = max(worst.get(mode, 0), x)
    print("dense: worst |dp| / bound " + ", ".join(f"{k} {v:.2f}" for k, v in worst.items()))


# ---- the cases of issue 10 that broke the previous bounds (each exceeded them; see the asserts) ----

def old_ratio(got, ref, shape, per_step, t):
    return per_step_ratios(got, ref, shape, per_step)[t - 1]


def test_fp32_8x8_first_step():
    # The old bound T * lr_adj * 2^-6 was exceeded 3.9x at step 1 (20 seeds); B(8, 8) = 1.5 holds.
    old = 0
    for seed in range(20):
        p0, grads = problem((8, 8), "gauss", seed, 1)
        ref, got = torch_trajectory(p0, grads), meshmuon_trajectory("fp32", p0, grads)
        old = max(old, old_ratio(got, ref, (8, 8), 2**-6, 1))
        assert per_step_ratios(got, ref, (8, 8), bound_any(8, 8))[0] < 1, f"seed {seed}"
    assert old > 3, old  # the case still breaks the old bound


@pytest.mark.parametrize("seed", [26, 34, 201])
def test_fp32_3x3_after_seven_steps(seed):
    # 3x3, 7 steps: the old bound was exceeded 1.6-2.1x at step 7 on these seeds.
    p0, grads = problem((3, 3), "gauss", seed, 7)
    ref, got = torch_trajectory(p0, grads), meshmuon_trajectory("fp32", p0, grads)
    assert old_ratio(got, ref, (3, 3), 2**-6, 7) > 1.2
    assert max(per_step_ratios(got, ref, (3, 3), bound_any(3, 3))) < 1


def test_ns_bf16_expert_stack_seed_11():
    # [4, 96, 160] stack, seed 11, Nesterov: the old ns_bf16 bound T * lr_adj * 2^-9 was exceeded
    # (2x at step 1); the per-step bounds B/8 (any input) and 2^-6 (dense) hold.
    shape = (4, 96, 160)
    p0, grads = problem(shape, "gauss", 11, 3)
    ref, got = torch_trajectory(p0, grads), meshmuon_trajectory("ns_bf16", p0, grads)
    assert old_ratio(got, ref, shape, 2**-9, 1) > 1.5
    assert max(per_step_ratios(got, ref, shape, per_step_bound("ns_bf16", 96, 160))) < 1
    assert max(per_step_ratios(got, ref, shape, per_step_bound("ns_bf16", 96, 160, dense=True))) < 1
    # Not "most elements bitwise equal": the step-1 updates agree bitwise on 40-80% of the elements.
    same = (got[0] == ref[0]).double().mean().item()
    assert 0.3 < same < 0.95, same


# ---- ns_matmul_dtype="bf16": error against the exact (float64) Newton-Schulz, against torch's ----

def orthogonalized(g, **kw):
    """One step from p = 0 with momentum 0 and no decay: p = -lr_adj * NS(g)."""
    p = torch.nn.Parameter(torch.zeros_like(g))
    p.grad = g.clone()
    opt = (dt.Muon if kw else torch.optim.Muon)([p], lr=1.0, weight_decay=0.0, momentum=0.0, **kw)
    opt.step()
    return -p.detach().double() / math.sqrt(max(1.0, g.shape[0] / g.shape[1]))


def exact_ns(g, steps=5):
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        a = x @ x.T
        x = A * x + (B_ * a + C * a @ a) @ x
    return x.T if tall else x


def errors_vs_exact(shape, seeds):
    dm, tc = [], []
    for seed in seeds:
        g = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        ex = exact_ns(g)
        dm.append((orthogonalized(g, ns_matmul_dtype="bf16") - ex).abs().max().item() / 2**-6)
        tc.append((orthogonalized(g) - ex).abs().max().item() / 2**-6)
    return dm, tc


@pytest.mark.parametrize("shape", [(64, 1), (33, 33)])
def test_bf16_products_issue_cases_are_no_worse_than_torch(shape):
    # Before the fix (b·A from the fp32 A, A² from the bf16 A) meshmuon's worst over seeds 0..99 was
    # 0.94 (64x1) and 1.68 (33x33) against torch's 0.55 and 1.49, its mean 0.30 and 0.82 against
    # 0.28 and 0.65 (units of 2^-6).
    dm, tc = errors_vs_exact(shape, range(100))
    print(f"{shape}: bf16 products max {max(dm):.3f} mean {sum(dm) / 100:.3f}; "
          f"torch max {max(tc):.3f} mean {sum(tc) / 100:.3f}")
    assert max(dm) <= max(tc) and sum(dm) < sum(tc)


@pytest.mark.parametrize("shape", [(64, 1), (1, 64), (33, 33), (96, 160), (300, 140)])
def test_bf16_products_error_is_below_torchs_on_random_seeds(shape):
    n = 30 if shape[0] * shape[1] > 10000 else 60
    seeds = [(SEED + i) % 2**32 for i in range(n)]
    dm, tc = errors_vs_exact(shape, seeds)
    assert sum(dm) < sum(tc), (f"MESHMUON_TEST_SEED={SEED}: {shape} mean error vs float64 "
                               f"{sum(dm) / n:.3f} (bf16 products) vs {sum(tc) / n:.3f} (torch)")
