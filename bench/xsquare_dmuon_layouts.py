"""X-Square-Robot's DMuon (github.com/X-Square-Robot/dmuon) beside meshmuon in the `layouts` benchmark.

Not a test and not part of meshmuon: a benchmark run by hand, against a DMuon checkout given by path
(its code is imported from there, never copied here):

    git clone https://github.com/X-Square-Robot/dmuon /tmp/dmuon-src
    PYTHONPATH=build/python-stage python bench/xsquare_dmuon_layouts.py --dmuon-src /tmp/dmuon-src \\
        [--ranks 2,4] [--rounds 2] [--steps 10] [--warmup 3] [--json]

It trains the model of `python -m meshmuon.bench layouts` (meshmuon/bench/layouts.py: build_model,
make_batches, train_steps, summarize; 4 layers, d 256, vocab 8192, seq 128, 4 sequences per rank)
under torchrun with FSDP2 (gloo, CPU) at each --ranks count, alternating --rounds of three rows in
the same processes, so that load from other work hits all of them alike:
  adamw          torch.optim.AdamW (the baseline of `overhead_over_adamw`), as in layouts
  muon_owner     meshmuon.torch.Muon with owner placement of every block matrix, as in layouts
  xsquare_dmuon  dmuon.dedicate_params on every block matrix (blocks.*, 2-D: qkv, proj, fc, fc2) and
                 dmuon.Muon(model, lr=0.02, weight_decay=0.01, adamw_lr=3e-4,
                 adamw_weight_decay=0.01), the rest under fully_shard, as DMuon's
                 examples/basic_dp.py does. Its Newton-Schulz is its default ("gram" backend): the
                 iteration's products in float16 (X.half() after normalizing in fp32), unchanged here.

DMuon targets CUDA + NCCL. To run it on CPU + gloo this script replaces, FROM OUTSIDE and only in its
worker processes, what has no CPU/gloo counterpart; none of it touches DMuon's arithmetic:
  - torch.cuda.Stream / stream() / current_stream() / Event / current_device() and
    Tensor.record_stream: a CPU process has one in-order stream, so streams are one object whose
    wait_stream / wait_event do nothing, events are always complete (their record() notes the wall
    clock for elapsed_time), record_stream does nothing and the current device is 0.
  - dist._coalescing_manager: gloo raises "Backend gloo does not implement startCoalescing"; the
    replacement is a context manager that lets the collectives inside run one by one.
  - ReduceOp.AVG in dist.reduce / all_reduce / reduce_scatter_tensor: gloo has no AVG; on a gloo group
    it becomes SUM followed by a division by the group size (the same mean). FSDP2 itself does this
    on gloo too.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

ROWS = ("adamw", "muon_owner", "xsquare_dmuon")


# --- CPU stand-ins for DMuon's CUDA and NCCL calls (worker only) -----------------------------------

class _CpuStream:
    """One in-order stream: everything a CPU process runs is already ordered."""

    def __init__(self, device=None, priority=0, **_):
        self.device = device

    def wait_stream(self, _other):
        pass

    def wait_event(self, _event):
        pass

    def record_event(self, event=None):
        event = event or _CpuEvent()
        event.record(self)
        return event

    def synchronize(self):
        pass

    def query(self):
        return True


class _CpuEvent:
    """Complete as soon as recorded; elapsed_time in milliseconds of wall clock between records."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self._t = None

    def record(self, stream=None):
        self._t = time.perf_counter()

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return 1e3 * (end._t - self._t)


_STREAM = _CpuStream()


@contextlib.contextmanager
def _one_by_one(group=None, device=None, async_ops=False):
    """gloo has no coalescing: the collectives inside run one by one, each as issued."""
    yield None


def _avg_as_sum(fn, tensor_of):
    import torch.distributed as dist

    def wrapped(*args, **kwargs):
        op = kwargs.get("op")
        group = kwargs.get("group")
        if op != dist.ReduceOp.AVG or dist.get_backend(group) != "gloo":
            return fn(*args, **kwargs)
        kwargs["op"] = dist.ReduceOp.SUM
        work = fn(*args, **kwargs)
        if work is not None:  # async_op=True: wait, so that the division follows the sum
            work.wait()
        tensor_of(args, kwargs).div_(dist.get_world_size(group))
        return None if work is None else work

    return wrapped


def install_cpu_stand_ins():
    import torch
    import torch.distributed as dist

    torch.cuda.Stream = _CpuStream
    torch.cuda.Event = _CpuEvent
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.current_stream = lambda device=None: _STREAM
    torch.cuda.current_device = lambda: 0
    torch.Tensor.record_stream = lambda self, stream: None
    dist._coalescing_manager = _one_by_one
    dist.reduce = _avg_as_sum(dist.reduce, lambda a, k: a[0] if a else k["tensor"])
    dist.all_reduce = _avg_as_sum(dist.all_reduce, lambda a, k: a[0] if a else k["tensor"])
    dist.reduce_scatter_tensor = _avg_as_sum(dist.reduce_scatter_tensor, lambda a, k: a[0] if a else k["output"])


# --- the torchrun worker ---------------------------------------------------------------------------

def make_dmuon(args, mesh):
    import torch
    from torch.distributed.fsdp import fully_shard

    import dmuon
    from meshmuon.bench.layouts import build_model

    torch.manual_seed(0)
    model = build_model(args.layers, args.d, args.vocab, args.seq)
    dmuon.dedicate_params(model, mesh, predicate=lambda n, p: n.startswith("blocks.") and p.ndim == 2)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = dmuon.Muon(model, lr=0.02, weight_decay=0.01, adamw_lr=3e-4, adamw_weight_decay=0.01)
    return model, opt


def check_first_step(args, mesh, rank, world):
    """DMuon's first step under the stand-ins against a reference computed here from the global mean
    gradient with DMuon's own Newton-Schulz (NewtonSchulz().local, its default "gram" backend) and
    its update rule (first step: buffer = g, Nesterov input g + mu * g, W -= lr * wd * W +
    lr * 0.2 * sqrt(max(m, n)) * NS(input)). Returns, on rank 0, the largest relative difference over
    the dedicated matrices, and the same against rank 0's own gradient (a negative control: it
    differs when the ranks' gradients are not reduced)."""
    import torch

    import dmuon
    from meshmuon.bench import layouts

    lr, wd, mu = 0.02, 0.01, 0.95
    model, opt = make_dmuon(args, mesh)
    dedicated = [n for n, p in layouts.build_model(args.layers, args.d, args.vocab, args.seq).named_parameters()
                 if n.startswith("blocks.") and p.ndim == 2]
    before = {k: v.clone() for k, v in dmuon.get_model_state_dict(model).items()}
    layouts.train_steps(model, opt, layouts.make_batches(args, rank), args, 1, {})
    after = dmuon.get_model_state_dict(model)
    if rank != 0:
        return None
    ref = layouts.build_model(args.layers, args.d, args.vocab, args.seq)
    ref.load_state_dict(before)
    grads = []
    for r in range(world):
        idx = layouts.make_batches(args, r)[0]
        ref.zero_grad(set_to_none=True)
        logits = ref(idx[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), idx[:, 1:].reshape(-1)).backward()
        grads.append({n: p.grad.clone() for n, p in ref.named_parameters() if n in dedicated})
    ns = dmuon.NewtonSchulz()

    def worst(grad_of):
        rel = 0.0
        for n in dedicated:
            w, g = before[n].float(), grad_of(n)
            scale = 0.2 * max(g.shape) ** 0.5
            expected = -lr * wd * w - lr * scale * ns.local(g + mu * g, 5).float()
            got = after[n].float() - w
            rel = max(rel, float((got - expected).norm() / expected.norm()))
        return rel

    return {"max_rel_diff": worst(lambda n: sum(g[n] for g in grads) / world),
            "negative_control_rank0_grad_only": worst(lambda n: grads[0][n]),
            "matrices": len(dedicated)}


def worker(args):
    sys.path.insert(0, os.path.abspath(args.dmuon_src))
    install_cpu_stand_ins()
    import logging

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import dmuon
    from meshmuon.bench import layouts

    logging.getLogger("dmuon").setLevel(logging.WARNING)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    batches = layouts.make_batches(args, rank)
    check = check_first_step(args, mesh, rank, world) if args.check else None
    owned, samples, losses, info = {}, {row: {} for row in args.rows}, {}, {}
    for _ in range(args.rounds):
        for row in samples:
            if row == "xsquare_dmuon":
                model, opt = make_dmuon(args, mesh)
                info["owned"] = len(dmuon.get_owned_params(model, rank=rank))
                info["ns_backend"] = str(dmuon.get_ns_backend())
            else:
                model, opt = layouts.make_layout(row, args, mesh, owned)
            losses.setdefault(row, []).append(layouts.train_steps(model, opt, batches, args,
                                                                  args.warmup + args.steps, samples[row]))
            del model, opt
    rows = layouts.summarize(samples, owned)
    for row in rows:
        row["last_loss"] = losses[row["layout"]][-1]
        if row["layout"] == "xsquare_dmuon":
            counts = [None] * world
            dist.all_gather_object(counts, info["owned"])
            row["owned_matrices_per_rank"] = counts
            row["ns_backend"] = info["ns_backend"]
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world_size": world, "rows": rows, "dmuon_first_step_check": check}, f)
    dist.destroy_process_group()


# --- the driver ------------------------------------------------------------------------------------

def dmuon_commit(src):
    try:
        return subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def fp16_over_fp32_matmul(d):
    """This CPU's float16 over float32 time of Gram products X @ X.T, X [d, 4d] (a block's fc2 in
    Newton-Schulz), one thread, best of 7 runs of 3: DMuon's iteration runs in float16, which a CPU
    without native float16 products emulates."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(d, 4 * d)
        best = {}
        for dtype in (torch.float32, torch.float16):
            y = x.to(dtype)
            best[dtype] = min(_seconds(lambda: [y @ y.T for _ in range(3)]) for _ in range(7))
        return best[torch.float16] / best[torch.float32]
    finally:
        torch.set_num_threads(threads)


def dmuon_ns_seconds(args):
    """Seconds of DMuon's own Newton-Schulz (NewtonSchulz().local, its defaults) over every block
    matrix of the model, one after the other on one thread: the part of its optimizer step that the
    float16 products make slow here (the ranks share this between them, and share the cores)."""
    import torch
    from dmuon.optim.newton_schulz import NewtonSchulz

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        d = args.d
        gen = torch.Generator().manual_seed(0)
        grads = [torch.randn(shape, generator=gen) for _ in range(args.layers)
                 for shape in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d))]
        ns = NewtonSchulz()
        ns.local(grads[0], 5)
        return _seconds(lambda: [ns.local(g, 5) for g in grads])
    finally:
        torch.set_num_threads(threads)


def _seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(args):
    src = os.path.abspath(args.dmuon_src)
    if not os.path.isfile(os.path.join(src, "dmuon", "__init__.py")):
        raise SystemExit(f"xsquare_dmuon_layouts: --dmuon-src {src} has no dmuon/__init__.py; "
                         "pass the root of a DMuon checkout (git clone https://github.com/X-Square-Robot/dmuon)")
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"xsquare_dmuon_layouts: --rows {unknown} unknown; choose among {','.join(ROWS)}")
    sys.path.insert(0, src)
    from meshmuon.bench.layouts import run_workers
    fp16_ratio, ns_seconds = fp16_over_fp32_matmul(args.d), dmuon_ns_seconds(args)
    results = [run_workers(os.path.abspath(__file__), ranks, forwarded(args), "xsquare_dmuon_layouts")
               for ranks in args.ranks]
    report = {"model": {"layers": args.layers, "d": args.d, "vocab": args.vocab, "seq": args.seq,
                        "batch": args.batch},
              "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "machine": args.machine,
              "matmul_dtype": args.matmul_dtype, "fp16_over_fp32_matmul": fp16_ratio,
              "dmuon_ns_seconds_one_thread": ns_seconds,
              "dmuon_src": src, "dmuon_commit": dmuon_commit(src),
              "runs": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"DMuon {report['dmuon_commit'] or src}; float16 products here take "
          f"{report['fp16_over_fp32_matmul']:.1f}x the float32 time (DMuon's Newton-Schulz is float16); "
          f"its Newton-Schulz over all {4 * args.layers} block matrices, one thread: {ns_seconds:.2f} s")
    for run in results:
        print(f"{run['world_size']} ranks (FSDP2, gloo):")
        if run.get("dmuon_first_step_check"):
            c = run["dmuon_first_step_check"]
            print(f"  DMuon first step vs reference: max rel diff {c['max_rel_diff']:.2e} over {c['matrices']} "
                  f"matrices (negative control, rank 0's gradient only: {c['negative_control_rank0_grad_only']:.2e})")
        print(f"  {'layout':<16} {'total s':>9} {'fwd+bwd s':>10} {'opt s':>9} {'vs AdamW':>9}")
        for r in run["rows"]:
            print(f"  {r['layout']:<16} {r['total_seconds']:9.4f} {r['fwd_bwd_seconds']:10.4f} "
                  f"{r['opt_seconds']:9.4f} {100 * r['overhead_over_adamw']:+8.1f}%")
    return 0


def add_arguments(p):
    from meshmuon.bench.layouts import add_arguments as layouts_arguments

    layouts_arguments(p)  # --layers --d --vocab --seq --batch --steps --warmup --rounds --machine ...
    p.add_argument("--dmuon-src", required=True, help="root of a DMuon checkout (holds dmuon/__init__.py)")
    p.add_argument("--check", action="store_true",
                   help="first check DMuon's first step against a reference (dmuon_first_step_check)")
    p.add_argument("--rows", type=lambda v: v.split(","), default=list(ROWS),
                   help=f"comma-separated rows among {','.join(ROWS)} (adamw: the baseline)")


def forwarded(args):
    from meshmuon.bench.layouts import forwarded as layouts_forwarded

    return [*layouts_forwarded(args), "--dmuon-src", os.path.abspath(args.dmuon_src), "--rows", ",".join(args.rows),
            *(["--check"] if args.check else [])]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("--ranks", type=lambda v: [int(x) for x in v.split(",")], default=[2, 4])
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    sys.exit(worker(a) if a.worker else main(a))
