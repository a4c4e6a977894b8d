"""The optimizer step of a nanochat-shaped model (4 layers, d 256, 4 heads, vocab 512, seq 128, batch 8
per rank) with nanochat's param groups: meshmuon.torch.Muon(**from_nanochat(groups), zero=True,
reduce_grads="mean") against a nanochat-style ZeRO-2 MuonAdamW (written here in nanochat's shape:
stacked same-shape matrices reduce-scattered to owners, fp32 Polar Express + NorMuon + cautious decay
on the owner's stack (batched products, as nanochat's muon_step_fused), all-gather; AdamW reduce-scattered by rows, small tensors all-reduced). Same initial
weights, same data, interleaved step by step; under torchrun (gloo):

  OPENBLAS_NUM_THREADS=1 PYTHONPATH=build/python-stage python3 -m torch.distributed.run --standalone \
      --nproc-per-node 2 bench/nanochat_zero.py --steps 10

meshmuon runs twice, on two copies of the model: with its default Newton-Schulz method (symmetric) and
with ns_method="gram" (Gram Newton-Schulz), both fp32 products. Each step's optimizer time is the
slowest rank's (barrier before, max after); medians after
--warmup (--control: the reference's momentum made wrong on purpose, a negative control for the
loss comparison; --compile-reference: the reference's updates under torch.compile, as nanochat's, with
--warmup 5 so that compilation stays out of the medians: the figures of docs/migration.md). Prints one JSON object on rank 0: medians, meshmuon's phases (last_step_stats), the
reference's phases, the losses' largest relative difference, the CPU model. Without the engine keys
muon_eq / muon_plus / decay_lr both sides run nanochat's update without MuonEq, Muon+ and with the
unadjusted decay (reported as "nanochat_features")."""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

torch.set_num_threads(1)

import meshmuon.torch as dt  # noqa: E402
from meshmuon.torch.migrate._common import has_key  # noqa: E402

PE = [(8.156554524902461, -22.48329292557795, 15.878769915207462),
      (4.042929935166739, -2.808917465908714, 0.5000178451051316),
      (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
      (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
      (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]


class GPT(torch.nn.Module):
    def __init__(self, vocab, d, layers, heads):
        super().__init__()
        self.heads, self.d = heads, d
        self.wte = torch.nn.Embedding(vocab, d)
        self.h = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            c_q=torch.nn.Linear(d, d, bias=False), c_k=torch.nn.Linear(d, d, bias=False),
            c_v=torch.nn.Linear(d, d, bias=False), c_proj=torch.nn.Linear(d, d, bias=False),
            c_fc=torch.nn.Linear(d, 4 * d, bias=False), c_mlp=torch.nn.Linear(4 * d, d, bias=False)))
            for _ in range(layers))
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.resid_lambdas = torch.nn.Parameter(torch.ones(layers))
        self.x0_lambdas = torch.nn.Parameter(torch.zeros(layers))

    def forward(self, idx, targets):
        b, t = idx.shape
        x = x0 = F.rms_norm(self.wte(idx), (self.d,))
        for i, blk in enumerate(self.h):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            hn = F.rms_norm(x, (self.d,))
            q, k, v = (blk[n](hn).view(b, t, self.heads, -1).transpose(1, 2)
                       for n in ("c_q", "c_k", "c_v"))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["c_proj"](y.transpose(1, 2).reshape(b, t, self.d))
            x = x + blk["c_mlp"](F.relu(blk["c_fc"](F.rms_norm(x, (self.d,)))).square())
        logits = self.lm_head(F.rms_norm(x, (self.d,)))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    def nanochat_groups(self):
        mats = list(self.h.parameters())
        groups = [dict(kind="adamw", params=[self.lm_head.weight], lr=0.004, betas=(0.8, 0.96),
                       eps=1e-10, weight_decay=0.01),
                  dict(kind="adamw", params=[self.wte.weight], lr=0.2, betas=(0.8, 0.995),
                       eps=1e-10, weight_decay=0.001),
                  dict(kind="adamw", params=[self.resid_lambdas, self.x0_lambdas], lr=0.005,
                       betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0)]
        for shape in sorted({p.shape for p in mats}):
            groups.append(dict(kind="muon", params=[p for p in mats if p.shape == shape], lr=0.02,
                               momentum=0.95, ns_steps=5, beta2=0.9, weight_decay=0.1))
        return groups


class ZeroMuonAdamW(torch.optim.Optimizer):
    """nanochat-style ZeRO-2 MuonAdamW over gloo (SUM then divide: gloo has no AVG)."""

    def __init__(self, groups, features):
        super().__init__(groups, defaults={})
        self.f, self.world, self.rank = features, dist.get_world_size(), dist.get_rank()
        self.phases = {}

    def _muon(self, u, p, st, group):
        mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
        if self.f.get("control"):  # negative control: heavy-ball momentum, not nanochat's
            st["buf"].mul_(mu).add_(u)
        else:
            st["buf"].lerp_(u, 1 - mu)
        x = u.lerp(st["buf"], mu)
        if self.f["muon_eq"]:
            x = x * (x.norm(dim=(-2, -1), keepdim=True) / math.sqrt(x.size(-2))
                     / x.norm(dim=-1, keepdim=True).clamp_min(1e-6))
        x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)
        tall = x.size(-2) > x.size(-1)
        for a, b, c in PE:
            gram = x.mT @ x if tall else x @ x.mT
            poly = b * gram + c * gram @ gram
            x = a * x + (x @ poly if tall else poly @ x)
        if self.f["muon_plus"]:
            x = x * (min(x.shape[-2:]) ** 0.5 / x.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6))
        red = -1 if x.size(-2) >= x.size(-1) else -2
        v_mean = x.square().mean(dim=red, keepdim=True)
        k = x.size(red)
        v_norm = (v_mean.sum(dim=(-2, -1), keepdim=True) * k).sqrt()
        st["v"].lerp_(v_mean, 1 - group["beta2"])
        step = st["v"].clamp_min(1e-10).rsqrt()
        v_new = (v_mean * k * step.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
        x = x * step * (v_norm / v_new.clamp_min(1e-10))
        lr_adj = lr * max(1.0, p.size(-2) / p.size(-1)) ** 0.5
        decay_lr = lr_adj if self.f["decay_adjusted"] else lr
        mask = (x * p) >= 0
        p.sub_(lr_adj * x + decay_lr * wd * p * mask)

    def _adamw(self, p, g, st, group):
        st["t"] = st.get("t", 0) + 1
        b1, b2 = group["betas"]
        p.mul_(1 - group["lr"] * group["weight_decay"])
        st["m"].lerp_(g, 1 - b1)
        st["s"].lerp_(g.square(), 1 - b2)
        denom = (st["s"] / (1 - b2 ** st["t"])).sqrt() + group["eps"]
        p.add_(st["m"] / denom, alpha=-group["lr"] / (1 - b1 ** st["t"]))

    @torch.no_grad()
    def step(self):
        t0 = time.perf_counter()
        W, r, pending = self.world, self.rank, []
        for group in self.param_groups:  # pass 1: launch every reduction
            ps = group["params"]
            if group["kind"] == "muon":
                chunk = -(-len(ps) // W)
                stacked = torch.zeros(chunk * W, *ps[0].shape)
                stacked[:len(ps)] = torch.stack([p.grad for p in ps])
                out = torch.empty(chunk, *ps[0].shape)
                pending.append((dist.reduce_scatter_tensor(out, stacked, async_op=True), out, chunk))
            else:
                works = []
                for p in ps:
                    if p.numel() < 1024:
                        g = p.grad.clone()
                        works.append((dist.all_reduce(g, async_op=True), g, None))
                    else:
                        g = torch.empty(p.size(0) // W, *p.shape[1:])
                        works.append((dist.reduce_scatter_tensor(g, p.grad.contiguous(),
                                                                 async_op=True), g, True))
                pending.append(works)
        t1 = time.perf_counter()
        gathers = []
        for group, info in zip(self.param_groups, pending):  # pass 2: wait, update, launch gathers
            ps = group["params"]
            if group["kind"] == "muon":
                work, grads, chunk = info
                work.wait()
                grads.div_(W)
                owned = range(r * chunk, min(len(ps), (r + 1) * chunk))
                upd = torch.zeros(chunk, *ps[0].shape)
                if len(owned):  # nanochat's shape: the owned matrices as one stack [k, m, n]
                    st = self.state[ps[owned[0]]]  # the stack's state, kept on its first matrix
                    m, n = ps[0].shape
                    if not st:
                        st.update(buf=torch.zeros(len(owned), m, n),
                                  v=torch.zeros(len(owned), *((m, 1) if m >= n else (1, n))))
                    q = torch.stack([ps[i].detach() for i in owned])
                    self._muon(grads[:len(owned)], q, st, group)
                    upd[:len(owned)] = q
                full = torch.empty(chunk * W, *ps[0].shape)
                gathers.append((dist.all_gather_into_tensor(full, upd, async_op=True), full, ps))
            else:
                for p, (work, g, sharded) in zip(ps, info):
                    work.wait()
                    g.div_(W)
                    rows = p.size(0) // W
                    target = p.data[r * rows:(r + 1) * rows] if sharded else p.data
                    st = self.state[p]
                    if not st:
                        st.update(m=torch.zeros_like(target), s=torch.zeros_like(target))
                    self._adamw(target, g, st, group)
                    if sharded:
                        gathers.append((dist.all_gather_into_tensor(p.data, target.clone(),
                                                                    async_op=True), None, None))
        t2 = time.perf_counter()
        for work, full, ps in gathers:  # pass 3: wait for the gathers, copy the matrices back
            work.wait()
            if full is not None:
                for i, p in enumerate(ps):
                    p.data.copy_(full[i])
        t3 = time.perf_counter()
        self.phases = dict(launch_reduce_seconds=t1 - t0, wait_compute_seconds=t2 - t1,
                           gather_seconds=t3 - t2)


def timed(fn):
    dist.barrier()
    t = time.perf_counter()
    fn()
    dt_ = torch.tensor([time.perf_counter() - t])
    dist.all_reduce(dt_, op=dist.ReduceOp.MAX)
    return dt_.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile-reference", action="store_true",
                    help="torch.compile the reference's Muon and AdamW updates, as nanochat compiles its "
                         "muon_step_fused / adamw_step_fused (inductor on the CPU: a C++ compiler, minutes)")
    ap.add_argument("--control", action="store_true",
                    help="negative control: the reference uses heavy-ball momentum (losses differ)")
    args = ap.parse_args()
    rank, world = dt.init_distributed()
    features = dict(muon_eq=has_key("muon_eq"), muon_plus=has_key("muon_plus"),
                    decay_adjusted=has_key("decay_lr"))
    torch.manual_seed(0)
    base = GPT(512, 256, 4, 4)
    # meshmuon twice: its default method (symmetric: SYRK products) and Gram Newton-Schulz (fewer
    # flops on the 4:1 MLP matrices, symmetric on the square ones), both fp32 products
    models = {"meshmuon": base, "meshmuon_gram": copy.deepcopy(base), "nanochat_zero2": copy.deepcopy(base)}
    flags = dict(muon_eq=features["muon_eq"], muon_plus=features["muon_plus"],
                 decay_lr="adjusted" if features["decay_adjusted"] else "unadjusted")
    opts = {}
    for name, method in (("meshmuon", None), ("meshmuon_gram", "gram")):
        kwargs = dt.from_nanochat(models[name].nanochat_groups(), **flags)
        if method is not None:
            for group in kwargs["params"]:
                if group.get("algorithm", "muon") == "muon":
                    group["ns_method"] = method
        opts[name] = dt.Muon(**kwargs, zero=True, reduce_grads="mean", ns_matmul_dtype="fp32")
    opts["nanochat_zero2"] = ZeroMuonAdamW(models["nanochat_zero2"].nanochat_groups(),
                                           dict(features, control=args.control))
    if args.compile_reference:
        ref = opts["nanochat_zero2"]
        ref._muon = torch.compile(ref._muon, dynamic=False)
        ref._adamw = torch.compile(ref._adamw, dynamic=False)
    gen = torch.Generator().manual_seed(100 + rank)
    times = {k: [] for k in opts}
    losses = {k: [] for k in opts}
    phases = {}
    for it in range(args.warmup + args.steps):
        idx = torch.randint(0, 512, (8, 129), generator=gen)
        for name, model in models.items():
            loss = model(idx[:, :-1], idx[:, 1:])
            loss.backward()
            seconds = timed(opts[name].step)
            model.zero_grad(set_to_none=True)
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses[name].append(mean.item() / world)
            if it >= args.warmup:
                times[name].append(seconds)
        phases = dict(meshmuon=opts["meshmuon"].last_step_stats, meshmuon_gram=opts["meshmuon_gram"].last_step_stats,
                      nanochat_zero2=opts["nanochat_zero2"].phases)
    def pdiff(name):
        return max((a - b).abs().max().item() for a, b in
                   zip(models[name].parameters(), models["nanochat_zero2"].parameters()))
    pdiffs = {name: pdiff(name) for name in ("meshmuon", "meshmuon_gram")}
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        def rel(name):
            return max(abs(a - b) / abs(b) for a, b in zip(losses[name], losses["nanochat_zero2"]))
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name")), "unknown")
        keep = ("step_seconds", "orthogonalize_seconds", "update_seconds", "comm_wait_seconds",
                "comm_seconds", "agree_seconds", "python_step_seconds", "collect_grads_seconds",
                "engine_call_seconds", "write_back_seconds", "reduce_seconds", "unshard_seconds",
                "bytes_sent", "bytes_recv", "engine")
        print(json.dumps(dict(
            world=world, steps=args.steps, cpu_model=cpu, nanochat_features=features,
            reference_compiled=args.compile_reference,
            meshmuon_step_median_s=med["meshmuon"], meshmuon_gram_step_median_s=med["meshmuon_gram"],
            nanochat_zero2_step_median_s=med["nanochat_zero2"],
            speedup=med["nanochat_zero2"] / med["meshmuon"],
            speedup_gram=med["nanochat_zero2"] / med["meshmuon_gram"],
            meshmuon_phases_last_step={k: phases["meshmuon"].get(k) for k in keep},
            meshmuon_gram_phases_last_step={k: phases["meshmuon_gram"].get(k) for k in keep},
            nanochat_zero2_phases_last_step=phases["nanochat_zero2"],
            loss_first=losses["meshmuon"][0], loss_last=losses["meshmuon"][-1],
            loss_max_rel_diff=rel("meshmuon"), loss_max_rel_diff_gram=rel("meshmuon_gram"),
            param_max_abs_diff=pdiffs["meshmuon"], param_max_abs_diff_gram=pdiffs["meshmuon_gram"]), indent=1))


if __name__ == "__main__":
    main()
