# Boundary values of every key each from_* translates (issue 37 item 3): a value is accepted iff the
# original accepts it and then takes the original's steps; a refused value names the key and why.
# torch.optim.Muon runs here, so its cases are decided by running it (accepts? finite result?); the
# others (nanochat, Motif, Dion) accept whatever their code does not check, and their steps are the
# float64 references of migrate_reference.py written from their code (as test_migrate_numerics.py).
# Run: PYTHONPATH=build/python-stage python3 -m pytest tests/python/test_migrate_bounds.py -q
import math
import warnings

import pytest
import torch

import meshmuon.torch as dt
from meshmuon.torch.migrate._common import has_key
from migrate_reference import DION, JORDAN, MOTIF, NANOCHAT, POLAR_EXPRESS, TORCH, Reference

SHAPES = [(12, 6), (6, 12)]  # tall, wide
STEPS = 3
TOL = 1e-4  # fp32 against float64, in units of the adjusted lr (as test_migrate_numerics.py)
B_KEYS = all(has_key(k) for k in ("muon_eq", "muon_plus", "decay_lr"))


def worst_error(make_kwargs, cfg, lr=0.02, wd=0.1, mu=0.9, beta2=None):
    """Largest |p_meshmuon - p_ref| over STEPS steps with the translated group left as translated,
    in units of the adjusted lr (at least 1e-2 of it, so lr = 0 is measured absolutely)."""
    gen = torch.Generator().manual_seed(11)
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen) * 0.1) for s in SHAPES]
    refs = [Reference(p.detach(), cfg) for p in params]
    opt = dt.Muon(**make_kwargs(params), ns_matmul_dtype="fp32")
    worst = 0.0
    for _ in range(STEPS):
        grads = [torch.randn(*s, generator=gen) for s in SHAPES]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for p, ref, g in zip(params, refs, grads):
            lr_adj = ref.step(g, lr, wd, mu, beta2=beta2)
            worst = max(worst, (p.detach().double() - ref.p).abs().max().item() / max(lr_adj, 1e-2))
    return worst


# ---- torch.optim.Muon: run the original to decide each case -------------------------------------

def torch_outcome(kwargs):
    """'error' (torch raises at construction or first step), 'nonfinite' (its parameters are not
    finite after a step), 'zero_update' (finite, but the step moved nothing beyond the decay),
    else 'ok'."""
    p = torch.nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(3)))
    before = p.detach().clone()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt = torch.optim.Muon([p], **kwargs)
            p.grad = torch.randn(6, 4, generator=torch.Generator().manual_seed(4))
            opt.step()
    except (ValueError, RuntimeError, TypeError):
        return "error"
    if not torch.isfinite(p).all():
        return "nonfinite"
    decayed = before * (1 - float(kwargs.get("lr", 1e-3)) * kwargs.get("weight_decay", 0.1))
    return "zero_update" if torch.allclose(p.detach(), decayed, atol=0, rtol=1e-6) else "ok"


# (torch kwargs, torch's outcome, meshmuon: None = takes torch's steps, else the refusal's regex,
#  the reference's rule for the case)
TORCH_CASES = [
    (dict(momentum=0.0), "ok", None, {}),
    (dict(momentum=1.0), "zero_update", None, {}),  # EMA frozen at its zeros: update 0, decay only
    (dict(momentum=1.5), "ok", None, {}),      # torch checks only >= 0: extrapolated EMA
    (dict(momentum=-0.5), "error", r"momentum=-0.5 is negative", {}),
    (dict(momentum=math.inf), "nonfinite", r"momentum=inf: .*inf or NaN", {}),
    (dict(lr=0.0), "zero_update", None, {}),  # nothing moves (the decay is lr·wd)
    (dict(lr=-1.0), "error", r"lr=-1.0 is negative", {}),
    (dict(lr=math.inf), "nonfinite", r"lr=inf: .*inf or NaN", {}),
    (dict(weight_decay=0.0), "ok", None, {}),
    (dict(weight_decay=-0.1), "error", r"weight_decay=-0.1 is negative", {}),
    (dict(weight_decay=math.inf), "nonfinite", r"weight_decay=inf", {}),
    (dict(eps=0.0), "ok", None, dict(eps=0.0)),
    (dict(eps=-1.0), "ok", None, dict(eps=-1.0)),  # clamp(min=-1) never acts: as eps = 0
    (dict(eps=math.inf), "zero_update", r"eps=inf: .*updates are all zero", {}),
    (dict(ns_steps=1), "ok", None, dict(coefficients=JORDAN[:1])),
    (dict(ns_steps=99), "ok", None, dict(coefficients=JORDAN[:1] * 99)),
    (dict(ns_steps=100), "error", r"ns_steps=100: torch.optim.Muon raises at its first step", {}),
    (dict(ns_steps=0), "ok", r"ns_steps=0: .*no Newton-Schulz step", {}),  # engine needs >= 1 step
    (dict(ns_steps=-1), "ok", r"ns_steps=-1: .*no Newton-Schulz step", {}),
    (dict(ns_coefficients=(1.0, 0.0, 0.0)), "ok", None, dict(coefficients=[(1.0, 0.0, 0.0)] * 5)),
    (dict(ns_coefficients=(3.0, -3.0)), "error", r"ns_coefficients=.* must be one \(a, b, c\) triple", {}),
    (dict(nesterov=False), "ok", None, dict(nesterov=False)),
    (dict(adjust_lr_fn="match_rms_adamw"), "ok", None, dict(lr_ratio=MOTIF["lr_ratio"])),
    (dict(adjust_lr_fn="none"), "error", r"adjust_lr_fn='none' is not one of", {}),
]


@pytest.mark.parametrize("kwargs,outcome,refusal,rule", TORCH_CASES,
                         ids=[",".join(f"{k}={v}" for k, v in c[0].items()) for c in TORCH_CASES])
def test_torch_muon_boundary_values(kwargs, outcome, refusal, rule):
    assert torch_outcome(kwargs) == outcome  # the original, run here
    lr, wd, mu = kwargs.get("lr", 0.02), kwargs.get("weight_decay", 0.1), kwargs.get("momentum", 0.9)
    make = lambda params: dt.from_torch_muon(params, **dict(dict(lr=lr, weight_decay=wd, momentum=mu),
                                                            **kwargs))
    if refusal is not None:
        with pytest.raises(ValueError, match=r"\[migrate\] torch.optim.Muon param group 0: " + refusal):
            make([torch.nn.Parameter(torch.randn(4, 4))])
        return
    assert worst_error(make, dict(TORCH, **rule), lr, wd, mu) < TOL


def test_torch_muon_momentum_one_update_is_decay_only():
    """momentum = 1 in torch: buf.lerp_(g, 0) keeps its zeros, so the orthogonalized update is 0 and
    only the decay moves the parameter (meshmuon bitwise the same)."""
    w = torch.nn.Parameter(torch.randn(6, 4))
    w0 = w.detach().clone()
    opt = dt.Muon(**dt.from_torch_muon([w], lr=0.1, weight_decay=0.5, momentum=1.0))
    for _ in range(2):
        w.grad = torch.randn(6, 4)
        opt.step()
    expected = w0 * (1 - 0.1 * 0.5) * (1 - 0.1 * 0.5)
    assert torch.allclose(w.detach(), expected, rtol=1e-6, atol=0)
    assert opt.state[w]["momentum_buffer"].abs().max() == 0


# ---- nanochat: no checks of its own; the reference decides the steps ------------------------------

def nanochat(params, **group):
    base = dict(kind="muon", params=params, lr=0.02, momentum=0.9, ns_steps=5, beta2=0.9,
                weight_decay=0.1)
    return dt.from_nanochat([dict(base, **group)])


NANOCHAT_ACCEPTED = [
    dict(momentum=0.0), dict(momentum=1.0), dict(momentum=1.5), dict(lr=0.0), dict(weight_decay=0.0),
    dict(beta2=0.0), dict(beta2=1.0), dict(beta2=1.5), dict(beta2=None), dict(ns_steps=7),
    dict(ns_steps=1), dict(ns_steps=4),
]
NANOCHAT_REFUSED = [
    (dict(momentum=-0.1), r"momentum=-0.1 is negative: nanochat does not check it"),
    (dict(lr=-0.02), r"lr=-0.02 is negative"), (dict(weight_decay=-0.1), r"weight_decay=-0.1 is negative"),
    (dict(momentum=math.inf), r"momentum=inf: nanochat would take it .*inf or NaN"),
    (dict(lr=math.nan), r"lr=nan: .*inf or NaN"), (dict(beta2=-0.5), r"beta2=-0.5 is negative"),
    (dict(ns_steps=0), r"ns_steps=0: nanochat then runs no Polar Express step"),
    (dict(ns_steps=-2), r"ns_steps=-2: "), (dict(ns_steps=4.0), r"ns_steps=4.0: "),
]


@pytest.mark.parametrize("group", NANOCHAT_ACCEPTED, ids=lambda g: ",".join(f"{k}={v}" for k, v in g.items()))
def test_nanochat_boundary_values_take_nanochats_steps(group):
    if not B_KEYS:
        pytest.skip("this meshmuon build lacks muon_eq / muon_plus / decay_lr (issue 31 B)")
    values = dict(dict(lr=0.02, weight_decay=0.1, momentum=0.9, beta2=0.9), **group)
    ref_beta2 = 0.0 if values["beta2"] is None else values["beta2"]
    rows = POLAR_EXPRESS[:group.get("ns_steps", 5)]  # nanochat's table[:ns_steps]
    err = worst_error(lambda ps: nanochat(ps, **group), dict(NANOCHAT, coefficients=rows),
                      values["lr"], values["weight_decay"], values["momentum"], ref_beta2)
    assert err < TOL


@pytest.mark.parametrize("group,refusal", NANOCHAT_REFUSED, ids=lambda v: str(v)[:30])
def test_nanochat_values_meshmuon_cannot_take_are_refused(group, refusal):
    with pytest.raises(ValueError, match=r"\[migrate\] nanochat param group 0: " + refusal):
        nanochat([torch.nn.Parameter(torch.randn(4, 4))], **group)


@pytest.mark.parametrize("betas,eps,refusal", [
    ((1.0, 0.95), 1e-10, r"betas\[0\]=1.0: 1 - beta\^t is 0"), ((0.8, 1.0), 1e-10, r"betas\[1\]=1.0"),
    ((0.8, 1.2), 1e-10, r"betas\[1\]=1.2: its AdamW bias correction"), ((-0.1, 0.9), 1e-10, r"betas\[0\]=-0.1"),
    ((0.8, 0.95), 0.0, r"eps=0.0: nanochat's AdamW divides"), ((0.0, 0.0), 1e-10, None)])
def test_nanochat_adamw_boundary_values(betas, eps, refusal):
    group = dict(kind="adamw", params=[torch.nn.Parameter(torch.randn(5))], lr=0.004, betas=betas,
                 eps=eps, weight_decay=0.0)
    if refusal is None:
        dt.Muon(**dt.from_nanochat([group]))  # betas (0, 0): m = g, v = g^2, accepted by both
        return
    with pytest.raises(ValueError, match=r"\[migrate\] nanochat param group 0: " + refusal):
        dt.from_nanochat([group])


# ---- Motif: no checks; heavy-ball momentum; Newton-Schulz ignores ns_steps ------------------------

def motif(params, **group):
    return dt.from_motif([dict(dict(params=params, use_muon=True), **group)], lr=0.02, momentum=0.9,
                         weight_decay=0.1)


@pytest.mark.parametrize("group", [dict(momentum=0.0), dict(momentum=1.0), dict(momentum=1.5),
                                   dict(lr=0.0), dict(weight_decay=0.0), dict(ns_steps=0),
                                   dict(ns_steps=6), dict(ns_steps=-1), dict(nesterov=False)],
                         ids=lambda g: ",".join(f"{k}={v}" for k, v in g.items()))
def test_motif_boundary_values_take_motifs_steps(group):
    values = dict(dict(lr=0.02, weight_decay=0.1, momentum=0.9), **group)
    cfg = dict(MOTIF, nesterov=group.get("nesterov", True))
    assert worst_error(lambda ps: motif(ps, **group), cfg, values["lr"], values["weight_decay"],
                       values["momentum"]) < TOL


def test_motif_momentum_one_is_a_pure_sum():
    """momentum = 1 in Motif (buf.mul_(1).add_(g)): the buffer is the plain sum of the gradients."""
    w = torch.nn.Parameter(torch.randn(6, 4))
    opt = dt.Muon(**motif([w], momentum=1.0))
    total = torch.zeros(6, 4)
    for k in range(3):
        w.grad = torch.full((6, 4), float(k + 1)) * torch.arange(24.0).reshape(6, 4)
        total += w.grad
        opt.step()
    assert torch.equal(opt.state[w]["momentum_buffer"], total)


@pytest.mark.parametrize("group,refusal", [
    (dict(momentum=-0.5), r"momentum=-0.5 is negative: Motif Muon does not check it"),
    (dict(lr=-1.0), r"lr=-1.0 is negative"), (dict(weight_decay=math.inf), r"weight_decay=inf"),
    (dict(use_muon=False, adamw_betas=(0.9, 1.0)), r"adamw_betas\[1\]=1.0: 1 - beta\^t is 0"),
    (dict(use_muon=False, adamw_eps=0.0), r"adamw_eps=0.0: Motif's AdamW divides")],
    ids=lambda v: str(v)[:30])
def test_motif_values_meshmuon_cannot_take_are_refused(group, refusal):
    with pytest.raises(ValueError, match=r"\[migrate\] Motif Muon param group 0: " + refusal):
        motif([torch.nn.Parameter(torch.randn(4, 4))], **group)


# ---- Dion: checks lr, mu, betas >= 0 on its constructor arguments only ----------------------------

def dion(params, **group):
    return dt.from_dion([dict(dict(params=params, lr=0.02, mu=0.9, weight_decay=0.1), **group)],
                        adjust_lr="rms_norm")


@pytest.mark.parametrize("group", [dict(mu=0.0), dict(mu=1.0), dict(mu=1.5), dict(lr=0.0),
                                   dict(weight_decay=0.0), dict(epsilon=0.0), dict(nesterov=True)],
                         ids=lambda g: ",".join(f"{k}={v}" for k, v in g.items()))
def test_dion_boundary_values_take_dions_steps(group):
    values = dict(dict(lr=0.02, weight_decay=0.1, mu=0.9), **group)
    cfg = dict(DION, eps=group.get("epsilon", DION["eps"]), nesterov=group.get("nesterov", False))
    assert worst_error(lambda ps: dion(ps, **group), cfg, values["lr"], values["weight_decay"],
                       values["mu"]) < TOL


@pytest.mark.parametrize("group,refusal", [
    (dict(mu=-0.1), r"mu=-0.1 is negative: Dion's Muon refuses it as a constructor argument"),
    (dict(lr=-0.1), r"lr=-0.1 is negative"), (dict(weight_decay=-0.1), r"weight_decay=-0.1 is negative"),
    (dict(epsilon=-1e-8), r"epsilon=-1e-08 is negative"), (dict(mu=math.inf), r"mu=inf"),
    (dict(algorithm="adamw", beta1=1.0), r"beta1=1.0: 1 - beta\^t is 0"),
    (dict(algorithm="adamw", beta2=1.5), r"beta2=1.5: its AdamW bias correction"),
    (dict(algorithm="adamw", epsilon=0.0), r"epsilon=0 in an AdamW group")],
    ids=lambda v: str(v)[:30])
def test_dion_values_meshmuon_cannot_take_are_refused(group, refusal):
    with pytest.raises(ValueError, match=r"\[migrate\] Dion Muon param group 0: " + refusal):
        dion([torch.nn.Parameter(torch.randn(4, 4))], **group)


def test_dion_adamw_beta_zero_is_accepted():
    v = torch.nn.Parameter(torch.randn(5))
    dt.Muon(**dt.from_dion([dict(params=[v], algorithm="adamw", beta1=0.0, beta2=0.0)]))


# ---- negative control: a reference with another boundary rule is detected -------------------------

def test_negative_control_momentum_one_rules_differ():
    """EMA and heavy ball agree nowhere at momentum 1 (frozen vs summed buffer): swapping them
    must fail the comparison, so the accepted cases above cannot pass vacuously."""
    make = lambda ps: dt.from_torch_muon(ps, lr=0.02, weight_decay=0.1, momentum=1.0)
    assert worst_error(make, TORCH, mu=1.0) < TOL
    assert worst_error(make, dict(TORCH, momentum="heavy_ball"), mu=1.0) > 10 * TOL
    make = lambda ps: nanochat(ps, beta2=1.0)
    if B_KEYS:
        prefix = lambda ps: nanochat(ps, ns_steps=2)
        assert worst_error(prefix, dict(NANOCHAT, coefficients=POLAR_EXPRESS[:2]), beta2=0.9) < TOL
        assert worst_error(prefix, NANOCHAT, beta2=0.9) > 10 * TOL  # 5 rows: another update
        assert worst_error(make, NANOCHAT, beta2=1.0) < TOL
        assert worst_error(make, NANOCHAT, beta2=0.5) > 10 * TOL


# ---- per-step ns_coefficients (what nanochat's ns_steps 1-4 translate to) -------------------------

def test_per_step_coefficients_are_a_custom_schedule():
    rows = [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]
    make = lambda ps: dict(params=ps, lr=0.02, weight_decay=0.1, momentum=0.9, ns_schedule="custom",
                           ns_steps=2, ns_coefficients=rows)
    assert worst_error(make, dict(TORCH, coefficients=rows)) < TOL
    assert worst_error(make, dict(TORCH, coefficients=rows[::-1])) > 10 * TOL  # order matters
    w = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"group 0: ns options: .*custom schedule has 3"):
        dt.Muon([w], ns_schedule="custom", ns_steps=2, ns_coefficients=rows + rows[:1])
    with pytest.raises(ValueError, match=r"ns_coefficients must be \(a, b, c\), or one \(a, b, c\) per step"):
        dt.Muon([w], ns_schedule="custom", ns_steps=1, ns_coefficients=[(1.0, 2.0)])
