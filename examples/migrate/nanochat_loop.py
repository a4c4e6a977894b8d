"""Migrating a nanochat-style training script: nanochat's param groups (`kind='adamw'` / `'muon'`,
`betas`, `beta2`, `ns_steps`) and its schedule loop, which reads `group['kind']` and writes `lr`
(from `initial_lr`), `momentum` and `weight_decay`. Only the line that builds the optimizer changes:

    optimizer = MuonAdamW(param_groups)                               # nanochat
    optimizer = meshmuon.torch.Muon(**meshmuon.torch.from_nanochat(param_groups))   # meshmuon

The model, groups and loop below are written in nanochat's shape for this example (a tiny GPT on
CPU). Run: PYTHONPATH=build/python-stage python3 examples/migrate/nanochat_loop.py [--approximate]
--approximate: for a meshmuon build without the group keys muon_eq / muon_plus / decay_lr (nanochat's
MuonEq, Muon+ and weight decay with the adjusted lr); the update then differs from nanochat's."""
import argparse
import math

import torch
import torch.nn.functional as F

import meshmuon.torch as dt

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 64, 32, 4, 2, 16, 8
NUM_ITERATIONS, WARMUP_STEPS, WARMDOWN_RATIO, FINAL_LR_FRAC = 40, 4, 0.4, 0.0
WEIGHT_DECAY = 0.2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c_q, self.c_k, self.c_v, self.c_proj = (torch.nn.Linear(DIM, DIM, bias=False)
                                                     for _ in range(4))
        self.c_fc = torch.nn.Linear(DIM, 4 * DIM, bias=False)
        self.c_mlp = torch.nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (w(F.rms_norm(x, (DIM,))).view(b, t, HEADS, DIM // HEADS).transpose(1, 2)
                   for w in (self.c_q, self.c_k, self.c_v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.c_proj(y)
        return x + self.c_mlp(F.relu(self.c_fc(F.rms_norm(x, (DIM,)))).square())


class TinyGPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, DIM)
        self.h = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.resid_lambdas = torch.nn.Parameter(torch.ones(LAYERS))
        self.x0_lambdas = torch.nn.Parameter(torch.zeros(LAYERS))

    def forward(self, idx, targets):
        x = x0 = F.rms_norm(self.wte(idx), (DIM,))
        for i, block in enumerate(self.h):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            x = block(x)
        logits = self.lm_head(F.rms_norm(x, (DIM,)))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    def setup_optimizer(self, migrate_kwargs):
        """nanochat's shape: AdamW groups for the head, embeddings and scalars, one Muon group per
        matrix shape; then `initial_lr` for the schedule."""
        matrix_params = list(self.h.parameters())
        param_groups = [
            dict(kind="adamw", params=list(self.lm_head.parameters()), lr=0.004, betas=(0.8, 0.96),
                 eps=1e-10, weight_decay=0.01),
            dict(kind="adamw", params=list(self.wte.parameters()), lr=0.2, betas=(0.8, 0.995),
                 eps=1e-10, weight_decay=0.001),
            dict(kind="adamw", params=[self.resid_lambdas], lr=0.005, betas=(0.8, 0.95), eps=1e-10,
                 weight_decay=0.05),
            dict(kind="adamw", params=[self.x0_lambdas], lr=0.5, betas=(0.96, 0.95), eps=1e-10,
                 weight_decay=0.0),
        ]
        for shape in sorted({p.shape for p in matrix_params}):
            param_groups.append(dict(kind="muon", params=[p for p in matrix_params if p.shape == shape],
                                     lr=0.02, momentum=0.95, ns_steps=5, beta2=0.9,
                                     weight_decay=WEIGHT_DECAY))
        optimizer = dt.Muon(**dt.from_nanochat(param_groups, **migrate_kwargs))  # the changed line
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
        return optimizer


# nanochat's schedules (base_train.py's shape): linear warmup / warmdown of the lr, a momentum ramp,
# cosine weight decay.
def get_lr_multiplier(it):
    warmdown_iters = round(WARMDOWN_RATIO * NUM_ITERATIONS)
    if it < WARMUP_STEPS:
        return (it + 1) / WARMUP_STEPS
    if it <= NUM_ITERATIONS - warmdown_iters:
        return 1.0
    progress = (NUM_ITERATIONS - it) / warmdown_iters
    return progress + (1 - progress) * FINAL_LR_FRAC


def get_muon_momentum(it):
    frac = min(it / 20, 1)
    return (1 - frac) * 0.85 + frac * 0.95


def get_weight_decay(it):
    return WEIGHT_DECAY * 0.5 * (1 + math.cos(math.pi * it / NUM_ITERATIONS))


def batch(gen):
    """A learnable stream: each token is a fixed function of the previous one."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    seq = (start * 7 + 3 * torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--approximate", action="store_true")
    args = parser.parse_args()
    migrate_kwargs = (dict(muon_eq=False, muon_plus=False, decay_lr="unadjusted")
                      if args.approximate else {})
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = model.setup_optimizer(migrate_kwargs)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for step in range(NUM_ITERATIONS):  # nanochat's loop, unedited
        x, y = batch(gen)
        loss = model(x, y)
        loss.backward()
        lrm = get_lr_multiplier(step)
        muon_momentum = get_muon_momentum(step)
        muon_weight_decay = get_weight_decay(step)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lrm
            if group['kind'] == 'muon':
                group["momentum"] = muon_momentum
                group["weight_decay"] = muon_weight_decay
        optimizer.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"nanochat_loop: loss {first:.3f} -> {last:.3f} over {NUM_ITERATIONS} steps")
    assert last < 0.5 * first, f"loss did not decrease enough: {first:.3f} -> {last:.3f}"
    kinds = [g["kind"] for g in optimizer.param_groups]
    assert kinds == ["adamw"] * 4 + ["muon"] * (len(kinds) - 4), kinds
    for group in optimizer.param_groups:  # the schedule's last writes are what meshmuon holds
        assert group["lr"] == group["initial_lr"] * get_lr_multiplier(NUM_ITERATIONS - 1)
        if group["kind"] == "muon":
            assert group["momentum"] == get_muon_momentum(NUM_ITERATIONS - 1)
            assert group["normuon_beta2"] == group["beta2"] == 0.9


if __name__ == "__main__":
    main()
