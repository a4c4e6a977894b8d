"""Multi-rank cases of split orthogonalization (num_heads / split_sizes, issue 37) under mpirun,
run by test_split.py. Each case shards a model with a fused GQA-style QKV weight [16, 4] split into
its q | k | v row blocks (8, 4, 4) and a per-head projection [8, 12] (num_heads=4: 4 blocks of 2
rows), steps it with deterministic gradients and compares parameters and state BITWISE with the
single-process run (meshmuon.LocalOptimizer) of the same model and groups. The blocks straddle the
shards: FSDP over 3 ranks cuts the QKV rows 6 | 6 | 4, TP's colwise split and FSDP's strided shard
cut them again. Negative control: the split run differs from the same model stepped unsplit.
Run by hand: OPENBLAS_NUM_THREADS=1 mpirun -np 3 --oversubscribe python split_cases.py --cases fsdp3
Prints "CASE <name> OK" (rank 0) per passing case; any failure aborts the job (exit code != 0).
"""
from __future__ import annotations

import argparse
import copy
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
from dist_cases import grad_for, set_grads  # noqa: E402  (deterministic full gradients, distributed)
from harness import guarded, run_cases, say  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

MUON = dict(lr=0.02, weight_decay=0.1)
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
QKV_SPLIT = (8, 4, 4)   # q (2 heads of 4), k and v (1 head each): GQA's uneven blocks
HEADS = 4               # o-projection-like weight [8, 12]: 4 heads of 2 rows


class SplitNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 16, bias=False)    # fused [q | k | v], split_sizes
        self.wq = nn.Linear(12, 8, bias=False)     # per head, num_heads
        self.norm = nn.RMSNorm(4)


def groups(model, split=True, normuon=False, strategy=None):
    pin = {} if strategy is None else dict(strategy=strategy)
    qkv = dict(split_sizes=QKV_SPLIT) if split else {}
    heads = dict(num_heads=HEADS) if split else {}
    return [dict(params=[model.qkv.weight], normuon=normuon, **qkv, **pin, **MUON),
            dict(params=[model.wq.weight], **heads, **pin, **MUON),
            dict(params=[model.norm.weight], algorithm="adamw", **ADAMW)]




def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


def local_run(model, steps: int, **kw):
    """The single-process run (plain tensors, engine="local") of a copy of `model`."""
    model = copy.deepcopy(model)
    opt = dt.Muon(groups(model, **kw), engine="local", **MUON)
    assert opt.engine == "local"
    for s in range(steps):
        set_grads(model, s)
        opt.step()
    return model, opt


def train_and_compare(model, shard, what: str, normuon=False, strategy=None, steps=3):
    ref, ref_opt = local_run(model, steps, normuon=normuon)
    unsplit, _ = local_run(model, steps, split=False, normuon=normuon)
    shard(model)
    opt = dt.Muon(groups(model, normuon=normuon, strategy=strategy), **MUON)
    assert opt.engine == "distributed", opt.engine
    for s in range(steps):
        set_grads(model, s)
        opt.step()
    ref_params, unsplit_params = dict(ref.named_parameters()), dict(unsplit.named_parameters())
    for name in ("qkv.weight", "wq.weight"):
        p = dict(model.named_parameters())[name]
        got = full(p.detach())
        r = ref_params[name].detach()
        assert same(got, r), f"{what}: {name} differs from the 1-process run " \
                             f"(max diff {(got - r).abs().max().item():.3g})"
        # negative control: per-block orthogonalization is not the whole matrix's
        assert not same(got, unsplit_params[name].detach()), f"{what}: {name} equals the unsplit run"
        st, rst = opt.state[p], ref_opt.state[ref_params[name]]
        assert sorted(st) == sorted(rst), (name, sorted(st), sorted(rst))
        for key in st:
            if key != "step":
                assert same(full(st[key]), rst[key]), f"{what}: state {name}.{key} differs"
    plan = opt.plan().json
    say(f"  {what}: strategies {sorted({e['strategy'] for e in plan['entries']})}")
    blocks = {e["name"]: e.get("blocks") for e in plan["entries"]}
    assert any(b == list(QKV_SPLIT) for b in blocks.values()), blocks
    assert any(b == [2] * HEADS for b in blocks.values()), blocks


def fsdp(world):
    def shard(model):
        fully_shard(model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",)))
        if world == 3:  # the blocks straddle uneven shards: rows 6 | 6 | 4 of the QKV
            rows = model.qkv.weight._local_tensor.shape[0]
            assert rows == (4 if dist.get_rank() == 2 else 6), rows
    return shard


def case_fsdp3(world):
    for strategy in (None, "owner_a2a", "allgather", "agrs"):
        torch.manual_seed(11)
        train_and_compare(SplitNet(), fsdp(world), f"fsdp{world}/{strategy or 'cost'}", strategy=strategy)


def case_hsdp(world):
    def shard(model):
        fully_shard(model, mesh=init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard")))
    for strategy in (None, "allgather"):
        torch.manual_seed(12)
        train_and_compare(SplitNet(), shard, f"hsdp/{strategy or 'cost'}", normuon=True, strategy=strategy)


def case_tp(world):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def shard(model):
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"qkv": ColwiseParallel(), "wq": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
    torch.manual_seed(13)
    train_and_compare(SplitNet(), shard, "tp2xfsdp2", normuon=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    args = ap.parse_args()
    _, world = dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29511")))
    meshmuon.blas_set_num_threads(1)
    run_cases({"fsdp3": lambda: case_fsdp3(world), "hsdp": lambda: case_hsdp(world),
               "tp": lambda: case_tp(world)}, args.cases)


if __name__ == "__main__":
    guarded(main)
