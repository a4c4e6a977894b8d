"""Migrating a script written for Dion's Muon (microsoft/dion): groups with `algorithm` "muon" /
"adamw", and a loop that warms up the momentum by writing Dion's key `group['mu']` and the lr from
`initial_lr`. Only the optimizer line changes:

    opt = dion.Muon(param_groups, lr=0.02, mu=0.95, nesterov=True, adjust_lr="rms_norm")      # Dion
    opt = meshmuon.torch.Muon(**meshmuon.torch.from_dion(param_groups, lr=0.02, mu=0.95, nesterov=True,
                                                   adjust_lr="rms_norm"))                    # meshmuon

(Dion's default adjust_lr="spectral_norm", lr·sqrt(A/B), is refused for wide matrices: meshmuon's rule
clamps at lr; see docs/migration.md.) Run: PYTHONPATH=build/python-stage python3
examples/migrate/dion_groups.py"""
import torch
import torch.nn.functional as F

import meshmuon.torch as dt

DIM, CLASSES, STEPS = 32, 10, 30


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
    matrices = [model[0].weight, model[2].weight]
    rest = [model[0].bias, model[2].bias, model[4].weight, model[4].bias]
    param_groups = [dict(params=matrices),  # Dion's default algorithm: "muon"
                    dict(params=rest, algorithm="adamw", lr=0.003, beta1=0.9, beta2=0.99,
                         weight_decay=0.0)]
    opt = dt.Muon(**dt.from_dion(param_groups, lr=0.02, mu=0.95, nesterov=True,
                                 adjust_lr="rms_norm", weight_decay=0.01))
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, DIM, generator=gen)
    y = (x @ torch.randn(DIM, CLASSES, generator=gen)).argmax(dim=1)
    losses = []
    for step in range(STEPS):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        for group in opt.param_groups:  # the script's schedule, in Dion's keys
            group["lr"] = group["initial_lr"] * min(1.0, (step + 1) / 5)
            if group["algorithm"] == "muon":
                group["mu"] = 0.85 + 0.1 * min(1.0, step / 10)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"dion_groups: loss {first:.3f} -> {last:.3f} over {STEPS} steps")
    assert last < 0.5 * first, f"loss did not decrease enough: {first:.3f} -> {last:.3f}"
    muon, adamw = opt.param_groups
    # Dion's keys are live aliases: meshmuon ran with the values the loop wrote
    assert muon["momentum"] == muon["mu"] == 0.95 and muon["momentum_kind"] == "heavy_ball"
    assert muon["adjust_lr_fn"] == "match_rms_adamw" and muon["eps"] == muon["epsilon"] == 1e-8
    assert adamw["betas"] == (adamw["beta1"], adamw["beta2"]) == (0.9, 0.99)


if __name__ == "__main__":
    main()
