"""Multi-rank cases of owner placement's misuses (meshmuon.torch.own with FSDP2; _owned_checks.py), run
under torchrun by test_owner_edges.py. Each mistake a user made raises the same ValueError / TypeError on
every rank, naming the parameters and what to do, before any collective can mismatch:

- after_fully_shard: own() called after fully_shard (its matrices already DTensors): select "owner",
  "auto" and a name list all name the sharded matrices and say to call own() first; the model is
  left as it was.
- mesh_list: own(mesh=[...]) (a list, not a DeviceMesh) names the argument and what to pass.
- also_sharded_forward / _sequential: an owned matrix also handed to fully_shard (ignored_params
  forgotten), then a forward: raised at the first forward, before FSDP2's all-gather (a GPT-like
  model whose blocks are sharded: gloo aborted; a 2-layer nn.Sequential sharded at its root: hung).
- also_sharded_optimizer: the same mistake, the optimizer built before any forward: Muon() names it.
Prints "CASE <name> OK" (rank 0) per passing case; any failure aborts the job (exit code != 0).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
from harness import expect_same_error, guarded, run_cases  # noqa: E402
from owner_cases import Net, groups, loss_of, rank, same  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

BLOCK_MATRICES = [f"blocks.{b}.{m}.weight" for b in (0, 1) for m in ("wq", "wo", "up", "down")]


def mesh_of(world):
    return init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))


def sharded_net(mesh, ignored=None):
    torch.manual_seed(1)
    model = Net()
    for b in model.blocks:
        fully_shard(b, mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    return model


def case_after_fully_shard(world):
    mesh = mesh_of(world)
    model = sharded_net(mesh)
    before = {n: type(p).__name__ for n, p in model.named_parameters()}
    for select in ("owner", "auto"):
        msg = expect_same_error(lambda: dt.own(model, mesh, select=select), ValueError,
                                "before fully_shard", "ignored_params=placement.params", "blocks.0.wq.weight")
        assert "DTensor" in msg, msg
    expect_same_error(lambda: dt.own(model, mesh, select=["blocks.1.up.weight"]), ValueError,
                      "before fully_shard", "blocks.1.up.weight")
    assert {n: type(p).__name__ for n, p in model.named_parameters()} == before
    # the right order on the same model class works (negative control of the check)
    torch.manual_seed(1)
    fresh = Net()
    placement = dt.own(fresh, mesh, select="owner")
    assert sorted(placement.names) == sorted(BLOCK_MATRICES), placement.names


def case_mesh_list(world):
    torch.manual_seed(1)
    model = Net()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    msg = expect_same_error(lambda: dt.own(model, mesh=list(range(world)), select="owner"), TypeError,
                            "own(mesh=...)", "DeviceMesh", "list")
    assert "init_device_mesh" in msg, msg
    assert all(same(p.detach(), before[n]) for n, p in model.named_parameters())


def sequential():
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(8, 12, bias=False), nn.Linear(12, 8, bias=False))


def case_also_sharded_forward(world):
    mesh = mesh_of(world)
    torch.manual_seed(1)
    model = Net()
    dt.own(model, mesh, select="owner")
    for b in model.blocks:  # ignored_params=placement.params forgotten
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    expect_same_error(lambda: loss_of(model, 0, 0, rank()), ValueError, "also sharded by fully_shard",
                      "blocks.0.wq.weight", "ignored_params=placement.params")


def case_also_sharded_sequential(world):
    """The 2-layer nn.Sequential sharded at its root: its forward hung before the check."""
    mesh = mesh_of(world)
    seq = sequential()
    dt.own(seq, mesh, select="owner")
    fully_shard(seq, mesh=mesh)
    expect_same_error(lambda: seq(torch.randn(3, 8)), ValueError, "also sharded by fully_shard",
                      "0.weight", "1.weight", "ignored_params=placement.params")
    # with ignored_params the same forward runs (negative control of the check)
    seq = sequential()
    placement = dt.own(seq, mesh, select="owner")
    fully_shard(seq, mesh=mesh, ignored_params=placement.params)
    seq(torch.randn(3, 8)).sum().backward()


def case_also_sharded_optimizer(world):
    mesh = mesh_of(world)
    torch.manual_seed(1)
    model = Net()
    dt.own(model, mesh, select="owner")
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    expect_same_error(lambda: dt.Muon(groups(model), lr=0.02), ValueError, "also sharded by fully_shard",
                      "blocks.0.wq.weight", "ignored_params=placement.params")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    args = ap.parse_args()
    _, world = dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29512")))
    meshmuon.blas_set_num_threads(1)
    cases = {
        "after_fully_shard": lambda: case_after_fully_shard(world),
        "mesh_list": lambda: case_mesh_list(world),
        "also_sharded_forward": lambda: case_also_sharded_forward(world),
        "also_sharded_sequential": lambda: case_also_sharded_sequential(world),
        "also_sharded_optimizer": lambda: case_also_sharded_optimizer(world),
    }
    run_cases(cases, args.cases)


if __name__ == "__main__":
    guarded(main)
