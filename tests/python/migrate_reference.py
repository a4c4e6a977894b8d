# The Muon update of each peer that meshmuon.torch.migrate translates, written here in float64 from the
# peers' code (nanochat optim.py muon_step_fused, Motif muon.py base(), Dion muon.py
# muon_update_*, torch.optim.Muon), NOT from meshmuon's mapping: test_migrate_numerics.py checks that
# meshmuon, given the translated groups, takes these steps. One matrix at a time.
import math

import torch

JORDAN = [(3.4445, -4.7750, 2.0315)] * 5
YOU = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
       (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
POLAR_EXPRESS = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
                 (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                 (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                 (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                 (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]

# Per peer: momentum kind, normalization X / (|X|*scale + eps) ("add") or X / max(|X|*scale, eps)
# ("clamp"), coefficients, lr ratio from (rows, cols), which lr the decay uses, extras.
NANOCHAT = dict(momentum="ema", nesterov=True, coefficients=POLAR_EXPRESS, scale=1.01, eps=1e-6,
                eps_mode="add", muon_eq=True, muon_plus=True, normuon=True, cautious=True,
                lr_ratio=lambda a, b: math.sqrt(max(1.0, a / b)), decay_adjusted=True)
MOTIF = dict(momentum="heavy_ball", nesterov=True, coefficients=YOU, scale=1.0, eps=1e-7,
             eps_mode="add", lr_ratio=lambda a, b: 0.2 * math.sqrt(max(a, b)))
DION = dict(momentum="heavy_ball", nesterov=False, coefficients=POLAR_EXPRESS, scale=1.02, eps=1e-8,
            eps_mode="add", lr_ratio=lambda a, b: 0.2 * math.sqrt(max(a, b)))  # adjust_lr rms_norm
TORCH = dict(momentum="ema", nesterov=True, coefficients=JORDAN, scale=1.0, eps=1e-7,
             eps_mode="clamp", lr_ratio=lambda a, b: math.sqrt(max(1.0, a / b)))


class Reference:
    """One matrix parameter stepped by a peer's rule `cfg` (keys above) in float64."""

    def __init__(self, p0: torch.Tensor, cfg: dict):
        self.p, self.cfg = p0.double().clone(), cfg
        self.buf = torch.zeros_like(self.p)
        rows, cols = self.p.shape
        self.red = -1 if rows >= cols else -2  # NorMuon: per row when rows >= cols
        self.v = torch.zeros((rows, 1) if rows >= cols else (1, cols), dtype=torch.float64)

    def step(self, grad, lr, wd, mu, beta2=None):
        cfg, g = self.cfg, grad.double()
        if cfg["momentum"] == "ema":
            self.buf.lerp_(g, 1 - mu)
            u = g.lerp(self.buf, mu) if cfg["nesterov"] else self.buf.clone()
        else:
            self.buf.mul_(mu).add_(g)
            u = g + mu * self.buf if cfg["nesterov"] else self.buf.clone()
        x = u
        if cfg.get("muon_eq"):
            target = x.norm() / math.sqrt(x.shape[0])
            x = x * (target / x.norm(dim=-1, keepdim=True).clamp_min(1e-6))
        norm = x.norm() * cfg["scale"]
        x = x / (norm + cfg["eps"] if cfg["eps_mode"] == "add" else max(norm, cfg["eps"]))
        tall = x.shape[0] > x.shape[1]
        for a, b, c in cfg["coefficients"]:
            gram = x.T @ x if tall else x @ x.T
            poly = b * gram + c * gram @ gram
            x = a * x + (x @ poly if tall else poly @ x)
        if cfg.get("muon_plus"):
            x = x * (math.sqrt(min(x.shape)) / x.norm().clamp_min(1e-6))
        if cfg.get("normuon"):
            v_mean = x.square().mean(dim=self.red, keepdim=True)
            k = x.shape[self.red]
            v_norm = (v_mean.sum() * k).sqrt()
            self.v.lerp_(v_mean, 1 - beta2)
            step = self.v.clamp_min(1e-10).rsqrt()
            v_norm_new = (v_mean * k * step.square()).sum().sqrt()
            x = x * step * (v_norm / v_norm_new.clamp_min(1e-10))
        lr_adj = lr * cfg["lr_ratio"](*self.p.shape)
        decay_lr = lr_adj if cfg.get("decay_adjusted") else lr
        if cfg.get("cautious"):
            mask = (x * self.p) >= 0
            self.p = self.p - lr_adj * x - decay_lr * wd * self.p * mask
        else:
            self.p = self.p * (1 - decay_lr * wd) - lr_adj * x
        return lr_adj
