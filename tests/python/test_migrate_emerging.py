# from_emerging_optimizers: Emerging-Optimizers' Muon arguments → meshmuon.torch.Muon. The translated
# optimizer follows a float64 reference of its step written from its source (decoupled decay, EMA
# momentum, F.normalize, the named table with its iteration rule, the scale factor), and what has no
# meshmuon rule is refused by name.
import math

import pytest
import torch

import meshmuon.torch as dt

TABLES = {  # Emerging-Optimizers' muon_utils._COEFFICIENT_SETS and its iteration rules
    "simple": ([(3.4445, -4.7750, 2.0315)], "cycle"),
    "quintic": ([(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                 (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)], "cycle"),
    "polar_express": ([(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
                       (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                       (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)], "repeat_last"),
    "cans": ([(8.4703, -25.1081, 18.6293), (4.1828, -3.1087, 0.5806), (3.9619, -2.9541, 0.5630),
              (3.2866, -2.4647, 0.5074), (2.2737, -1.6447, 0.4162)], "repeat_last"),
    "deepseekv4": ([(3.4445, -4.7750, 2.0315)] * 8 + [(2.0, -1.5, 0.5)] * 2, "repeat_last"),
}


def reference_step(p, buf, g, lr, momentum, wd, nesterov, name, steps, scale_mode, extra):
    """One step of Emerging-Optimizers' Muon in float64 (its order: decay, momentum, NS, update)."""
    p = p - wd * lr * p
    buf = buf + (g - buf) * (1 - momentum)
    u = g + (buf - g) * momentum if nesterov else buf
    table, rule = TABLES[name]
    x = u.T if u.shape[0] > u.shape[1] else u
    x = x / max(x.norm().item(), 1e-7)
    for t in range(steps):
        a, b, c = table[t] if t < len(table) else (table[t % len(table)] if rule == "cycle" else table[-1])
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    x = x.T if u.shape[0] > u.shape[1] else x
    m, n = u.shape
    scale = math.sqrt(max(m, n)) if scale_mode == "spectral" else math.sqrt(max(1, m / n))
    return p - lr * scale * extra * x, buf


@pytest.mark.parametrize("name,steps,scale_mode,extra,nesterov", [
    ("quintic", 5, "spectral", 1.0, False), ("quintic", 7, "spectral", 0.2, True),
    ("simple", 5, "shape_scaling", 1.0, False), ("polar_express", 9, "spectral", 0.3, False),
    ("cans", 5, "shape_scaling", 2.0, True), ("deepseekv4", 10, "spectral", 1.0, False)])
def test_translated_muon_follows_its_step(name, steps, scale_mode, extra, nesterov):
    torch.manual_seed(5)
    shape, lr, momentum, wd = (24, 40), 0.01, 0.9, 0.05
    p0 = torch.randn(shape)
    w = torch.nn.Parameter(p0.clone())
    opt = dt.Muon(**dt.from_emerging_optimizers([w], lr=lr, momentum=momentum, weight_decay=wd, nesterov=nesterov,
                                                coefficient_type=name, num_ns_steps=steps, scale_mode=scale_mode,
                                                extra_scale_factor=extra, fp32_matmul_prec="highest"))
    ref, buf = p0.double(), torch.zeros(shape, dtype=torch.float64)
    for s in range(3):
        g = torch.randn(shape, generator=torch.Generator().manual_seed(s))
        w.grad = g.clone()
        opt.step()
        ref, buf = reference_step(ref, buf, g.double(), lr, momentum, wd, nesterov, name, steps, scale_mode, extra)
    err = (w.detach().double() - ref).abs().max().item()
    assert err < 2e-5, err
    # a check that can fail: another table is far from the reference
    if name != "simple":
        other, buf = p0.double(), torch.zeros(shape, dtype=torch.float64)
        for s in range(3):
            g = torch.randn(shape, generator=torch.Generator().manual_seed(s))
            other, buf = reference_step(other, buf, g.double(), lr, momentum, wd, nesterov, "simple", steps,
                                        scale_mode, extra)
        assert (w.detach().double() - other).abs().max().item() > 100 * err


@pytest.mark.parametrize("kw,needle", [
    (dict(weight_decay_method="l2"), "weight_decay_method='l2' has no meshmuon rule"),
    (dict(scale_mode="unit_rms_norm"), "scale_mode='unit_rms_norm' has no meshmuon LR rule"),
    (dict(extra_scale_factor=0), "extra_scale_factor=0"),
    (dict(coefficient_type="quartic"), "coefficient_type='quartic' is not one of"),
    (dict(coefficient_type="cubic5", num_ns_steps=6), "fixed 5-step schedule"),
    (dict(weight_update_hook=object()), "weight_update_hook is not translated"),
    (dict(fp32_matmul_prec="low"), "fp32_matmul_prec='low'"),
])
def test_what_has_no_rule_is_refused_by_name(kw, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        dt.from_emerging_optimizers([torch.nn.Parameter(torch.randn(4, 6))], **kw)


def test_non_matrix_parameters_are_refused():
    with pytest.raises(ValueError, match="takes 2-D parameters only"):
        dt.from_emerging_optimizers([torch.nn.Parameter(torch.randn(6))])
