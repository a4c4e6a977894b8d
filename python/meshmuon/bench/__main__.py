"""Benchmarks of the Python package. Timings are ratios to a baseline measured in the same run.

  python -m meshmuon.bench compare-torch [--json] [--layers 12] [--d 768] [--repeat 1] [--device cpu]
  python -m meshmuon.bench layouts [--json] [--ranks 2,4] [--layers 4] [--d 256] [--machine cpu|profile.json]

layouts: meshmuon/bench/layouts.py (AdamW, Muon on FSDP2, owner placement under torchrun; the cost
model's predicted optimizer step over the measured one).

compare-torch: one optimizer step of torch.optim.Muon and of meshmuon.torch.Muon with fp32 and with
bf16 Newton–Schulz products, in this process, on the 2-D weights of a GPT (per layer qkv [3d, d],
proj [d, d], fc [4d, d], fc2 [d, 4d]; GPT-2 small at the defaults: 48 matrices, 85M parameters).
All start from the same parameters, momentum and gradients; each one's first step is compared with
torch's (max_rel_diff = max over matrices of |dp - dp_torch|_F / |dp_torch|_F); `--repeat` further
steps alternate between them, and the best time of each is kept. `--device cuda` (or cuda:N) runs
them on that GPU (parameters, gradients and state there; each timed step ends with a device
synchronization).

It prints the CPU, what runs meshmuon's bf16 products there (native oneDNN, or meshmuon's widened products
at the fp32 rate) and what "auto" picks. Where torch's own bf16 matmul is far slower than its fp32
one (CPUs without AVX-512: measured ~130x), a torch.optim.Muon step on every layer would take many
minutes: torch is then timed on the first layer's matrices only and its step time scaled by the
layer count (`torch_layers_timed` says so); `--torch-layers` sets that count by hand.
"""
import argparse
import json
import sys
import time
import warnings

import torch

import meshmuon
import meshmuon.torch as dt
from meshmuon.torch import _precision
from meshmuon.bench import layouts as layouts_module


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
    slowdown = _precision.torch_bf16_slowdown() if device.type == "cpu" else 1.0
    torch_layers = args.torch_layers or (1 if slowdown > 10 else args.layers)
    torch_layers = min(torch_layers, args.layers)
    torch_count = 4 * torch_layers  # the first layers' matrices
    runs = {"torch": None, "meshmuon_fp32": "fp32", "meshmuon_bf16": "bf16"}
    # bf16 products are asked for on purpose here, native or not: the output says what ran.
    warnings.simplefilter("ignore", dt.MeshmuonPerformanceWarning)
    opts, deltas, params = {}, {}, {}
    for name, dtype in runs.items():
        count = torch_count if name == "torch" else len(shapes)
        params[name] = [torch.nn.Parameter(p.clone()) for p in init[:count]]
        for p, g in zip(params[name], grads):
            p.grad = g
        opts[name] = torch.optim.Muon(params[name], lr=args.lr) if dtype is None else \
            dt.Muon(params[name], lr=args.lr, ns_matmul_dtype=dtype, threads=args.threads,
                    ns_method="symmetric" if dtype == "bf16" and args.ns_method == "gram" else args.ns_method)
    # The first step of each starts from the same state: compared, and timed too.
    best = {name: timed_step(opt, device) for name, opt in opts.items()}
    for name in opts:
        deltas[name] = [p.detach() - p0 for p, p0 in zip(params[name], init)]
    # Further steps alternate between them, so that load on a shared machine hits all alike.
    for _ in range(args.repeat):
        for name, opt in opts.items():
            best[name] = min(best[name], timed_step(opt, device))
    torch_seconds = best["torch"] * args.layers / torch_layers  # scaled when torch ran fewer layers
    cpu = meshmuon.cpu_info()

    def rel(name):  # on the matrices torch ran
        return max(((a - b).norm() / b.norm()).item()
                   for a, b in zip(deltas[name][:torch_count], deltas["torch"]))

    out = {
        "benchmark": "compare-torch",
        "matrices": len(shapes),
        "parameters": sum(a * b for a, b in shapes),
        "layers": args.layers,
        "d": args.d,
        "ns_method": args.ns_method,
        "meshmuon_threads": args.threads or meshmuon.blas_get_num_threads(),
        "torch_threads": torch.get_num_threads(),
        "blas": meshmuon.blas_info()["corename"],
        "cpu_model": cpu["model"],
        "bf16_native": cpu["bf16_native"],
        "bf16_products": cpu["bf16_products"] if device.type == "cpu" else "cuda",
        "bf16_kernel": cpu["bf16_kernel"] if device.type == "cpu" else None,
        "auto_matmul_dtype": cpu["auto_matmul_dtype"] if device.type == "cpu" else "bf16",
        "blas_threads": meshmuon.blas_get_num_threads(),
        "torch_bf16_over_fp32_matmul": slowdown,
        "torch_layers_timed": torch_layers,
        "torch_step_seconds": torch_seconds,
        "meshmuon_fp32_step_seconds": best["meshmuon_fp32"],
        "meshmuon_bf16_step_seconds": best["meshmuon_bf16"],
        "speedup_fp32": torch_seconds / best["meshmuon_fp32"],
        "speedup_bf16": torch_seconds / best["meshmuon_bf16"],
        "bf16_over_fp32": best["meshmuon_bf16"] / best["meshmuon_fp32"],
        "max_rel_diff_fp32": rel("meshmuon_fp32"),
        "max_rel_diff_bf16": rel("meshmuon_bf16"),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    auto = "meshmuon_bf16" if out["auto_matmul_dtype"] == "bf16" else "meshmuon_fp32"
    out.update(meshmuon_step_seconds=best[auto], speedup=torch_seconds / best[auto],
               max_rel_diff=rel(auto))  # the default (ns_matmul_dtype="auto") run
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['matrices']} matrices ({out['parameters'] / 1e6:.1f}M parameters), "
          f"{args.layers} layers, d = {args.d}, on {device}" + (f" ({out['gpu']})" if out["gpu"] else ""))
    if device.type == "cpu":
        print(f"  CPU {cpu['model']}: meshmuon's bf16 products {cpu['bf16_products']} ({cpu['bf16_kernel']}); "
              f"ns_matmul_dtype auto = {cpu['auto_matmul_dtype']}")
        print(f"  torch's bf16 matmul: {slowdown:.1f}x the time of its fp32 matmul here")
    timed = "" if torch_layers == args.layers else \
        f", timed on {torch_layers} of {args.layers} layers and scaled (its bf16 matmul is slow here)"
    print(f"  torch.optim.Muon        {torch_seconds:8.3f} s/step (bf16 NS, {out['torch_threads']} threads{timed})")
    for name, dtype in (("meshmuon_fp32", "fp32"), ("meshmuon_bf16", "bf16")):
        print(f"  meshmuon.torch.Muon {dtype}   {best[name]:8.3f} s/step ({args.ns_method} NS, {dtype} products, "
              f"{out['meshmuon_threads']} threads): {torch_seconds / best[name]:.2f}x torch, max relative "
              f"difference of the update {rel(name):.2e}{'  <- auto' if name == auto else ''}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m meshmuon.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare-torch", help="one step of meshmuon vs torch.optim.Muon on GPT matrices")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--layers", type=int, default=12)
    c.add_argument("--d", type=int, default=768, help="model width (GPT-2 small: 768)")
    c.add_argument("--repeat", type=int, default=1, help="timed steps after the first (best kept)")
    c.add_argument("--lr", type=float, default=0.02)
    c.add_argument("--ns-method", default="symmetric", choices=["plain", "symmetric", "gram"],
                   help="the bf16 run uses symmetric where this is gram (gram needs fp32 products)")
    c.add_argument("--torch-layers", type=int, default=None,
                   help="layers torch.optim.Muon is timed on (scaled to --layers); default: all, or 1 "
                        "where torch's bf16 matmul is over 10x slower than its fp32 matmul")
    c.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where both optimizers run")
    c.add_argument("--threads", type=int, default=None,
                   help="matrices orthogonalized at once (default: the BLAS thread count)")
    lay = sub.add_parser("layouts", help="train a small GPT under torchrun (2 and 4 ranks): AdamW, Muon on "
                                         "FSDP2 (auto), Muon with owner placement; predicted vs measured")
    lay.add_argument("--json", action="store_true", help="print one JSON object")
    lay.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4],
                     help="comma-separated rank counts (default 2,4)")
    layouts_module.add_arguments(lay)
    args = parser.parse_args(argv)
    if args.command == "layouts":
        return layouts_module.layouts(args)
    return compare_torch(args)


if __name__ == "__main__":
    sys.exit(main())
