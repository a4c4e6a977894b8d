"""The construction walk of meshmuon.torch.Muon: which of the adapter's modules building an optimizer
enters, how often, and in what order (issue 45: "the walk from Muon(...) to the C++ engine enters
each module once").

    python tools/probe/construction_walk.py                 one process (the local core)
    torchrun --nproc-per-node 2 tools/probe/construction_walk.py --fsdp   FSDP2 (the distributed core)

An *entry* is a call whose frame belongs to a meshmuon module other than its caller's (a call within
a module is not an entry; returning into a module is not one either). Rank 0 prints the modules in
the order first entered with their entry counts, the totals, and the walk as a sequence of modules
(runs of the same module merged). `--json` prints the same as one JSON object.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn


def module_of(frame):
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("meshmuon") else None


def trace_walk(build):
    counts, order, walk = {}, [], []

    def profile(frame, event, arg):
        if event != "call":
            return
        mod = module_of(frame)
        if mod is None:
            return
        caller = frame.f_back
        while caller is not None and module_of(caller) is None and caller.f_back is not None:
            # a call through torch / the standard library (e.g. a hook, functools) counts from the
            # meshmuon module that made it
            caller = caller.f_back
        if caller is not None and module_of(caller) == mod:
            return
        if mod not in counts:
            counts[mod] = 0
            order.append(mod)
        counts[mod] += 1
        if not walk or walk[-1] != mod:
            walk.append(mod)

    sys.setprofile(profile)
    try:
        result = build()
    finally:
        sys.setprofile(None)
    return result, {"modules": [[m, counts[m]] for m in order], "module_count": len(order),
                    "entries": sum(counts.values()), "walk": walk}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 over torch.distributed (run under torchrun)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import meshmuon.torch as mt

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 64, bias=False), nn.Linear(64, 64, bias=False))
    rank = 0
    if args.fsdp:
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    groups = mt.param_groups(model)  # Muon for the matrices, AdamW for the bias
    _, walk = trace_walk(lambda: mt.Muon(groups, lr=0.02))
    if rank == 0:
        if args.json:
            print(json.dumps(walk))
        else:
            for m, n in walk["modules"]:
                print(f"{n:4d}  {m}")
            print(f"{walk['module_count']} modules, {walk['entries']} entries")
            print(" -> ".join(m.removeprefix("meshmuon.") for m in walk["walk"]))
    if args.fsdp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
