"""Multi-rank cases of meshmuon.torch.Muon on DTensors (and plain tensors), run under mpirun by test_dist.py and under
torchrun by test_torchrun.py (the c10d communicator; --comm picks one) (one launch per
world size runs several cases). Each case steps a sharded model with deterministic gradients and
compares parameters and state (full tensors) BITWISE with the single-process meshmuon run of the same
model; it also checks that the engine's local box is the DTensor's local shard (values and offsets).
Run by hand: OPENBLAS_NUM_THREADS=1 mpirun -np 4 --oversubscribe python dist_cases.py --cases fsdp
Prints "CASE <name> OK" (rank 0) per passing case; any failure aborts the job (exit code != 0).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import zlib

import torch
import torch.nn as nn

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
from harness import expect_same_error, guarded, run_cases, say  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,  # noqa: E402
                                      distribute_tensor)
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: E402

MUON = dict(lr=0.02, weight_decay=0.1)
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)


class Net(nn.Module):
    """Embedding + head (AdamW), matrices with uneven and empty shards (Muon), an expert stack
    [3, 6, 5] (3 experts on 4 ranks: one rank holds none), a norm and biases (AdamW)."""

    def __init__(self, d_in=8, d_hidden=13, d_out=3, vocab=11):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_in)
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.norm = nn.LayerNorm(d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out, bias=False)
        self.experts = nn.Parameter(torch.randn(3, 6, 5) * 0.3)
        self.lm_head = nn.Linear(d_in, vocab, bias=False)


def rank() -> int:
    return dist.get_rank()


def groups(model, normuon=False):
    return dt.param_groups(model, muon=dict(MUON, normuon=normuon), adamw=ADAMW)


def grad_for(name: str, shape, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{step}".encode()))
    return torch.randn(*shape, generator=g)


def set_grads(model, step: int) -> None:
    for name, p in model.named_parameters():
        full = grad_for(name, p.shape, step)
        if isinstance(p, DTensor):
            p.grad = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
        else:
            p.grad = full


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


class Reference:
    """The single-process meshmuon run (plain tensors, meshmuon.LocalOptimizer) of a model. Under mpirun
    plain tensors would go to the distributed engine: engine="local" keeps this run local."""

    def __init__(self, model, normuon=False):
        self.model = copy.deepcopy(model)
        self.opt = dt.Muon(groups(self.model, normuon), engine="local", **MUON)
        assert self.opt.engine == "local"
        self.steps = 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            set_grads(self.model, self.steps)
            self.opt.step()
            self.steps += 1


def check_boxes(model, opt) -> None:
    """The engine's local box of each DTensor parameter holds exactly the DTensor's local values
    (and, without _StridedShard, the offsets torch computes)."""
    engine = opt._engine
    index = {id(p): i for i, p in enumerate(engine.params)}
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor):
            continue
        box = engine.core.local_box(index[id(p)])
        whole = p.full_tensor()
        idx = [torch.cat([torch.arange(b, e) for b, e in dim]) if dim else torch.zeros(0, dtype=torch.long)
               for dim in box]
        want = whole[torch.meshgrid(*idx, indexing="ij")] if all(len(i) for i in idx) else \
            whole.new_zeros([len(i) for i in idx])
        assert same(want, p._local_tensor), f"{name}: box {box} is not the local shard"
        if all(type(pl) in (Shard, Replicate) for pl in p.placements):
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
            assert list(shape) == [sum(e - b for b, e in d) for d in box], (name, shape, box)
            for d, off in zip(box, offset):
                if d:
                    assert d[0][0] == off, (name, offset, box)


def compare(model, opt, ref: Reference, what: str, before=None) -> None:
    ref_params = dict(ref.model.named_parameters())
    for name, p in model.named_parameters():
        r = ref_params[name]
        got = full(p.detach())
        assert same(got, r.detach()), f"{what}: parameter {name} differs from the 1-process run " \
                                      f"(max diff {(got - r).abs().max().item():.3g})"
        if before is not None:  # negative control: one step fewer must differ
            assert not same(got, before[name]), f"{what}: {name} equals the earlier reference"
        st, rst = opt.state[p], ref.opt.state[r]
        assert sorted(st) == sorted(rst), (name, sorted(st), sorted(rst))
        for key in st:
            if key == "step":
                assert float(st[key]) == float(rst[key]), (name, st[key], rst[key])
                continue
            assert isinstance(st[key], DTensor) == isinstance(p, DTensor), (name, key)
            if isinstance(p, DTensor):
                assert st[key].placements == p.placements, (name, key, st[key].placements)
            assert same(full(st[key]), rst[key]), f"{what}: state {name}.{key} differs"


def train_and_compare(model, what: str, ref: Reference, steps=3, normuon=False):
    opt = dt.Muon(groups(model, normuon), **MUON)
    assert opt.engine == "distributed", opt.engine
    check_boxes(model, opt)
    # zero-copy: the engine's state aliases the DTensors' local tensors, stable across steps
    ptrs = {(id(p), k): v._local_tensor.data_ptr() for p, s in opt.state.items()
            for k, v in s.items() if isinstance(v, DTensor) and v._local_tensor.numel()}
    for s in range(steps):
        set_grads(model, s)
        opt.step()
    ref.run(steps - 1)
    before = {n: p.detach().clone() for n, p in ref.model.named_parameters()}
    ref.run(1)
    compare(model, opt, ref, what, before)
    assert ptrs == {(id(p), k): v._local_tensor.data_ptr() for p, s in opt.state.items()
                    for k, v in s.items() if isinstance(v, DTensor) and v._local_tensor.numel()}
    stats = opt.last_step_stats
    assert stats["applied"] and stats["step_seconds"] > 0, stats
    return opt, ref


# ---- cases ---------------------------------------------------------------------------------------

def case_fsdp(world):
    torch.manual_seed(1)
    model = Net()
    ref = Reference(model)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    fully_shard(model, mesh=mesh)
    sizes = [tuple(p._local_tensor.shape) for p in model.parameters()]
    if world == 4 and rank() == 3:  # uneven and empty shards are exercised
        assert (0, 13) in sizes and (0, 6, 5) in sizes, sizes
    train_and_compare(model, f"fsdp{world}", ref=ref)


def case_hsdp(world):
    torch.manual_seed(2)
    model = Net()
    ref = Reference(model, normuon=True)
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard"))
    fully_shard(model, mesh=mesh)
    assert model.fc1.weight.placements == (Replicate(), Shard(0)), model.fc1.weight.placements
    train_and_compare(model, "hsdp", normuon=True, ref=ref)


class TpNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.w_in = nn.Linear(8, 16, bias=False)   # colwise
        self.w_out = nn.Linear(16, 8, bias=False)  # rowwise
        self.norm = nn.RMSNorm(8)


def case_tp(world):
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(3)
    model = TpNet()
    ref = Reference(model)
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"w_in": ColwiseParallel(), "w_out": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    kinds = {type(pl).__name__ for p in model.parameters() for pl in p.placements}
    say(f"  tp placements: w_in {model.w_in.weight.placements}, w_out {model.w_out.weight.placements}")
    assert "_StridedShard" in kinds or "StridedShard" in kinds, kinds
    train_and_compare(model, "tp", ref=ref)


class MoeNet(nn.Module):
    """torchtitan-style: dense weights FSDP on the dense mesh; experts [E, out, in] Shard(0) on ep,
    FSDP on efsdp over dim 1 (efsdp·ep > E); a plain (replicated) gain beside them."""

    def __init__(self, dense_mesh, expert_mesh):
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.w = nn.Parameter(distribute_tensor(torch.randn(10, 7, generator=g), dense_mesh,
                                                [Shard(0)], src_data_rank=None))
        self.experts = nn.Parameter(distribute_tensor(torch.randn(2, 9, 6, generator=g), expert_mesh,
                                                      [Shard(1), Shard(0)], src_data_rank=None))
        self.gain = nn.Parameter(torch.randn(7, generator=g))


def case_ep(world):
    dense = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    expert = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("efsdp", "ep"))
    model = MoeNet(dense, expert)
    ref_model = nn.Module()
    ref_model.w = nn.Parameter(model.w.full_tensor())
    ref_model.experts = nn.Parameter(model.experts.full_tensor())
    ref_model.gain = nn.Parameter(model.gain.detach().clone())
    train_and_compare(model, "ep", ref=Reference(ref_model))


def case_plain(world):
    """Plain tensors (no DTensor) after init_distributed(): the distributed engine, Replicate on a
    1-D world mesh, identical gradients on every rank; bitwise the single-process run, and the step
    is agreed (a differing lr raises on every rank). The work is split: the planner gives each matrix
    one owner among the replicas (owner_a2a with replica split, the cpu cost model) and scatters the
    result, so results move between ranks instead of every rank orthogonalizing every matrix."""
    torch.manual_seed(6)
    model = Net()
    ref = Reference(model, normuon=True)
    opt, _ = train_and_compare(model, "plain", normuon=True, ref=ref)
    assert all(not isinstance(v, DTensor) for s in opt.state.values() for v in s.values())
    plan = json.loads(opt._engine.core.plan_json())
    entries = {e["name"]: e for e in plan["entries"]}
    assert sorted(entries) == ["experts", "fc1.weight", "fc2.weight"], sorted(entries)
    for name, e in entries.items():
        assert e["placements"] == "R" and e["replica_dims"] == "world", (name, e)
    # matrices worth splitting on the cpu cost model (the tiny ones above are cheaper duplicated):
    # each has one owner among the replicas, the others receive its result; bitwise as one process
    torch.manual_seed(7)
    big = nn.Sequential(nn.Linear(256, 256, bias=False), nn.Linear(256, 192, bias=False),
                        nn.Linear(192, 320, bias=False))
    big_opt, _ = train_and_compare(big, "plain-split", ref=Reference(big))
    entries = {e["name"]: e for e in json.loads(big_opt._engine.core.plan_json())["entries"]}
    for name, e in entries.items():
        assert e["strategy"] == "owner_a2a" and e["replica_split"], (name, e)
    stats = big_opt.last_step_stats
    assert stats["bytes_sent"] == stats["bytes_sent_predicted"], stats
    # measured per-rank work: every rank receives results it did not compute (the owners')
    assert stats["bytes_recv"] > 0 and stats["bytes_recv"] == stats["bytes_recv_predicted"], stats
    # negative control: the same model with engine="local" is the local engine (no agreement)
    assert dt.Muon(groups(copy.deepcopy(model)), engine="local", **MUON).engine == "local"
    others = ", ".join(str(r) for r in range(world) if r != 1)
    others = ("rank " if world == 2 else "ranks ") + others
    set_grads(model, 3)
    if rank() == 1:
        opt.param_groups[0]["lr"] = 0.03
    before = model.fc1.weight.detach().clone()
    expect_same_error(opt.step, meshmuon.MeshmuonError,
                      "group 0 option 'lr' is 0.02 on " + others + "; 0.03 on rank 1")
    assert same(model.fc1.weight.detach(), before)


def _dcp_models(world, mesh_shape, names):
    torch.manual_seed(5)
    model = Net()
    ref = Reference(model)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    fully_shard(model, mesh=mesh)
    return model, ref


def case_dcp_save(world, ckpt):
    """FSDP at `world` ranks: 2 steps, save with DCP (get_state_dict conventions)."""
    model, ref = _dcp_models(world, (world,), ("fsdp",))
    opt = dt.Muon(groups(model), **MUON)
    for s in range(2):
        set_grads(model, s)
        opt.step()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
    ref.run(2)
    compare(model, opt, ref, "dcp-save")


def case_dcp_load(world, ckpt, mesh_shape, names, what):
    """Loads the checkpoint into a fresh model + optimizer on another layout (FSDP at another world
    size, or HSDP), continues 2 steps: bitwise the uninterrupted single-process run of 4 steps."""
    model, ref = _dcp_models(world, mesh_shape, names)
    with torch.no_grad():  # make sure the values really come from the checkpoint
        for p in model.parameters():
            p.mul_(0.5)
    opt = dt.Muon(groups(model), **MUON)
    ptrs = [v._local_tensor.data_ptr() for s in opt.state.values() for v in s.values()
            if isinstance(v, DTensor) and v._local_tensor.numel()]
    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    assert ptrs == [v._local_tensor.data_ptr() for s in opt.state.values() for v in s.values()
                    if isinstance(v, DTensor) and v._local_tensor.numel()]
    for s in range(2, 4):
        set_grads(model, s)
        opt.step()
    ref.run(3)
    before = {n: p.detach().clone() for n, p in ref.model.named_parameters()}
    ref.run(1)
    compare(model, opt, ref, what, before)


def case_bad_input(world):
    """Unsupported placement, non-contiguous local shard, non-row-major mesh: ValueError before
    anything runs (parameters unchanged)."""
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    x = torch.randn(6, 4)
    cases = {
        "Partial": DTensor.from_local(x.clone(), mesh, [Partial()]),
        "contiguous": DTensor.from_local(torch.randn(4, 6).t(), mesh, [Replicate()]),
        "row-major": DTensor.from_local(x.clone(), DeviceMesh("cpu", list(range(world))[::-1]),
                                        [Replicate()]),
    }
    for needle, dtensor in cases.items():
        p = nn.Parameter(dtensor)
        before = p._local_tensor.clone()
        try:
            dt.Muon([dict(params=[p])])
        except ValueError as e:
            assert needle in str(e), (needle, str(e))
        else:
            raise AssertionError(f"no ValueError for {needle}")
        assert same(before, p._local_tensor)


def case_agreement(world):
    """Issue 10: per-step agreement. Each case used to diverge silently (or hang a step later)."""
    others = ", ".join(str(r) for r in range(world) if r != 1)
    others = ("rank " if world == 2 else "ranks ") + others
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    lin = nn.Linear(4, 8, bias=False)  # one 8x4 weight under FSDP2
    fully_shard(lin, mesh=mesh)
    w = lin.weight
    opt = dt.Muon([dict(params=[("w", w)], lr=0.02)])

    def grads():
        w.grad = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)], src_data_rank=None)

    def unchanged(step_before, value_before):
        assert same(w._local_tensor, value_before)
        assert int(opt.state[w]["step"].item()) == step_before

    # 1. only rank 1 calls zero_grad(set_to_none=True) before step(): it still takes part
    grads()
    if rank() == 1:
        opt.zero_grad(set_to_none=True)
    before = w._local_tensor.clone()
    expect_same_error(opt.step, meshmuon.MeshmuonError,
                      "parameter 'w' has no gradient on rank 1 but has one on " + others)
    unchanged(0, before)
    grads()
    opt.step()  # the ranks are still in step: the next step works
    assert int(opt.state[w]["step"].item()) == 1
    # 2. lr differs on one rank
    grads()
    if rank() == 1:
        opt.param_groups[0]["lr"] = 0.03
    before = w._local_tensor.clone()
    expect_same_error(opt.step, meshmuon.MeshmuonError,
                      "group 0 option 'lr' is 0.02 on " + others + "; 0.03 on rank 1")
    unchanged(1, before)
    opt.param_groups[0]["lr"] = 0.02
    # 3. no gradient anywhere: a step on every rank that changes nothing (and is still collective)
    opt.zero_grad(set_to_none=True)
    opt.step()
    unchanged(1, before)
    # 4. one parameter's grad None on one rank only (two parameters)
    lin2 = nn.Linear(4, 6, bias=False)
    fully_shard(lin2, mesh=mesh)
    opt2 = dt.Muon([dict(params=[("a", w), ("b", lin2.weight)], lr=0.02)])
    grads()
    lin2.weight.grad = None if rank() == 1 else distribute_tensor(torch.ones(6, 4), mesh, [Shard(0)],
                                                                 src_data_rank=None)
    before = w._local_tensor.clone()
    expect_same_error(opt2.step, meshmuon.MeshmuonError,
                      "parameter 'b' has no gradient on rank 1 but has one on " + others)
    assert same(w._local_tensor, before)
    # 5. non_finite policy differs: refused at construction, before any step
    expect_same_error(lambda: dt.Muon([dict(params=[("w", w)])],
                                      non_finite="skip" if rank() == 1 else "raise"),
                      meshmuon.MeshmuonError, "non_finite raise on " + others + "; ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--comm", choices=("mpi", "c10d"), default=None,
                    help="the engine's communicator (default: mpi under mpirun, c10d under torchrun)")
    args = ap.parse_args()
    rank_, world = dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29511")),
                                       comm=args.comm)
    meshmuon.blas_set_num_threads(1)
    say(f"COMM {dt._comms.communicator(world, 'cpu').backend}")
    cases = {
        "fsdp": lambda: case_fsdp(world), "hsdp": lambda: case_hsdp(world),
        "tp": lambda: case_tp(world), "ep": lambda: case_ep(world),
        "bad_input": lambda: case_bad_input(world), "agreement": lambda: case_agreement(world),
        "plain": lambda: case_plain(world), "dcp_save": lambda: case_dcp_save(world, args.ckpt),
        "dcp_load_fsdp": lambda: case_dcp_load(world, args.ckpt, (world,), ("fsdp",),
                                               "dcp-load-fsdp"),
        "dcp_load_hsdp": lambda: case_dcp_load(world, args.ckpt, (2, world // 2), ("rep", "shard"),
                                               "dcp-load-hsdp"),
    }
    run_cases(cases, args.cases)


if __name__ == "__main__":
    guarded(main)
