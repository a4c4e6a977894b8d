# meshmuon.torch.Muon built from a translated group takes the peer's own steps: each peer's update is
# written from its code in float64 (migrate_reference.py, not from meshmuon's mapping) and compared
# with meshmuon (fp32 products) over a few steps with schedules changing lr, momentum and weight decay
# between steps through the peer's own keys. Negative controls: the same comparison with one rule of
# the reference changed fails, so the tolerance cannot pass a mistranslation.
# Run: PYTHONPATH=build/python-stage python3 -m pytest tests/python/test_migrate_numerics.py -q
import copy

import pytest
import torch

import meshmuon.torch as dt
from meshmuon.torch.migrate._common import has_key
from migrate_reference import DION, JORDAN, MOTIF, NANOCHAT, TORCH, YOU, Reference

SHAPES = [(48, 24), (24, 48), (32, 32)]  # tall, wide, square
STEPS = 4
SCHEDULE = [(0.02, 0.1, 0.9), (0.03, 0.05, 0.95), (0.01, 0.2, 0.85), (0.02, 0.1, 0.95)]  # lr, wd, mu
B_KEYS = all(has_key(k) for k in ("muon_eq", "muon_plus", "decay_lr"))
NANOCHAT_APPROX = dict(NANOCHAT, muon_eq=False, muon_plus=False, decay_adjusted=False)


def peer_case(peer, params, beta2=0.9):
    """(Muon kwargs, key for momentum in the peer's groups) for one Muon group of `params`."""
    if peer.startswith("nanochat"):
        group = dict(kind="muon", params=params, lr=0.02, momentum=0.9, ns_steps=5, beta2=beta2,
                     weight_decay=0.1)
        flags = {} if peer == "nanochat" else dict(muon_eq=False, muon_plus=False,
                                                    decay_lr="unadjusted")
        return dt.from_nanochat([group], **flags), "momentum"
    if peer == "motif":
        return dt.from_motif([dict(params=params, use_muon=True)], lr=0.02), "momentum"
    if peer.startswith("dion"):
        cautious = peer == "dion_cautious"
        return dt.from_dion([dict(params=params, cautious_wd=cautious)], adjust_lr="rms_norm"), "mu"
    return dt.from_torch_muon(params), "momentum"


CONFIGS = {"nanochat": NANOCHAT, "nanochat_approx": NANOCHAT_APPROX, "motif": MOTIF, "dion": DION,
           "dion_cautious": dict(DION, cautious=True), "torch": TORCH}


def run(peer, cfg, beta2=0.9, ref_beta2=None):
    """Largest |p_meshmuon - p_ref| over the parameters, in units of the step's adjusted lr.
    `beta2`: nanochat's group value; `ref_beta2`: the reference's (default: the same; None as
    nanochat reads it, 0.0)."""
    if ref_beta2 is None:
        ref_beta2 = 0.0 if beta2 is None else beta2
    gen = torch.Generator().manual_seed(7)
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen) * 0.1) for s in SHAPES]
    refs = [Reference(p.detach(), cfg) for p in params]
    kwargs, mu_key = peer_case(peer, params, beta2)
    opt = dt.Muon(**kwargs, ns_matmul_dtype="fp32")
    worst, scale = 0.0, 0.0
    for lr, wd, mu in SCHEDULE:
        grads = [torch.randn(*s, generator=gen) for s in SHAPES]
        group = opt.param_groups[0]
        group["lr"], group["weight_decay"], group[mu_key] = lr, wd, mu  # the peer's keys
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for p, ref, g in zip(params, refs, grads):
            lr_adj = ref.step(g, lr, wd, mu, beta2=ref_beta2)
            scale = max(scale, lr_adj)
            worst = max(worst, (p.detach().double() - ref.p).abs().max().item() / lr_adj)
    return worst


TOL = 1e-4  # fp32 against float64 over 4 steps, in units of lr_adj (measured: < 7e-6)


@pytest.mark.parametrize("peer", list(CONFIGS))
def test_translated_group_takes_the_peers_steps(peer):
    if peer == "nanochat" and not B_KEYS:
        pytest.skip("this meshmuon build lacks muon_eq / muon_plus / decay_lr (issue 31 B); the merge "
                    "enables this test")
    assert run(peer, CONFIGS[peer]) < TOL


# Each changed rule must move the result far outside the tolerance.
CONTROLS = {
    "nanochat": [dict(muon_eq=False), dict(muon_plus=False), dict(decay_adjusted=False)],
    "nanochat_approx": [dict(coefficients=JORDAN), dict(normuon=False), dict(cautious=False),
                        dict(momentum="heavy_ball"), dict(scale=1.02)],
    "motif": [dict(coefficients=JORDAN), dict(momentum="ema"), dict(lr_ratio=TORCH["lr_ratio"])],
    "dion": [dict(nesterov=True), dict(coefficients=YOU), dict(decay_adjusted=True), dict(scale=1.0)],
    "dion_cautious": [dict(cautious=False), dict(decay_adjusted=True)],
    "torch": [dict(nesterov=False), dict(coefficients=YOU), dict(lr_ratio=MOTIF["lr_ratio"]),
              dict(scale=1.01)],
}


@pytest.mark.parametrize("peer,change", [(p, c) for p, cs in CONTROLS.items() for c in cs],
                         ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={v[k]}" for k in v)[:40])
def test_negative_control_a_changed_rule_is_detected(peer, change):
    if peer == "nanochat" and not B_KEYS:
        pytest.skip("this meshmuon build lacks muon_eq / muon_plus / decay_lr (issue 31 B)")
    cfg = copy.copy(CONFIGS[peer])
    cfg.update(change)
    assert run(peer, cfg) > 10 * TOL


# nanochat reads `beta2` without a range check (None as 0.0). Its ends: 0 (v is the last v_mean) and
# 1 (v never leaves its zeros, in nanochat and in meshmuon's engine: the NorMuon scaling is the
# identity up to rounding), both taken as nanochat takes them.
@pytest.mark.parametrize("beta2", [0.0, 0.5, 1.0, None])
def test_nanochat_beta2_range_ends_take_nanochats_steps(beta2):
    if not B_KEYS:
        pytest.skip("this meshmuon build lacks muon_eq / muon_plus / decay_lr (issue 31 B)")
    assert run("nanochat", NANOCHAT, beta2=beta2) < TOL
    # negative control: another beta2 in the reference is detected
    assert run("nanochat", NANOCHAT, beta2=beta2, ref_beta2=0.5 if beta2 != 0.5 else 1.0) > 10 * TOL
