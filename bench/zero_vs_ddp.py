"""DDP + per-rank torch.optim.Muon / torch.optim.AdamW vs meshmuon ZeRO (zero=True, reduce_grads="mean",
no DDP) on the same small GPT-like model, the same initial weights and the same data, in one launch:

  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe --bind-to none \
      -x OPENBLAS_NUM_THREADS=1 -x PYTHONPATH python bench/zero_vs_ddp.py --steps 20

The two configurations run interleaved, step by step (so both see the same load on a shared
machine). Per configuration: the whole training step (forward, backward, gradient reduction, optimizer step,
parameter all-gather for ZeRO) timed on every rank after a barrier, the slowest rank per step, the
median over the steps after --warmup; bytes per rank and step (DDP: a ring all-reduce of the fp32
gradients, 2(N-1)/N of them, computed, gloo does not count; meshmuon: the reduction's and the optimizer
step's bytes as measured by its communicators, the unshard's (N-1)/N of the fp32 parameters computed);
optimizer state bytes per rank; the global mean loss per step and the largest relative difference
between the two runs. Prints one JSON object on rank 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.fc_out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def batch(step, rank, args):
    g = torch.Generator().manual_seed(1000 * step + rank)
    # a learnable stream: token t+1 = (a * token t + b) mod vocab with per-sequence a, b, plus noise
    a = torch.randint(1, 7, (args.batch, 1), generator=g)
    b = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    x0 = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    toks = [x0]
    for _ in range(args.seq):
        toks.append((a * toks[-1] + b) % args.vocab)
    seq = torch.cat(toks, dim=1)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def state_bytes(opts, masters=False):
    """This rank's optimizer state bytes (local shards), without the fp32 masters; with
    masters=True, only the masters (meshmuon's "master" key)."""
    total = 0
    for opt in opts:
        for st in opt.state.values():
            for key, v in st.items():
                if isinstance(v, torch.Tensor) and key != "step" and (key == "master") == masters:
                    local = v._local_tensor if type(v).__name__ == "DTensor" else v
                    total += local.numel() * local.element_size()
    return total


class Setup:
    """One configuration: "ddp" (DDP + per-rank torch.optim.Muon for the Muon matrices and
    torch.optim.AdamW for the rest) or "zero" (meshmuon.torch.Muon(zero=True, reduce_grads="mean"),
    no DDP), on its own copy of the initial weights."""

    def __init__(self, kind, init, args, rank, world):
        self.kind, self.args, self.rank, self.world = kind, args, rank, world
        model = GPT(args.vocab, args.d, args.layers, args.heads, args.seq)
        model.load_state_dict(init)
        kinds = dt.classify(model)
        named = dict(model.named_parameters())
        muon = [named[n] for n, k in kinds.items() if k == "muon"]
        other = [named[n] for n, k in kinds.items() if k != "muon"]
        self.p_elems = sum(p.numel() for p in model.parameters())
        if kind == "ddp":
            self.net = DDP(model)
            self.opts = [torch.optim.Muon(muon, lr=args.lr, weight_decay=0.1),
                         torch.optim.AdamW(other, lr=args.adamw_lr, betas=(0.9, 0.95), weight_decay=0.01)]
        else:
            self.net = model
            self.opts = [dt.Muon(dt.param_groups(model, adamw=dict(lr=args.adamw_lr, betas=(0.9, 0.95))),
                                 lr=args.lr, weight_decay=0.1, zero=True, reduce_grads="mean")]
        self.times, self.opt_times, self.losses, self.bytes_step = [], [], [], []

    def step(self, step):
        x, y = batch(step, self.rank, self.args)
        dist.barrier()
        t0 = time.perf_counter()
        loss = self.net(x, y)
        loss.backward()
        t1 = time.perf_counter()
        for opt in self.opts:
            opt.step()
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        dt_s = torch.tensor([t2 - t0, t2 - t1])
        dist.all_reduce(dt_s, op=dist.ReduceOp.MAX)  # the slowest rank
        self.times.append(dt_s[0].item())
        self.opt_times.append(dt_s[1].item())
        total = loss.detach().clone()
        dist.all_reduce(total)
        self.losses.append(total.item() / self.world)
        if self.kind == "zero":
            s = self.opts[0].last_step_stats
            self.bytes_step.append(s["reduce_bytes_sent"] + s["bytes_sent"])

    def result(self):
        args, world, p_elems = self.args, self.world, self.p_elems
        measured = self.times[args.warmup:]
        # optimizer_seconds: opt.step() + zero_grad (DDP's all-reduce runs inside backward; ZeRO's
        # reduction and all-gather inside opt.step)
        out = dict(step_seconds_median=statistics.median(measured), step_seconds_min=min(measured),
                   optimizer_seconds_median=statistics.median(self.opt_times[args.warmup:]),
                   steps_timed=len(measured), losses=self.losses,
                   optimizer_state_bytes_per_rank=state_bytes(self.opts),
                   master_bytes_per_rank=state_bytes(self.opts, masters=True))
        if self.kind == "ddp":
            out["bytes_sent_per_step"] = int(2 * (world - 1) / world * 4 * p_elems)
            out["bytes_note"] = "ring all-reduce of fp32 gradients, computed (gloo does not count)"
        else:
            unshard = int((world - 1) / world * 4 * p_elems)
            out["bytes_sent_per_step"] = int(statistics.median(self.bytes_step)) + unshard
            out["bytes_measured_reduce_and_step"] = int(statistics.median(self.bytes_step))
            out["bytes_unshard_computed"] = unshard
        out["params"] = p_elems
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--adamw-lr", type=float, default=3e-3)
    args = ap.parse_args()
    rank, world = dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29513")))
    meshmuon.blas_set_num_threads(1)
    torch.manual_seed(0)
    init = GPT(args.vocab, args.d, args.layers, args.heads, args.seq).state_dict()
    results = {"world": world, "config": vars(args)}
    setups = {kind: Setup(kind, init, args, rank, world) for kind in ("ddp", "zero")}
    for step in range(args.steps):  # interleaved step by step: both see the same machine load
        for setup in setups.values():
            setup.step(step)
    for kind, setup in setups.items():
        results[kind] = setup.result()
    a, b = results["ddp"]["losses"], results["zero"]["losses"]
    results["loss_max_rel_diff"] = max(abs(u - v) / abs(u) for u, v in zip(a, b))
    results["speedup_zero_over_ddp"] = results["ddp"]["step_seconds_median"] / results["zero"]["step_seconds_median"]
    if rank == 0:
        print(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
