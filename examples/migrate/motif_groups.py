"""Migrating a script written for Motif's Muon: groups built the way Motif's
`get_default_muon_param_groups(model)` builds them (`use_muon`, `names`), an expert stack named by
`expert_keys`, `none_grad`, and a loop that reads `group['use_muon']`. Only the optimizer line changes:

    optim = optimizer.Muon(params, lr=0.02, weight_decay=0.01, expert_keys=["experts"])   # Motif
    optim = meshmuon.torch.Muon(**meshmuon.torch.from_motif(params, lr=0.02, weight_decay=0.01,
                                                      expert_keys=["experts"]))      # meshmuon

Run: PYTHONPATH=build/python-stage python3 examples/migrate/motif_groups.py"""
import math

import torch
import torch.nn.functional as F

import meshmuon.torch as dt

VOCAB, DIM, EXPERTS, STEPS = 48, 32, 4, 30


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            q_proj=torch.nn.Linear(DIM, DIM, bias=False), o_proj=torch.nn.Linear(DIM, DIM, bias=False),
            norm=torch.nn.RMSNorm(DIM))) for _ in range(2))
        self.experts = torch.nn.Parameter(torch.randn(EXPERTS, 2 * DIM, DIM) / math.sqrt(DIM))
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        x = self.embeddings(idx)
        for layer in self.layers:
            x = x + layer["o_proj"](torch.tanh(layer["q_proj"](layer["norm"](x))))
        expert = idx % EXPERTS  # route each token to one expert: [E, 2D, D] stack
        h = torch.einsum("btd,bted->bte", x, self.experts[expert])
        x = x + h[..., :DIM] * torch.sigmoid(h[..., DIM:])
        return self.lm_head(x)


def default_muon_param_groups(model):
    """Motif's shape: matrices (not embeddings / lm_head) with their names on Muon, the rest AdamW."""
    muon, names, other = [], [], []
    for n, p in model.named_parameters():
        if p.ndim >= 2 and not any(k in n for k in ("embeddings", "lm_head")):
            muon.append(p)
            names.append(n)
        else:
            other.append(p)
    return [dict(params=muon, names=names, use_muon=True), dict(params=other, use_muon=False)]


def main():
    torch.manual_seed(0)
    model = TinyModel()
    params = default_muon_param_groups(model)
    optim = dt.Muon(**dt.from_motif(params, lr=0.02, weight_decay=0.01, adamw_betas=(0.9, 0.95),
                                    expert_keys=["experts"]))
    base_lr = {i: g["lr"] * (1 if g["use_muon"] else 0.1) for i, g in enumerate(optim.param_groups)}
    gen = torch.Generator().manual_seed(0)
    losses = []
    for step in range(STEPS):
        idx = torch.randint(0, VOCAB, (8, 12), generator=gen)
        loss = F.cross_entropy(model(idx).reshape(-1, VOCAB), ((idx * 5 + 1) % VOCAB).reshape(-1))
        loss.backward()
        for i, group in enumerate(optim.param_groups):  # the script's own schedule
            group["lr"] = base_lr[i] * min(1.0, (step + 1) / 5)
        optim.step()
        # none_grad (Motif's default): the step freed every gradient it used
        assert all(p.grad is None for p in model.parameters())
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"motif_groups: loss {first:.3f} -> {last:.3f} over {STEPS} steps")
    assert last < 0.5 * first, f"loss did not decrease enough: {first:.3f} -> {last:.3f}"
    muon, adamw = optim.param_groups
    assert muon["use_muon"] and not adamw["use_muon"]
    assert muon["expert_stacks"] and muon["momentum_kind"] == "heavy_ball"
    assert adamw["betas"] == adamw["adamw_betas"] == (0.9, 0.95)
    assert muon["param_names"] == muon["names"] and "experts" in muon["names"]


if __name__ == "__main__":
    main()
