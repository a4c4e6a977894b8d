"""`python -m meshmuon.bench layouts`: a small GPT trained under torchrun at 2 and 4 ranks (FSDP2,
gloo, CPU), one row per optimizer layout: AdamW (torch.optim.AdamW, the baseline), Muon on FSDP2
with the planner's `auto` strategies (meshmuon.torch.Muon), Muon with owner placement of every block
matrix (`muon_owner`: meshmuon.torch.own(select="owner"), the rest with fully_shard) and with the
planner's placement choice (`muon_placement_auto`: own(select="auto")). Per row, the median over the timed steps of the total
train step, forward + backward and the optimizer step, the total's overhead over AdamW's of the
same run, and for Muon rows `predicted_over_measured`: the cost model's predicted optimizer step
(meshmuon::predict_step on the optimizer's plan, the --machine profile, the node's ranks sharing its
cores) over the measured optimizer step. Rounds alternate AdamW and Muon (--rounds) so that a
load change on the machine hits both. This file is also the per-rank worker torchrun runs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

LAYOUTS = ("adamw", "muon_auto", "muon_owner", "muon_placement_auto")


def build_model(layers, d, vocab, seq):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.fc = nn.Linear(d, 4 * d, bias=False)
            self.fc2 = nn.Linear(4 * d, d, bias=False)
            self.heads = max(1, d // 64)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            shape = (b, t, self.heads, d // self.heads)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(nn.functional.gelu(self.fc(self.ln2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            return self.lm_head(self.ln_f(x))

    return Gpt()


def make_layout(layout, args, mesh, owned):
    """The model and optimizer of one meshmuon row (`layout` among LAYOUTS) on `mesh`, every rank
    starting from the same parameters (seed 0); `owned[layout]` gets the owner-placed matrix count."""
    import torch
    from torch.distributed.fsdp import fully_shard

    import meshmuon.torch as mt

    torch.manual_seed(0)
    model = build_model(args.layers, args.d, args.vocab, args.seq)
    ignored = None
    if layout in ("muon_owner", "muon_placement_auto"):
        select = "owner" if layout == "muon_owner" else "auto"
        placement = mt.own(model, mesh, select=select, machine=args.machine)
        ignored = placement.params
        owned[layout] = len(placement.names)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    if layout == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    else:
        groups = mt.param_groups(model, muon=dict(lr=0.02, weight_decay=0.01), adamw=dict(lr=3e-4))
        opt = mt.Muon(groups, lr=0.02, machine=args.machine, ns_matmul_dtype=args.matmul_dtype)
    return model, opt


def make_batches(args, rank):
    """This rank's token batches (its own seed), cycled through by train_steps."""
    import torch

    gen = torch.Generator().manual_seed(1234 + rank)
    return [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen) for _ in range(4)]


def train_steps(model, opt, batches, args, steps, sink):
    """`steps` train steps, each started after a barrier; past --warmup, appends the seconds of
    forward + backward, the optimizer step and their total to sink["fwd_bwd"/"opt"/"total"]."""
    import torch
    import torch.distributed as dist

    loss = None
    for s in range(steps):
        idx = batches[s % len(batches)]
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if s >= args.warmup:
            sink.setdefault("fwd_bwd", []).append(t1 - t0)
            sink.setdefault("opt", []).append(t2 - t1)
            sink.setdefault("total", []).append(t2 - t0)
    return float(loss)


def summarize(samples, owned):
    """One row per layout of `samples` ({layout: sink}): the slowest rank's medians (the job waits
    for it), the predicted optimizer step where the sink has one, and the overhead over "adamw"."""
    import torch
    import torch.distributed as dist

    def slowest(x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    rows = []
    for layout, s in samples.items():
        row = {"layout": layout, "available": True}
        if layout in owned:
            row["owned_matrices"] = owned[layout]
        for key in ("total", "fwd_bwd", "opt"):
            row[f"{key}_seconds"] = slowest(statistics.median(s[key]))
        if "predicted" in s:
            row["predicted_optimizer_seconds"] = s["predicted"]["step_seconds"]
            row["predicted"] = s["predicted"]
            row["predicted_over_measured"] = s["predicted"]["step_seconds"] / row["opt_seconds"]
            row["strategy_counts"] = {k: v for k, v in s["strategies"].items() if v}
        rows.append(row)
    base = next((r["total_seconds"] for r in rows if r["layout"] == "adamw"), None)
    for row in rows:
        if base is not None:
            row["overhead_over_adamw"] = row["total_seconds"] / base - 1
    return rows


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    owned = {}
    batches = make_batches(args, rank)

    def run(layout, steps, sink):
        model, opt = make_layout(layout, args, mesh, owned)
        loss = train_steps(model, opt, batches, args, steps, sink)
        if layout != "adamw":
            sink["predicted"] = opt._engine.core.predict_step(local_size)
            sink["strategies"] = json.loads(opt._engine.core.plan_json()).get("strategy_counts", {})
        return loss

    samples = {layout: {} for layout in args.layouts}
    for _ in range(args.rounds):
        for layout in samples:
            run(layout, args.warmup + args.steps, samples[layout])

    rows = summarize(samples, owned)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world_size": world, "rows": rows}, f)
    dist.destroy_process_group()


def run_workers(script, ranks, worker_args, what):
    """`script --worker --out FILE worker_args` under torchrun with `ranks` ranks (one BLAS thread per
    rank); the JSON rank 0 wrote to FILE. Exits naming `what` when the job fails."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               script, "--worker", "--out", out, *worker_args]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-6000:])
            raise SystemExit(f"{what}: torchrun with {ranks} ranks failed ({proc.returncode})")
        with open(out) as f:
            return json.load(f)


def layouts(args):
    unknown = [x for x in args.layouts if x not in LAYOUTS]
    if unknown:
        raise SystemExit(f"layouts: --layouts {unknown} unknown; choose among {','.join(LAYOUTS)}")
    results = [run_workers(os.path.abspath(__file__), ranks, forwarded(args), "layouts") for ranks in args.ranks]
    report = {"model": {"layers": args.layers, "d": args.d, "vocab": args.vocab, "seq": args.seq,
                        "batch": args.batch},
              "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "machine": args.machine,
              "matmul_dtype": args.matmul_dtype, "runs": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for run in results:
        print(f"{run['world_size']} ranks (FSDP2, gloo):")
        print(f"  {'layout':<20} {'total s':>9} {'fwd+bwd s':>10} {'opt s':>9} {'vs AdamW':>9} {'pred/meas':>10}")
        for r in run["rows"]:
            if not r["available"]:
                print(f"  {r['layout']:<20} not available: {r['reason']}")
                continue
            pm = f"{r['predicted_over_measured']:.2f}" if "predicted_over_measured" in r else "-"
            vs = f"{100 * r['overhead_over_adamw']:+8.1f}%" if "overhead_over_adamw" in r else f"{'-':>9}"
            owned = f"  ({r['owned_matrices']} owned)" if "owned_matrices" in r else ""
            print(f"  {r['layout']:<20} {r['total_seconds']:9.4f} {r['fwd_bwd_seconds']:10.4f} {r['opt_seconds']:9.4f} "
                  f"{vs} {pm:>10}{owned}")
    return 0


def add_arguments(p):
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d", "--width", dest="d", type=int, default=256, help="model width")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per round")
    p.add_argument("--rounds", type=int, default=2, help="alternating AdamW / Muon rounds")
    p.add_argument("--machine", default="cpu", help="cost-model profile: a name or a .json (bench calibrate)")
    p.add_argument("--matmul-dtype", default="fp32", choices=["fp32", "bf16"], help="Newton-Schulz products")
    p.add_argument("--layouts", type=lambda v: v.split(","), default=list(LAYOUTS),
                   help=f"comma-separated rows among {','.join(LAYOUTS)} (AdamW first: the baseline)")


def forwarded(args):
    return ["--layers", str(args.layers), "--width", str(args.d), "--vocab", str(args.vocab), "--seq", str(args.seq),
            "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--rounds", str(args.rounds), "--machine", args.machine, "--matmul-dtype", args.matmul_dtype,
            "--layouts", ",".join(args.layouts)]


if __name__ == "__main__":  # the torchrun worker
    p = argparse.ArgumentParser()
    add_arguments(p)
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--out", required=True)
    worker(p.parse_args())
