# nanochat's Muon options on meshmuon.torch.Muon (issue 31): the group keys `muon_eq`, `muon_plus` and
# `decay_lr`, against a float64 torch reference of nanochat's muon_step_fused order (momentum ->
# MuonEq -> normalize -> Polar Express -> Muon+ -> NorMuon -> cautious decay + update), with
# negative controls; the keys' validation; and changes between steps.
import math

import pytest
import torch

import meshmuon
import meshmuon.torch as dt

# nanochat's normalization X / (|X| * 1.01 + 1e-6), its Polar Express steps, NorMuon, cautious decay
# on the adjusted lr.
NANOCHAT = dict(ns_schedule="polar_express", ns_steps=5, ns_scale=1.01, eps=1e-6, eps_mode="add",
                ns_matmul_dtype="fp32", normuon=True, normuon_beta2=0.95, cautious_wd=True,
                muon_eq=True, muon_plus=True, decay_lr="adjusted")
SHAPES = [(12, 20), (20, 12), (16, 16)]  # wide, tall (lr adjusted by sqrt(20/12)), square
LR, WD, MOMENTUM, STEPS = 0.02, 0.1, 0.95, 3


def coefficients():
    o = meshmuon.NsOptions()
    o.schedule, o.steps = "polar_express", 5
    return o.coefficients()


def grads(step):
    g = torch.Generator().manual_seed(40 + step)
    out = []
    for i, (m, n) in enumerate(SHAPES):
        x = torch.randn(m, n, generator=g)
        if i == 0:  # rows of very different scales: MuonEq matters
            x *= torch.logspace(-2, 2, m).unsqueeze(1)
        out.append(x)
    return out


def initial_params():
    g = torch.Generator().manual_seed(7)
    return [torch.randn(m, n, generator=g) for m, n in SHAPES]


def reference_step(p, g, buf, v, muon_eq=True, muon_plus=True, adjusted=True):
    """nanochat's muon_step_fused for one matrix, in float64 (p, buf, v updated in place)."""
    m, n = p.shape
    buf.lerp_(g, 1 - MOMENTUM)
    x = g.lerp(buf, MOMENTUM)
    if muon_eq:
        target = x.norm() / m ** 0.5
        x = x * (target / x.norm(dim=-1, keepdim=True).clamp_min(1e-6))
    x = x / (x.norm() * 1.01 + 1e-6)
    for a, b, c in coefficients():
        if m > n:
            A = x.mT @ x
            x = a * x + x @ (b * A + c * (A @ A))
        else:
            A = x @ x.mT
            x = a * x + (b * A + c * (A @ A)) @ x
    if muon_plus:
        x = x * (min(m, n) ** 0.5 / x.norm().clamp_min(1e-6))
    red = -1 if m >= n else -2
    v_mean = x.square().mean(dim=red, keepdim=True)
    k = x.size(red)
    v_norm = (v_mean.sum() * k).sqrt()
    v.lerp_(v_mean, 1 - 0.95)
    step = v.clamp_min(1e-10).rsqrt()
    v_norm_new = ((v_mean * k) * step.square()).sum().sqrt()
    x = x * (step * (v_norm / v_norm_new.clamp_min(1e-10)))
    lr_adj = LR * max(1.0, m / n) ** 0.5
    lr_wd = (lr_adj if adjusted else LR) * WD
    mask = (x * p) >= 0
    p.sub_(lr_adj * x + lr_wd * p * mask)


def reference(**kw):
    ps = [w.double() for w in initial_params()]
    bufs = [torch.zeros_like(w) for w in ps]
    vs = [torch.zeros(m, 1, dtype=torch.float64) if m >= n else torch.zeros(1, n, dtype=torch.float64)
          for m, n in SHAPES]
    for s in range(STEPS):
        for p, g, b, v in zip(ps, grads(s), bufs, vs):
            reference_step(p, g.double(), b, v, **kw)
    return ps


def run_meshmuon(**options):
    ws = [torch.nn.Parameter(w.clone()) for w in initial_params()]
    opt = dt.Muon([dict(params=ws)], lr=LR, weight_decay=WD, momentum=MOMENTUM, **options)
    for s in range(STEPS):
        for w, g in zip(ws, grads(s)):
            w.grad = g.clone()
        opt.step()
    return [w.detach().double() for w in ws]


def rel_change_error(got, want):
    """max |(got - p0) - (want - p0)| / max |want - p0| over all matrices: the error relative to the
    size of what the steps changed."""
    p0 = [w.double() for w in initial_params()]
    return max(((g - p) - (w - p)).abs().max().item() / (w - p).abs().max().item()
               for g, w, p in zip(got, want, p0))


# fp32 products in Newton-Schulz leave 2e-6 .. 7e-6 relative error in U (tests/unit/muon_eq_plus_test.cpp
# measures it against the same formula in double); NorMuon and the update add fp32 roundings of
# ~1e-7 each. Measured here: 6.7e-6 after 3 steps, so 1e-4 has a margin of ~15x. Each option off is
# off by 3e-2 (muon_plus), 7e-2 (decay_lr) and 0.6 (muon_eq) (the negative controls below).
# (meshmuon's Polar Express coefficients equal nanochat's hard-coded ones to ~1e-14.)
TOL = 1e-4


def test_matches_a_float64_reference_of_nanochats_step():
    got = run_meshmuon(**NANOCHAT)
    assert rel_change_error(got, reference()) < TOL


@pytest.mark.parametrize("flip", ["muon_eq", "muon_plus", "decay_lr"])
def test_each_option_is_applied_and_matched_alone(flip):
    # meshmuon with one option off matches the reference with it off, and not the full reference
    # (negative control: the comparison above would catch a missing option).
    options = dict(NANOCHAT)
    options[flip] = "unadjusted" if flip == "decay_lr" else False
    kw = {"muon_eq": True, "muon_plus": True, "adjusted": True}
    kw["adjusted" if flip == "decay_lr" else flip] = False
    got = run_meshmuon(**options)
    assert rel_change_error(got, reference(**kw)) < TOL
    assert rel_change_error(got, reference()) > 10 * TOL


def test_keys_validate_with_the_key_named():
    w = torch.nn.Parameter(torch.randn(4, 6))
    with pytest.raises(ValueError, match=r"decay_lr='scaled'; use 'unadjusted'"):
        dt.Muon([dict(params=[w], decay_lr="scaled")])
    with pytest.raises(ValueError, match=r"muon_eq='yes'; use True or False"):
        dt.Muon([w], muon_eq="yes")
    with pytest.raises(ValueError, match=r"muon_plus=1; use True or False"):
        dt.Muon([dict(params=[w], muon_plus=1)])
    with pytest.raises(ValueError, match=r"muon_eq is not combined with bf16_rounding"):
        dt.Muon([w], muon_eq=True, ns_bf16=True)
    with pytest.raises(ValueError, match=r"'muoneq' \(use muon_eq\)"):
        dt.Muon([dict(params=[w], muoneq=True)])
    opt = dt.Muon([w], muon_eq=True, muon_plus=True, decay_lr="adjusted")  # valid values pass
    assert opt.param_groups[0]["decay_lr"] == "adjusted"
    assert dt.Muon([w]).param_groups[0]["muon_eq"] is False  # defaults: off / unadjusted


def test_a_bad_value_set_between_steps_raises_before_anything_changes():
    w = torch.nn.Parameter(torch.randn(4, 6))
    opt = dt.Muon([w])
    w.grad = torch.randn(4, 6)
    opt.param_groups[0]["decay_lr"] = "both"
    before = w.detach().clone()
    with pytest.raises(ValueError, match="param group 0: decay_lr='both'"):
        opt.step()
    assert torch.equal(w, before)


def test_keys_changed_between_steps_take_effect():
    # The step reads the keys every step: turning the options on after step 1 gives the reference
    # with them off for step 1 and on afterwards (compared with a run that had them on throughout).
    ws = [torch.nn.Parameter(w.clone()) for w in initial_params()]
    off = dict(NANOCHAT, muon_eq=False, muon_plus=False, decay_lr="unadjusted")
    opt = dt.Muon([dict(params=ws)], lr=LR, weight_decay=WD, momentum=MOMENTUM, **off)
    for s in range(STEPS):
        if s == 1:
            opt.param_groups[0].update(muon_eq=True, muon_plus=True, decay_lr="adjusted")
        for w, g in zip(ws, grads(s)):
            w.grad = g.clone()
        opt.step()
    got = [w.detach().double() for w in ws]
    # the reference, switched the same way
    ps = [w.double() for w in initial_params()]
    bufs = [torch.zeros_like(w) for w in ps]
    vs = [torch.zeros(m, 1, dtype=torch.float64) if m >= n else torch.zeros(1, n, dtype=torch.float64)
          for m, n in SHAPES]
    for s in range(STEPS):
        on = s >= 1
        for p, g, b, v in zip(ps, grads(s), bufs, vs):
            reference_step(p, g.double(), b, v, muon_eq=on, muon_plus=on, adjusted=on)
    assert rel_change_error(got, ps) < TOL
    assert rel_change_error(got, reference()) > 10 * TOL
    assert math.isfinite(rel_change_error(got, ps))


def test_the_orthogonalizer_binding_carries_both_flags():
    # meshmuon.NsOptions exposes muon_eq / muon_plus and meshmuon.Orthogonalizer honours them: Muon+ gives
    # |U|_F = sqrt(min(m, n)) (fp32 rounding), without it Polar Express leaves the norm elsewhere.
    x = torch.randn(24, 40, generator=torch.Generator().manual_seed(3))
    for plus in (True, False):
        o = meshmuon.NsOptions()
        o.schedule, o.steps, o.muon_eq, o.muon_plus = "polar_express", 5, True, plus
        assert (o.muon_eq, o.muon_plus) == (True, plus)
        out = torch.empty_like(x)
        meshmuon.Orthogonalizer(o).run(x, out)
        err = abs(out.double().norm().item() / math.sqrt(24) - 1)
        assert (err < 1e-6) if plus else (err > 1e-4)
