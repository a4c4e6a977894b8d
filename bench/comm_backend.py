"""The engine's communicator backends compared in ONE mpirun job: meshmuon.torch.Muon stepping GPT-2
124M's Muon matrices (12 layers x attn.c_attn 2304x768, attn.c_proj 768x768, mlp.c_fc 3072x768,
mlp.c_proj 768x3072: 84.9M parameters, plain replicated tensors, the distributed engine) once on
meshmuon's MPI communicator and once on the c10d one (torch.distributed gloo, meshmuon/torch/_c10d.py),
steps ALTERNATING between the two so that load from other processes hits both alike:

  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe \
      --bind-to none -x OPENBLAS_NUM_THREADS=1 -x PYTHONPATH python bench/comm_backend.py --steps 6

Per backend: the optimizer step (after a barrier, slowest rank) median / min over the steps after
--warmup, the engine's communication wait, and bytes per rank and step (the engine's counters:
equal by construction, checked). Also checks that both runs end bitwise equal. Prints one JSON
object on rank 0 with the ratio c10d / mpi of the median step.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn as nn

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
import torch.distributed as dist  # noqa: E402
from meshmuon.torch import _comms  # noqa: E402


def gpt2_muon_matrices(layers: int, d: int = 768) -> nn.Module:
    """The hidden matrices of GPT-2 (HF naming, nn.Linear layout [out, in])."""
    model = nn.Module()
    for i in range(layers):
        block = nn.Module()
        block.c_attn = nn.Linear(d, 3 * d, bias=False)
        block.attn_proj = nn.Linear(d, d, bias=False)
        block.c_fc = nn.Linear(d, 4 * d, bias=False)
        block.mlp_proj = nn.Linear(4 * d, d, bias=False)
        model.add_module(f"h{i}", block)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="timed steps per backend (after warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per backend first")
    ap.add_argument("--layers", type=int, default=12, help="GPT-2 blocks (12: gpt2-124m)")
    ap.add_argument("--json", default="", help="also write the result here (rank 0)")
    args = ap.parse_args()
    rank, world = dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29533")))
    meshmuon.blas_set_num_threads(1)
    comms = {"mpi": _comms.make_communicator("mpi"), "c10d": _comms.make_communicator("c10d")}
    torch.manual_seed(0)
    base = gpt2_muon_matrices(args.layers)
    params = sum(p.numel() for p in base.parameters())
    runs = {}
    for name, comm in comms.items():
        model = base if name == "c10d" else gpt2_muon_matrices(args.layers)
        if model is not base:
            model.load_state_dict(base.state_dict())
        _comms._HOST_COMM = comm  # the engine takes the job's communicator from here
        opt = dt.Muon(model.parameters(), lr=0.02, weight_decay=0.1)
        assert opt.engine == "distributed" and opt._engine.comm.backend == name
        runs[name] = dict(model=model, opt=opt, times=[], comm_wait=[], stats=None)
    for step in range(args.warmup + args.steps):
        g = torch.Generator().manual_seed(1000 + step)
        grads = [torch.randn(p.shape, generator=g) * 0.01 for p in base.parameters()]
        order = ("mpi", "c10d") if step % 2 == 0 else ("c10d", "mpi")
        for name in order:
            run = runs[name]
            for p, gr in zip(run["model"].parameters(), grads):
                p.grad = gr
            dist.barrier()
            t0 = time.perf_counter()
            run["opt"].step()
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank
            stats = run["opt"].last_step_stats
            if step >= args.warmup:
                run["times"].append(float(t))
                run["comm_wait"].append(stats["comm_wait_seconds"])
            run["stats"] = stats
    same = all(torch.equal(p.detach().view(torch.int32), q.detach().view(torch.int32))
               for p, q in zip(runs["mpi"]["model"].parameters(), runs["c10d"]["model"].parameters()))
    keys = ("bytes_sent", "bytes_recv", "collectives")
    out = dict(world=world, layers=args.layers, muon_params=params, steps=args.steps,
               warmup=args.warmup, machine=f"{platform.processor() or platform.machine()}, "
                                           f"{os.cpu_count()} cores", bitwise_equal=same)
    for name, run in runs.items():
        out[name] = dict(step_s_median=statistics.median(run["times"]), step_s_min=min(run["times"]),
                         step_s_all=[round(x, 4) for x in run["times"]],
                         comm_wait_s_median=statistics.median(run["comm_wait"]),
                         **{k: run["stats"][k] for k in keys})
    out["bytes_equal"] = all(out["mpi"][k] == out["c10d"][k] for k in keys)
    out["ratio_c10d_over_mpi_median"] = out["c10d"]["step_s_median"] / out["mpi"]["step_s_median"]
    out["ratio_c10d_over_mpi_min"] = out["c10d"]["step_s_min"] / out["mpi"]["step_s_min"]
    if rank == 0:
        text = json.dumps(out, indent=1)
        print(text, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    assert same and out["bytes_equal"], out
    _comms._HOST_COMM = comms["c10d"]


if __name__ == "__main__":
    main()
