"""Multi-rank cases of meshmuon.torch.Muon's distributed-engine options (issue 13), run under mpirun by
test_options_mpi.py: strategy pins (per parameter, per group, default) change `opt.plan()` and give
bitwise the same parameters as the cost model's plan; chunk_bytes / window change the chunks (plan
and step counters) and not the bits; replica split / duplicate on an HSDP mesh; machine; bad values
raise on every rank before any collective; last_step_stats (bytes equal the prediction), profiler
ranges and none_grad on DTensor parameters; offload_state bitwise as without.
Run by hand: OPENBLAS_NUM_THREADS=1 mpirun -np 2 --oversubscribe python options_cases.py --cases pins
Prints "CASE <name> OK" (rank 0) per passing case; any failure aborts the job (exit code != 0).
"""
from __future__ import annotations

import argparse
import os
import zlib

import torch
import torch.nn as nn

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
from harness import guarded, run_cases  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, distribute_tensor  # noqa: E402


class Net(nn.Module):
    """Matrices large enough that the cost model distributes them, and small ones (local)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 64)
        self.fc1 = nn.Linear(64, 96, bias=False)
        self.fc2 = nn.Linear(96, 64, bias=False)
        self.fc3 = nn.Linear(64, 64, bias=False)
        self.small = nn.Linear(64, 3, bias=False)
        self.norm = nn.LayerNorm(64)


def sharded(mesh) -> nn.Module:
    torch.manual_seed(7)
    model = Net()
    fully_shard(model, mesh=mesh)
    return model


def set_grads(model, step: int) -> None:
    for name, p in model.named_parameters():
        g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{step}".encode()))
        full = torch.randn(*p.shape, generator=g)
        p.grad = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None) \
            if isinstance(p, DTensor) else full


def train(mesh, steps=2, groups_kw=None, **kw):
    model = sharded(mesh)
    opt = dt.Muon(dt.param_groups(model, **(groups_kw or {})), lr=0.02, **kw)
    assert opt.engine == "distributed", opt.engine
    for s in range(steps):
        set_grads(model, s)
        opt.step()
    return model, opt


def fulls(model) -> dict:
    return {n: p.detach().full_tensor() for n, p in model.named_parameters()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.int32), b[k].view(torch.int32))
                                        for k in a)


def check_bytes(opt) -> None:
    stats = opt.last_step_stats
    assert stats["applied"] and stats["engine"] == "distributed", stats
    assert stats["bytes_sent"] == stats["bytes_sent_predicted"], stats
    assert stats["bytes_recv"] == stats["bytes_recv_predicted"], stats


def expect(fn, error, needle: str) -> None:
    try:
        fn()
    except error as e:
        assert needle in str(e), f"expected {needle!r} in {e}"
        return
    raise AssertionError(f"expected {error.__name__} with {needle!r}")


# ---- cases ---------------------------------------------------------------------------------------

def case_pins(world):
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    base_model, base = train(mesh)
    auto = base.plan()
    assert auto.world_size == world and set(auto.decisions.values()) <= {"cost", "fallback"}, auto.json
    assert auto.strategies["fc1.weight"] != "allgather", auto.strategies
    want = fulls(base_model)
    # default pin: every Muon parameter it can run
    model, opt = train(mesh, strategy={"default": "allgather"})
    plan = opt.plan()
    assert all(s == "allgather" for s in plan.strategies.values()), plan.strategies
    assert plan.decisions["fc1.weight"] == "pin", plan.decisions
    assert same(fulls(model), want), "allgather pins changed the bits"
    # another plan: allgather computes every matrix on every rank, owners once
    assert plan.json["per_rank"]["flops_mean"] > auto.json["per_rank"]["flops_mean"], \
        (auto.strategies, plan.json["per_rank"], auto.json["per_rank"])
    check_bytes(opt)
    # per parameter (a rule string, as MESHMUON_STRATEGY) over a default
    model, opt = train(mesh, strategy="fc2.*:agrs;default:owner_a2a")
    plan = opt.plan()
    assert plan.strategies["fc2.weight"] == "agrs" and plan.strategies["fc1.weight"] == "owner_a2a", \
        plan.strategies
    assert same(fulls(model), want)
    check_bytes(opt)
    # per group: the group key pins its parameters; a pattern rule of the constructor comes first
    model, opt = train(mesh, groups_kw=dict(muon=dict(strategy="allgather")),
                       strategy={"fc3.weight": "agrs"})
    plan = opt.plan()
    assert plan.strategies["fc1.weight"] == "allgather" and plan.strategies["fc3.weight"] == "agrs", \
        plan.strategies
    assert same(fulls(model), want)
    # a pin that cannot run a parameter: the same ValueError on every rank, naming it
    expect(lambda: dt.Muon(dt.param_groups(sharded(mesh)), strategy={"fc1.weight": "expert_local"}),
           ValueError, "fc1.weight")


def case_chunks(world):
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    base_model, base = train(mesh)
    assert base.plan().num_chunks == 1 and base.last_step_stats["chunks"] == 1
    want = fulls(base_model)
    for window in (1, 3):
        model, opt = train(mesh, chunk_bytes=8 << 10, window=window, timeout_s=60.0)
        plan = opt.plan()
        assert plan.num_chunks > 1 and plan.options["window"] == window, plan.options
        assert opt.last_step_stats["chunks"] == plan.num_chunks, opt.last_step_stats
        assert same(fulls(model), want), f"window {window} / small chunks changed the bits"
        check_bytes(opt)


def case_replica(world):
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("rep", "shard"))  # HSDP
    plans = {}
    for replica in ("duplicate", "split"):
        model, opt = train(mesh, replica=replica, strategy={"default": "owner_a2a"})
        plans[replica] = (opt.plan(), fulls(model))
        check_bytes(opt)
    dup, split = plans["duplicate"][0], plans["split"][0]
    assert dup.options["replica"] == "duplicate" and split.options["replica"] == "split"
    assert not any(e["replica_split"] for e in dup.json["entries"]), dup.json["entries"]
    assert all(e["replica_split"] for e in split.json["entries"]), split.json["entries"]
    assert same(plans["duplicate"][1], plans["split"][1])


def case_machine(world):
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    model = sharded(mesh)
    assert dt.Muon(dt.param_groups(model)).plan().options["machine"]["name"] == "cpu"
    plan = dt.Muon(dt.param_groups(model), machine="h100").plan()
    assert plan.options["machine"]["name"] == "h100"
    # bad values: the same error on every rank, raised before any collective (the job goes on)
    expect(lambda: dt.Muon(dt.param_groups(model), machine="tpu"), ValueError, "machine='tpu'")
    expect(lambda: dt.Muon(dt.param_groups(model), window=0), ValueError, "window=0")
    expect(lambda: dt.Muon(dt.param_groups(model), replica="both"), ValueError, "replica='both'")
    dist.barrier()


def case_stats(world):
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    model = sharded(mesh)
    opt = dt.Muon(dt.param_groups(model), lr=0.02, none_grad=True)
    set_grads(model, 0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    names = {e.name for e in prof.events()}
    assert {"meshmuon.step", "meshmuon.collect_grads", "meshmuon.engine", "meshmuon.write_back"} <= names, names
    assert all(p.grad is None for p in model.parameters())  # none_grad on DTensors
    stats = opt.last_step_stats
    for key in ("bytes_sent", "bytes_recv", "comm_wait_seconds", "orthogonalize_seconds", "overlap",
                "agree_seconds", "python_step_seconds", "engine_call_seconds", "bf16_native"):
        assert key in stats, key
    assert stats["bytes_sent"] > 0 and stats["agree_seconds"] > 0, stats
    check_bytes(opt)
    # the same results as without none_grad
    ref_model, _ = train(mesh, steps=1)
    assert same(fulls(model), fulls(ref_model))


def case_offload(world):
    # offload_state=True on FSDP2 DTensors: parameters and every state tensor bitwise as without,
    # with several chunks and windows 1 and 2; the counters say what moved
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))

    def state_of(model, opt) -> dict:
        out = {}
        for n, p in model.named_parameters():
            for k, t in opt.state[p].items():
                if k != "step":
                    out[f"{n}/{k}"] = t.full_tensor() if isinstance(t, DTensor) else t
        return out

    for window in (1, 2):
        kw = dict(chunk_bytes=8 << 10, window=window, steps=3, groups_kw=dict(muon=dict(normuon=True)))
        ref_model, ref = train(mesh, **kw)
        model, opt = train(mesh, offload_state=True, **kw)
        assert same(fulls(model), fulls(ref_model)), f"window {window}: offload changed the parameters"
        assert same(state_of(model, opt), state_of(ref_model, ref)), f"window {window}: offload changed the state"
        stats, off = opt.last_step_stats, ref.last_step_stats
        assert stats["offload_bytes_in"] > 0 and stats["offload_bytes_in"] == stats["offload_bytes_out"], stats
        assert 0 < stats["peak_state_resident_bytes"], stats
        assert off["offload_bytes_in"] == off["peak_state_resident_bytes"] == 0, off
        check_bytes(opt)
    expect(lambda: dt.Muon(dt.param_groups(sharded(mesh)), offload_state="yes"), ValueError, "offload_state")
    dist.barrier()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    args = ap.parse_args()
    _, world = dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29512")))
    meshmuon.blas_set_num_threads(1)
    cases = dict(pins=case_pins, chunks=case_chunks, replica=case_replica, machine=case_machine,
                 stats=case_stats, offload=case_offload)
    run_cases({name: (lambda f=f: f(world)) for name, f in cases.items()}, args.cases)


if __name__ == "__main__":
    guarded(main)
