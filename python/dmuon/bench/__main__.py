"""Benchmarks of the Python package. Timings are ratios to a baseline measured in the same run.

  python -m dmuon.bench compare-torch [--json] [--layers 12] [--d 768] [--repeat 1] [--device cpu]

Prints the CPU model and whether its bf16 products are native (the speed of bf16 products, dmuon's
and torch's, depends on it).

compare-torch: one optimizer step of dmuon.torch.Muon and of torch.optim.Muon, in this process, on
the 2-D weights of a GPT (per layer qkv [3d, d], proj [d, d], fc [4d, d], fc2 [d, 4d]; GPT-2 small
at the defaults: 48 matrices, 85M parameters). Both start from the same parameters, momentum and
gradients; the first step of each is compared (max_rel_diff = max over matrices of
|dp_dmuon - dp_torch|_F / |dp_torch|_F); `--repeat` further steps alternate between the two, and
the best time of each is kept. `--device cuda` (or cuda:N) runs both on that GPU (parameters,
gradients and state there; each timed step ends with a device synchronization).
"""
import argparse
import json
import sys
import time

import torch

import dmuon
import dmuon.torch as dt


def gpt_matrices(layers, d):
    shapes = []
    for _ in range(layers):
        shapes += [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)]
    return shapes


def timed_step(opt, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def bench_device(name):
    """The torch.device of --device, or a SystemExit(2) naming why it cannot run here."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise SystemExit(f"compare-torch: --device {name!r}: {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"compare-torch: --device {name}: no CUDA device (torch "
                             f"{torch.__version__}: torch.cuda.is_available() is False)")
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    elif device.type != "cpu":
        raise SystemExit(f"compare-torch: --device {name}: use cpu, cuda or cuda:N")
    return device


def compare_torch(args):
    device = bench_device(args.device)
    shapes = gpt_matrices(args.layers, args.d)
    gen = torch.Generator().manual_seed(0)  # the same values on every device
    init = [(torch.randn(s, generator=gen) * 0.02).to(device) for s in shapes]
    grads = [torch.randn(s, generator=gen).to(device) for s in shapes]
    opts, deltas, params = {}, {}, {}
    for name in ("torch", "dmuon"):
        params[name] = [torch.nn.Parameter(p.clone()) for p in init]
        for p, g in zip(params[name], grads):
            p.grad = g
        opts[name] = torch.optim.Muon(params[name], lr=args.lr) if name == "torch" else \
            dt.Muon(params[name], lr=args.lr, ns_method=args.ns_method,
                    ns_matmul_dtype=args.ns_matmul_dtype, threads=args.threads)
    # The first step of each starts from the same state: compared, and timed too.
    best = {name: timed_step(opt, device) for name, opt in opts.items()}
    for name in opts:
        deltas[name] = [p.detach() - p0 for p, p0 in zip(params[name], init)]
    # Further steps alternate between the two, so that load on a shared machine hits both alike.
    for _ in range(args.repeat):
        for name, opt in opts.items():
            best[name] = min(best[name], timed_step(opt, device))
    results = best
    cpu = dmuon.cpu_info()
    rel = max(((a - b).norm() / b.norm()).item() for a, b in zip(deltas["dmuon"], deltas["torch"]))
    out = {
        "benchmark": "compare-torch",
        "matrices": len(shapes),
        "parameters": sum(a * b for a, b in shapes),
        "layers": args.layers,
        "d": args.d,
        "ns_method": args.ns_method,
        "ns_matmul_dtype": args.ns_matmul_dtype,
        "dmuon_threads": args.threads or dmuon.blas_get_num_threads(),
        "torch_threads": torch.get_num_threads(),
        "blas": dmuon.blas_info()["corename"],
        "cpu_model": cpu["model"],
        "bf16_native": cpu["bf16_native"],
        "blas_threads": dmuon.blas_get_num_threads(),
        "dmuon_step_seconds": results["dmuon"],
        "torch_step_seconds": results["torch"],
        "speedup": results["torch"] / results["dmuon"],
        "max_rel_diff": rel,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['matrices']} matrices ({out['parameters'] / 1e6:.1f}M parameters), "
              f"{args.layers} layers, d = {args.d}, on {device}"
              + (f" ({out['gpu']})" if out["gpu"] else ""))
        print(f"  CPU {cpu['model']}: bf16 products "
              + ("native (avx512_bf16 / amx_bf16)" if cpu["bf16_native"] else
                 "EMULATED (no avx512_bf16 / amx_bf16): slower than fp32 and ~4.5x native bf16, so the "
                 "bf16 rows of docs/python.md do not hold here"))
        print(f"  torch.optim.Muon  {out['torch_step_seconds']:8.3f} s/step (bf16 NS, "
              f"{out['torch_threads']} threads)")
        print(f"  dmuon.torch.Muon  {out['dmuon_step_seconds']:8.3f} s/step ({args.ns_method} NS, "
              f"{args.ns_matmul_dtype} products, {out['dmuon_threads']} threads)")
        print(f"  speedup {out['speedup']:.2f}x, max relative difference of the update "
              f"{out['max_rel_diff']:.2e}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dmuon.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare-torch", help="one step of dmuon vs torch.optim.Muon on GPT matrices")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--layers", type=int, default=12)
    c.add_argument("--d", type=int, default=768, help="model width (GPT-2 small: 768)")
    c.add_argument("--repeat", type=int, default=1, help="timed steps after the first (best kept)")
    c.add_argument("--lr", type=float, default=0.02)
    c.add_argument("--ns-method", default="symmetric", choices=["plain", "symmetric", "gram"],
                   help="gram needs --ns-matmul-dtype fp32")
    c.add_argument("--ns-matmul-dtype", default="bf16", choices=["fp32", "bf16"],
                   help="dtype of the Newton-Schulz product operands (torch.optim.Muon: bf16)")
    c.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where both optimizers run")
    c.add_argument("--threads", type=int, default=None,
                   help="matrices orthogonalized at once (default: the BLAS thread count)")
    args = parser.parse_args(argv)
    return compare_torch(args)


if __name__ == "__main__":
    sys.exit(main())
