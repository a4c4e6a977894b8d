"""meshmuon beside its peers: one Muon step of the hidden matrices of a GPT (default 4 layers, d 768:
per layer q, k, v, o [d, d], MLP fc [4d, d] and proj [d, 4d]) over N ranks (gloo, CPU), every
optimizer from the same initial weights and the same gradients.

    python bench/peers.py --np 2            # relaunches itself: mpirun -np 2 --oversubscribe ...
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 4 --oversubscribe \\
        --bind-to none -x OPENBLAS_NUM_THREADS=1 python bench/peers.py
    python bench/peers.py --help

Contestants (those whose package is not importable are listed with the reason and skipped):
  meshmuon fp32 / meshmuon bf16   meshmuon.torch.Muon on the FSDP2 (`fully_shard`) DTensors, Newton-Schulz
                            products from fp32 / bf16 operands (ns_matmul_dtype)
  torch.optim.Muon          PyTorch's own, per rank on the full matrices: each step all-gathers the
                            gradients (DTensor.full_tensor()), steps a full replica on every rank
                            and copies the rank's shard back (the baseline that always exists)
  muon_fsdp2.Muon           PyPI muon-fsdp2, on the same FSDP2 DTensors (rms_scale=False, so that
                            its update is the original Muon's; its Newton-Schulz is torch.compile'd)
  muon.Muon                 PyPI muon-optimizer (Keller Jordan's Muon): params replicated on every
                            rank (DDP layout, not FSDP); each rank orthogonalizes 1/N of the
                            matrices, then all-gathers the parameters
Time: the median over --steps steps (after --warmup steps each) of the slowest rank's
optimizer.step(), each step after a barrier; the timed steps are interleaved (step s of every
optimizer, then step s + 1) so that load from other jobs hits all alike. Agreement: the first step's parameter change of every matrix
of the first --ref-layers layers against a float64 Muon written here (the Jordan (3.4445, -4.775,
2.0315) quintic, 5 iterations, Nesterov momentum 0.95, scale sqrt(max(1, rows/cols))), as max over
matrices of |dp - dp_ref|_F / |dp_ref|_F. Peer versions: bench/requirements-peers.txt.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

LR, MOMENTUM, EPS = 0.02, 0.95, 1e-7
JORDAN = (3.4445, -4.7750, 2.0315)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--np", type=int, default=2, help="ranks, when started without mpirun")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d", type=int, default=768, help="model width")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps first, at least 1 (muon_fsdp2 compiles during the first)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
    p.add_argument("--ref-layers", type=int, default=1,
                   help="layers whose matrices are checked against the float64 reference "
                        "(every shape is in each layer; float64 Newton-Schulz is slow)")
    p.add_argument("--only", default="",
                   help="comma-separated contestants to run (default all): meshmuon_fp32, "
                        "meshmuon_bf16, meshmuon_gram, torch_muon, muon_fsdp2, muon_kj")
    p.add_argument("--json", default="", help="also write the results to this file (rank 0)")
    args = p.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be at least 1")
    return args


def relaunch(args) -> int:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("[peers] mpirun not found (Open MPI)", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OPENBLAS_NUM_THREADS="1")
    cmd = [mpirun, "-np", str(args.np), "--oversubscribe", "--bind-to", "none",
           "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "OPENBLAS_NUM_THREADS", "-x", "PYTHONPATH",
           sys.executable, "-u", os.path.abspath(__file__), *sys.argv[1:]]
    env.setdefault("PYTHONPATH", "")
    return subprocess.call(cmd, env=env)


def cpu_description() -> dict:
    model, flags = "unknown", set()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() == "Flags":
                flags = set(value.split())
    except (OSError, subprocess.SubprocessError):
        pass
    return dict(model=model, cores=os.cpu_count(), avx512_bf16="avx512_bf16" in flags,
                amx_bf16="amx_bf16" in flags)


def shapes(layers: int, d: int) -> list:
    out = []
    for layer in range(layers):
        for name, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                            ("fc", (4 * d, d)), ("proj", (d, 4 * d))):
            out.append((f"layers.{layer}.{name}.weight", shape, layer))
    return out


def reference_delta(grad, lr=LR, momentum=MOMENTUM, steps=5):
    """float64 Muon, first step from a zero momentum buffer (Nesterov)."""
    import torch

    g = grad.double()
    buf = torch.zeros_like(g).lerp_(g, 1 - momentum)
    u = g.lerp(buf, momentum)
    tall = u.shape[0] > u.shape[1]
    x = u.mT if tall else u
    x = x / (x.norm() + EPS)
    a, b, c = JORDAN
    for _ in range(steps):
        s = x @ x.mT
        x = a * x + (b * s + c * s @ s) @ x
    if tall:
        x = x.mT
    return -lr * max(1.0, u.shape[0] / u.shape[1]) ** 0.5 * x


def main(argv=None) -> int:
    args = parse_args(argv)
    if "OMPI_COMM_WORLD_SIZE" not in os.environ and "WORLD_SIZE" not in os.environ:
        return relaunch(args)

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard

    import meshmuon
    import meshmuon.torch as dt

    rank, world = dt.init_distributed()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    mesh = init_device_mesh("cpu", (world,))
    mats = shapes(args.layers, args.d)
    only = {s.strip() for s in args.only.split(",") if s.strip()}

    class Layer(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            for name, (o, i) in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                                 ("fc", (4 * d, d)), ("proj", (d, 4 * d))):
                setattr(self, name, torch.nn.Linear(i, o, bias=False))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)  # the same initial weights for every contestant and rank
            self.layers = torch.nn.ModuleList(Layer(args.d) for _ in range(args.layers))

    def fsdp_model():
        m = Model()
        for layer in m.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return m

    def full_params():
        return [torch.nn.Parameter(p.detach().clone()) for p in Model().parameters()]

    def grads_of_step(step):
        gen = torch.Generator().manual_seed(1000 + step)  # the same on every rank
        return [torch.randn(shape, generator=gen) for _, shape, _ in mats]

    def set_grads(params, full_grads):
        for p, g in zip(params, full_grads):
            if isinstance(p, DTensor):
                local = g.chunk(world, dim=0)[rank].clone()
                p.grad = DTensor.from_local(local, mesh, [Shard(0)], shape=g.shape,
                                            stride=g.stride())
            else:
                p.grad = g.clone()

    def full_value(p):
        return (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()

    # ---- contestants: name -> (label, layout, params, step function) -------------------------
    contestants, skipped = [], []

    def want(key):
        return not only or key in only

    for key, dtype, method in (("meshmuon_fp32", "fp32", "symmetric"), ("meshmuon_bf16", "bf16", "symmetric"),
                               ("meshmuon_gram", "fp32", "gram")):
        if want(key):
            m = fsdp_model()
            params = list(m.parameters())
            opt = dt.Muon(params, lr=LR, weight_decay=0.0, momentum=MOMENTUM,
                          ns_matmul_dtype=dtype, ns_method=method)
            label = f"meshmuon {dtype}" + (" gram" if method == "gram" else "")
            contestants.append(dict(key=key, label=label,
                                    version=importlib.metadata.version("meshmuon")
                                    if _has_dist("meshmuon") else getattr(meshmuon, "__version__", "?"),
                                    layout="FSDP2 shards", params=params, step=opt.step))
    if want("torch_muon"):
        m = fsdp_model()
        params = list(m.parameters())
        replica = full_params()
        topt = torch.optim.Muon(replica, lr=LR, weight_decay=0.0, momentum=MOMENTUM,
                                nesterov=True, ns_coefficients=JORDAN, ns_steps=5)

        def torch_step(params=params, replica=replica, topt=topt):
            for p, r in zip(params, replica):
                r.grad = p.grad.full_tensor()
            topt.step()
            with torch.no_grad():
                for p, r in zip(params, replica):
                    p.to_local().copy_(r.chunk(world, dim=0)[rank])

        contestants.append(dict(key="torch_muon", label="torch.optim.Muon", version=torch.__version__,
                                layout="all-gather grads, full replica per rank", params=params,
                                step=torch_step))
    for key, module, dist_name in (("muon_fsdp2", "muon_fsdp2", "muon-fsdp2"),
                                   ("muon_kj", "muon", "muon-optimizer"),
                                   ("dtensor_muon", "dtensor_muon", "dtensor-muon"),
                                   ("muonium", "muonium", "muonium")):
        if not want(key):
            continue
        try:
            mod = importlib.import_module(module)
            version = importlib.metadata.version(dist_name)
        except Exception as e:  # noqa: BLE001 (ImportError, or a missing dependency such as triton)
            skipped.append(f"{dist_name}: not importable ({type(e).__name__}: {e})")
            continue
        if key == "muon_fsdp2":
            m = fsdp_model()
            params = list(m.parameters())
            opt = mod.Muon([dict(params=params, use_muon=True, lr=LR, momentum=MOMENTUM,
                                 weight_decay=0.0, rms_scale=False, nesterov=True, ns_steps=5)])
            contestants.append(dict(key=key, label="muon_fsdp2.Muon", version=version,
                                    layout="FSDP2 shards", params=params, step=opt.step))
        elif key == "muon_kj" and hasattr(mod, "Muon") and hasattr(mod, "SingleDeviceMuon"):
            # It sorts the matrices by size and all-gathers them N at a time: gloo needs the N
            # shapes of each all-gather to be equal (e.g. --layers 4 at 2 and 4 ranks).
            order = sorted((shape for _, shape, _ in mats), reverse=True)
            if any(len({tuple(s) for s in order[i:i + world]}) > 1
                   for i in range(0, len(order), world)):
                skipped.append(f"{dist_name} {version}: its all-gathers of {world} matrices "
                               f"sorted by size would mix shapes here (gloo refuses); try "
                               f"--layers a multiple of {world}")
                continue
            params = full_params()
            opt = mod.Muon(params, lr=LR, weight_decay=0.0, momentum=MOMENTUM)
            contestants.append(dict(key=key, label="muon.Muon (muon-optimizer)", version=version,
                                    layout="replicated params (DDP)", params=params, step=opt.step))
        else:
            skipped.append(f"{dist_name} {version}: importable, but not wired into this bench")

    # ---- run: the same gradients for everyone, each step after a barrier ----------------------
    n_ref = sum(1 for _, _, layer in mats if layer < args.ref_layers)
    ref = None
    if rank == 0:
        ref = [reference_delta(g) for g in grads_of_step(0)[:n_ref]]
    def timed_step(c, step):
        set_grads(c["params"], grads_of_step(step))
        dist.barrier()
        t0 = time.perf_counter()
        c["step"]()
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        for p in c["params"]:
            p.grad = None
        return elapsed.item() * 1e3

    # warm-up, each contestant alone; its first step (from zero momentum) is the one compared
    for c in contestants:
        init = [full_value(p) for p in c["params"][:n_ref]]
        for step in range(args.warmup):
            timed_step(c, step)
            if step == 0:
                after = [full_value(p) for p in c["params"][:n_ref]]
                if rank == 0:
                    c["rel"] = max(float((a.double() - b.double() - r).norm() / r.norm())
                                   for a, b, r in zip(after, init, ref))
        c["times"] = []
    # timed steps interleaved (step s of every contestant, then step s + 1), so that load from
    # other jobs on a shared machine hits all of them alike
    for step in range(args.warmup, args.warmup + args.steps):
        for c in contestants:
            c["times"].append(timed_step(c, step))
    results = []
    for c in contestants:
        times = c["times"]
        results.append(dict(key=c["key"], optimizer=c["label"], version=c["version"],
                            layout=c["layout"], median_ms=statistics.median(times), times_ms=times,
                            max_rel_diff_vs_fp64=c.get("rel", math.nan)))

    if rank == 0:
        cpu = cpu_description()
        base = next((r["median_ms"] for r in results if r["key"] == "meshmuon_fp32"), math.nan)
        n_params = sum(a * b for _, (a, b), _ in mats)
        print(f"[peers] {len(mats)} matrices ({n_params / 1e6:.1f}M parameters: {args.layers} "
              f"layers, d {args.d}), {world} ranks x {torch.get_num_threads()} threads, gloo | CPU "
              f"{cpu['model']}, {cpu['cores']} cores, avx512_bf16 "
              f"{'yes: bf16 products native' if cpu['avx512_bf16'] else 'no: bf16 emulated'} | "
              f"torch {torch.__version__}, BLAS {meshmuon.blas_info().get('corename', '?')}")
        head = (f"{'optimizer':<27} {'version':<12} {'layout':<40} {'step ms':>9} "
                f"{'min-max ms':>13} {'vs meshmuon fp32':>13} {'max rel diff':>12}")
        print(head)
        print("-" * len(head))
        for r in results:
            spread = f"{min(r['times_ms']):.0f}-{max(r['times_ms']):.0f}"
            print(f"{r['optimizer']:<27} {r['version']:<12} {r['layout']:<40} "
                  f"{r['median_ms']:>9.1f} {spread:>13} {r['median_ms'] / base:>12.2f}x "
                  f"{r['max_rel_diff_vs_fp64']:>12.2e}")
        print(f"step ms: median of {args.steps} steps (interleaved across optimizers) after "
              f"{args.warmup} warm-up, slowest rank; "
              f"max rel diff: first step's update vs float64 Muon, {n_ref} matrices of "
              f"{args.ref_layers} layer(s)")
        for s in skipped:
            print(f"skipped: {s}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(world=world, threads=torch.get_num_threads(), cpu=cpu,
                               layers=args.layers, d=args.d, warmup=args.warmup, steps=args.steps,
                               ref_matrices=n_ref, results=results, skipped=skipped), f, indent=2)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
