"""Train a small character-level GPT with FSDP2 over CPU ranks, once per optimizer: meshmuon (Muon +
AdamW groups), torch.optim.AdamW, and the reference torch.optim.Muon + AdamW (one process,
unsharded), same model, data order, seed and steps; print progress and a comparison table, write
demo-out/summary.json and demo-out/loss.png.

    python examples/train_gpt/train.py                    # relaunches itself: mpirun -np 4 ...
    mpirun -np 2 --oversubscribe python examples/train_gpt/train.py --ranks 2 --optimizers adamw
    python examples/train_gpt/train.py --help
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import launch  # noqa: E402
import optimizers  # noqa: E402
import report  # noqa: E402
from data import DEFAULT_TEXT, CharData  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

# name: (n_layer, n_head, d_model, seq_len, global batch)
PRESETS = {
    "tiny": (2, 2, 64, 64, 8),        # CI: seconds per run
    "small": (4, 4, 256, 128, 16),    # ~3.2M parameters
    "10m": (6, 6, 384, 128, 16),      # ~10.7M parameters (nanoGPT's shakespeare-char shape): the default
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run = p.add_argument_group("run")
    run.add_argument("--optimizers", default="meshmuon,adamw,torch_muon",
                     help="comma-separated runs, in order: meshmuon, adamw (the baseline), torch_muon "
                          "(the reference: torch.optim.Muon + AdamW, unsharded, in one process: "
                          "rank 0 while the other ranks wait)")
    run.add_argument("--steps", type=int, default=120, help="optimizer steps per run")
    run.add_argument("--ranks", type=int, default=4, help="FSDP2 ranks (processes, gloo on CPU)")
    run.add_argument("--torch-muon-threads", type=int, default=0,
                     help="threads of the one-process torch_muon run (0 = one rank's share, "
                          "cores // ranks, at least 1: as many as each rank of the sharded runs; "
                          "more threads than idle cores make OpenMP spin)")
    run.add_argument("--torch-muon-ns", choices=("auto", "bf16", "fp32"), default="auto",
                     help="torch_muon's Newton-Schulz precision: bf16 (torch.optim.Muon's own), "
                          "fp32 (the same iteration in fp32), or auto: bf16 unless torch's bf16 "
                          "matmul is over 3x slower than fp32 on this CPU (no AVX-512: ~100x)")
    run.add_argument("--seed", type=int, default=1234, help="model init and data order")
    run.add_argument("--log-every", type=int, default=10, help="progress line every N steps")
    run.add_argument("--out", default="demo-out", help="folder for summary.json and loss.png")
    run.add_argument("--launcher", choices=launch.LAUNCHERS, default="torchrun",
                     help="how a plain `python train.py` relaunches itself: torchrun (meshmuon on torch's "
                          "process group, c10d) or mpirun (meshmuon's MPI communicator)")
    run.add_argument("--no-launch", action="store_true",
                     help="do not relaunch under mpirun (one process, or already launched)")
    model = p.add_argument_group("model (a preset, then the fields given override it)")
    model.add_argument("--preset", choices=sorted(PRESETS), default="10m",
                       help="model size; small keeps both runs under 10 minutes on 2 cores")
    model.add_argument("--n-layer", type=int, help="transformer blocks")
    model.add_argument("--n-head", type=int, help="attention heads")
    model.add_argument("--d-model", type=int, help="width")
    model.add_argument("--seq-len", type=int, help="characters per sequence")
    model.add_argument("--batch-size", type=int, help="global batch (sequences per step, all ranks)")
    model.add_argument("--moe-experts", type=int, default=0,
                       help="E > 0: the middle block's MLP becomes E top-1 experts (3-D params)")
    model.add_argument("--tie-embeddings", action="store_true", help="LM head shares the embedding")
    opt = p.add_argument_group("optimization")
    opt.add_argument("--muon-lr", type=float, default=0.02, help="meshmuon: lr of Muon matrices")
    opt.add_argument("--adamw-lr", type=float, default=5e-4,
                     help="lr of the AdamW baseline (the best of examples/train_gpt/sweep_adamw.py "
                          "on the 10m preset at 120 steps)")
    opt.add_argument("--muon-adamw-lr", type=float, default=2e-3,
                     help="lr of the AdamW group of meshmuon and torch_muon (embeddings, LM head, "
                          "norms, router)")
    opt.add_argument("--weight-decay", type=float, default=0.0, help="decoupled weight decay")
    opt.add_argument("--lr-schedule", choices=("constant", "cosine", "wsd"), default="wsd",
                     help="lr multiplier over steps: constant, cosine to 10%%, or "
                          "warmup-stable-decay (linear decay over the last 30%%)")
    opt.add_argument("--warmup-steps", type=int, default=-1,
                     help="linear warmup steps (-1: 10%% of --steps)")
    opt.add_argument("--schedule", default="polar_express",
                     choices=("jordan", "you", "polar_express"),
                     help="meshmuon: Newton-Schulz coefficient schedule")
    opt.add_argument("--ns-matmul-dtype", default="auto", choices=("auto", "fp32", "bf16"),
                     help="meshmuon: Newton-Schulz products from fp32 or bf16 operands (fp32 "
                          "accumulation), or auto: bf16 where this CPU multiplies bf16 natively, "
                          "fp32 elsewhere")
    opt.add_argument("--strategy", default="auto",
                     help="meshmuon: distribution strategy for every matrix (auto = cost model; "
                          "local, owner_a2a, allgather, agrs, gram_allreduce, ...; sets "
                          "MESHMUON_STRATEGY)")
    opt.add_argument("--qk-clip", type=float, default=100.0,
                     help="meshmuon: QK-clip threshold tau on the per-head max logits, as Kimi K2 "
                          "(0 = off)")
    args = p.parse_args(argv)
    n_layer, n_head, d_model, seq_len, batch = PRESETS[args.preset]
    for key, value in (("n_layer", n_layer), ("n_head", n_head), ("d_model", d_model),
                       ("seq_len", seq_len), ("batch_size", batch)):
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    bad = [o for o in args.optimizers if o not in ("meshmuon", "adamw", "torch_muon")]
    if bad or not args.optimizers:
        p.error(f"--optimizers: unknown {bad}; use meshmuon, adamw, torch_muon or a list of them")
    if "torch_muon" in args.optimizers and args.moe_experts:
        p.error("--optimizers torch_muon: torch.optim.Muon takes 2-D parameters only; drop it or "
                "--moe-experts")
    if args.steps < 1 or args.ranks < 1 or args.log_every < 1:
        p.error("--steps, --ranks and --log-every must be positive")
    if args.batch_size % args.ranks:
        p.error(f"--batch-size {args.batch_size} must be a multiple of --ranks {args.ranks}")
    if args.warmup_steps < 0:
        args.warmup_steps = max(1, args.steps // 10)
    return args


def lr_scale(args, step: int) -> float:
    if step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    if args.lr_schedule == "constant":
        return 1.0
    progress = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
    if args.lr_schedule == "cosine":
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
    decay_start = 0.7  # wsd: stable, then linear to 0 over the last 30%
    return 1.0 if progress < decay_start else max(0.0, (1.0 - progress) / (1.0 - decay_start))


def build_model(args, vocab_size: int, mesh):
    """The GPT with the seed's initial weights, sharded by FSDP2 over `mesh` (None: unsharded)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(args.seed)  # the same initial weights on every rank and for every optimizer
    cfg = GPTConfig(vocab_size=vocab_size, seq_len=args.seq_len, n_layer=args.n_layer,
                    n_head=args.n_head, d_model=args.d_model, tie_embeddings=args.tie_embeddings,
                    moe_experts=args.moe_experts)
    model = GPT(cfg)
    params = model.num_params()
    if mesh is None:
        return model, params
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, params


def global_max_logits(local: dict, solo: bool = False) -> dict:
    stacked = torch.stack([local[i] for i in sorted(local)])
    if not solo:
        dist.all_reduce(stacked, op=dist.ReduceOp.MAX)
    return {i: stacked[i] for i in sorted(local)}


@torch.no_grad()
def evaluate(model, data: CharData, args, rank: int, world: int, batches: int = 4,
             solo: bool = False) -> float:
    total = torch.zeros(1)
    for b in range(batches):
        x, y = data.batch("val", b, args.batch_size, args.seq_len, args.seed, rank, world)
        total += model(x, y)[1]
    if not solo:
        dist.all_reduce(total)
    return total.item() / (batches * world)


def train_one(name: str, args, data: CharData, mesh, rank: int, world: int) -> Optional[dict]:
    """One run. meshmuon and adamw: every rank trains its share of the FSDP2 model. torch_muon (solo):
    rank 0 trains the unsharded model on the whole global batch (--torch-muon-threads threads)
    while the other ranks wait at a barrier (they return None)."""
    solo = name == "torch_muon"
    if solo:
        # the other ranks wait on a group of their own whose timeout outlasts a long run (the
        # default group's is 30 minutes; a loaded machine can take longer)
        import datetime
        wait_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=24))
        if rank != 0:
            dist.barrier(group=wait_group)  # until rank 0 has finished the run
            return None
        threads = torch.get_num_threads()
        torch.set_num_threads(args.torch_muon_threads or max(1, (os.cpu_count() or 1) // world))
        try:
            args.torch_muon_ns_resolved = optimizers.torch_muon_ns(args)
            if args.torch_muon_ns_resolved == "fp32" and args.torch_muon_ns == "auto":
                print(f"[demo] torch_muon: Newton-Schulz in fp32, not torch's bf16: torch's bf16 "
                      f"matmul takes {args.torch_bf16_slowdown:.0f}x the time of its fp32 matmul on "
                      f"this CPU (no bf16 in hardware); --torch-muon-ns bf16 runs it anyway",
                      flush=True)
            run = _train(name, args, data, None, 0, 1, solo=True)
            run.update(ranks=1, threads=torch.get_num_threads(), ns_precision=args.torch_muon_ns_resolved)
            return run
        finally:
            torch.set_num_threads(threads)
            dist.barrier(group=wait_group)
    run = _train(name, args, data, mesh, rank, world)
    run.update(ranks=world, threads=torch.get_num_threads())
    return run


def _train(name: str, args, data: CharData, mesh, rank: int, world: int,
           solo: bool = False) -> dict:
    model, params = build_model(args, data.vocab_size, mesh)
    opt = optimizers.build(name, model, args)
    wants_logits = name == "meshmuon" and args.qk_clip > 0
    tokens_per_step = args.batch_size * args.seq_len
    hist = dict(step=[], loss=[], seconds=[])
    window = dict(comm=0.0, compute=0.0, steps=0, start=time.perf_counter())
    totals = dict(comm=0.0, compute=0.0)
    step_ms = []
    if not solo:
        dist.barrier()
    start = time.perf_counter()
    for step in range(args.steps):
        optimizers.set_lr_scale(opt, lr_scale(args, step))
        x, y = data.batch("train", step, args.batch_size, args.seq_len, args.seed, rank, world)
        _, loss, local_logits = model(x, y)
        loss.backward()
        max_logits = global_max_logits(local_logits, solo)
        comm_ms, compute_ms = optimizers.timed_step(opt, max_logits if wants_logits else None)
        step_ms.append(comm_ms + compute_ms)
        opt.zero_grad(set_to_none=True)
        mean_loss = loss.detach().clone()
        if not solo:
            dist.all_reduce(mean_loss)
        mean_loss = mean_loss.item() / world
        if not math.isfinite(mean_loss):
            raise FloatingPointError(f"[demo] {name}: loss is {mean_loss} at step {step}; lower "
                                     f"the learning rate")
        now = time.perf_counter() - start
        hist["step"].append(step + 1), hist["loss"].append(mean_loss), hist["seconds"].append(now)
        for key, value in (("comm", comm_ms), ("compute", compute_ms)):
            window[key] += value
            totals[key] += value
        window["steps"] += 1
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            span = time.perf_counter() - window["start"]
            n = window["steps"]
            print(f"[{name}] step {step + 1:>4}/{args.steps} | loss {mean_loss:.4f} | "
                  f"{n * tokens_per_step / span:>6.0f} tok/s | opt step "
                  f"{(window['comm'] + window['compute']) / n:6.1f} ms (comm "
                  f"{window['comm'] / n:.1f} + compute {window['compute'] / n:.1f}) | max logit "
                  f"{max(float(v.max()) for v in max_logits.values()):5.2f} | {now:6.1f} s",
                  flush=True)
            window.update(comm=0.0, compute=0.0, steps=0, start=time.perf_counter())
    wall = time.perf_counter() - start
    val_loss = evaluate(model, data, args, rank, world, solo=solo)
    last = hist["loss"][-min(10, len(hist["loss"])):]
    extra = dict(ns_precision=optimizers.ns_precision(opt)) if name == "meshmuon" else {}
    return dict(
        **extra,
        final_loss=sum(last) / len(last), last_step_loss=hist["loss"][-1], val_loss=val_loss,
        first_loss=hist["loss"][0], tokens_per_second=args.steps * tokens_per_step / wall,
        optimizer_step_ms=(totals["comm"] + totals["compute"]) / args.steps,
        optimizer_step_ms_median=statistics.median(step_ms),
        optimizer_comm_ms=totals["comm"] / args.steps,
        optimizer_compute_ms=totals["compute"] / args.steps, wall_seconds=wall, params=params,
        history=hist)


def check_meshmuon(args, data, mesh, world: int) -> str:
    """Builds the meshmuon optimizer once on the sharded model before anything trains, so a meshmuon that
    cannot run fails in seconds, on every rank alike. Returns '' or the reason."""
    reason = ""
    try:
        model, _ = build_model(args, data.vocab_size, mesh)
        optimizers.build("meshmuon", model, args)
    except optimizers.MeshmuonUnavailable as e:
        reason = str(e)
    flag = torch.tensor([1.0 if reason else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() and not reason:
        reason = "meshmuon could not be built on another rank (see its message)"
    return reason


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.no_launch and not launch.under_launcher():
        return launch.relaunch(args.launcher, args.ranks, sys.argv[1:])
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = launch.init_process_group(args.ranks)
    try:
        data = CharData(DEFAULT_TEXT)
        mesh = init_device_mesh("cpu", (world,))
        if "meshmuon" in args.optimizers:
            reason = check_meshmuon(args, data, mesh, world)
            if reason:
                if rank == 0:
                    print(f"[demo] meshmuon run not possible: {reason}", file=sys.stderr, flush=True)
                return 3
        if rank == 0:
            print(f"[demo] {world} ranks x {torch.get_num_threads()} threads | text "
                  f"{data.path.name}: {len(data.train)} train / {len(data.val)} val chars, vocab "
                  f"{data.vocab_size} | preset {args.preset}: {args.n_layer} layers, d "
                  f"{args.d_model}, {args.n_head} heads, seq {args.seq_len}, batch "
                  f"{args.batch_size}{f', MoE {args.moe_experts} experts' if args.moe_experts else ''}"
                  f" | {args.steps} steps, lr schedule {args.lr_schedule}", flush=True)
        summary = dict(steps=args.steps, ranks=world, optimizers=args.optimizers,
                       model=dict(n_layer=args.n_layer, n_head=args.n_head, d_model=args.d_model,
                                  seq_len=args.seq_len, moe_experts=args.moe_experts,
                                  tie_embeddings=args.tie_embeddings),
                       batch_size=args.batch_size, seed=args.seed,
                       hyperparameters=dict(muon_lr=args.muon_lr, adamw_lr=args.adamw_lr,
                                            muon_adamw_lr=args.muon_adamw_lr,
                                            weight_decay=args.weight_decay,
                                            lr_schedule=args.lr_schedule,
                                            warmup_steps=args.warmup_steps,
                                            ns_schedule=args.schedule, strategy=args.strategy,
                                            ns_matmul_dtype=args.ns_matmul_dtype,
                                            qk_clip=args.qk_clip,
                                            torch_muon_ns_coefficients=list(
                                                optimizers.TORCH_MUON_COEFFICIENTS)),
                       meshmuon=None, adamw=None, torch_muon=None)
        for name in args.optimizers:
            run = train_one(name, args, data, mesh, rank, world)
            if run is not None:  # None: a rank that waited during the one-process torch_muon run
                summary["params"] = run.pop("params")
                summary[name] = run
        if rank == 0:
            out = Path(args.out)
            print(report.table(summary))
            print(f"[demo] wrote {report.write_summary(summary, out)} and "
                  f"{report.plot(summary, out)}", flush=True)
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
