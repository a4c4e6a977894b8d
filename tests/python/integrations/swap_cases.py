"""Accelerate's FSDP2 parameter swap under meshmuon.torch.Muon (rank side; test_accelerate_swap.py
launches it with torchrun on 2 CPU ranks, gloo). accelerate 1.15's prepare() builds nothing new: it
replaces every tensor in the optimizer's param_groups by a 1-element placeholder that remembers the
original's data_ptr, shards the model (fully_shard of each layer, then the root), and rewrites each
group's "params" in place with the sharded DTensor of the same name (read in its
accelerator._prepare_fsdp2 and utils/fsdp_utils.fsdp2_switch_optimizer_parameters; done here the
same way, without accelerate). Cases:
- fresh: Muon built on the plain model, swapped, 3 forward/backward steps: parameters and state
  BITWISE those of Muon built directly on the same FSDP2 model; they moved from the initial values.
- resume: swapped, then a checkpoint loaded before any step (a Trainer resuming): one more step
  BITWISE the optimizer the checkpoint came from.
- carried: 2 steps on the plain model (replicated), swapped, 2 more: BITWISE the one-process run of
  4 steps (state carried by position; one step fewer differs: negative control).
- mismatch: swapped for parameters of other shapes: the same ValueError on every rank naming the
  group and parameter, nothing stepped.
Run by hand: torchrun --nproc-per-node 2 swap_cases.py --cases fresh,resume,carried,mismatch
"""
from __future__ import annotations

import argparse
import copy
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

import meshmuon.torch as mt  # noqa: E402
from harness import expect_same_error, guarded, run_cases  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, distribute_tensor  # noqa: E402

MUON = dict(lr=0.02, weight_decay=0.1)
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
VOCAB = 11


class Block(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)              # 13 rows on 2 ranks: uneven shards
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return x + self.down(F.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d: int = 8, h: int = 13):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList([Block(d, h), Block(d, h)])
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def shard(model: nn.Module) -> nn.Module:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def accelerate_swap(model: nn.Module, opt: torch.optim.Optimizer) -> nn.Module:
    """accelerate's prepare() on a model whose optimizer exists: placeholders keyed by data_ptr,
    fully_shard, then every group's params rewritten in place with the sharded parameters."""
    ptr_of_name = {name: p.data_ptr() for name, p in model.named_parameters()}
    for group in opt.param_groups:
        for i, p in enumerate(group["params"]):
            holder = torch.empty(1, dtype=p.dtype, device=p.device)
            holder.data_ptr = p.data_ptr()  # an int where the method was, as accelerate does
            group["params"][i] = holder
    shard(model)
    new = dict(model.named_parameters())
    by_ptr = {ptr: new[name] for name, ptr in ptr_of_name.items()}
    for group in opt.param_groups:
        group["params"] = [by_ptr[p.data_ptr] for p in group["params"]]
    return model


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)  # the same batch on every rank
    tokens = torch.randint(0, VOCAB, (4, 6), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def train(model, opt, steps: int) -> list[float]:
    losses = []
    for s in range(steps):
        tokens, targets = batch(s)
        loss = F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


def compare(model, opt, ref_model, ref_opt, what: str) -> None:
    ref = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        r = ref[name]
        assert same(full(p), full(r)), f"{what}: {name} differs (max " \
                                       f"{(full(p) - full(r)).abs().max().item():.3g})"
        st, rst = opt.state[p], ref_opt.state[r]
        assert sorted(st) == sorted(rst) and st, (what, name, sorted(st), sorted(rst))
        for key in st:
            assert same(full(st[key]), full(rst[key])), f"{what}: state {name}.{key} differs"
            if isinstance(p, DTensor) and key != "step":
                assert st[key].placements == p.placements, (name, key, st[key].placements)


def groups(model):
    return mt.param_groups(model, muon=MUON, adamw=ADAMW)


def case_fresh():
    torch.manual_seed(1)
    plain = Net()
    direct = shard(copy.deepcopy(plain))
    initial = {n: p.detach().clone() for n, p in plain.named_parameters()}
    opt = mt.Muon(groups(plain), **MUON)  # built before prepare(), as Trainer / accelerate users do
    model = accelerate_swap(plain, opt)
    assert opt.engine_builds == 1
    ref_opt = mt.Muon(groups(direct), **MUON)
    losses, ref_losses = train(model, opt, 3), train(direct, ref_opt, 3)
    moved = [n for n, p in model.named_parameters() if not same(full(p), initial[n])]
    assert len(moved) == len(initial), f"parameters that did not move: {set(initial) - set(moved)}"
    assert losses == ref_losses, (losses, ref_losses)
    compare(model, opt, direct, ref_opt, "fresh")
    assert opt.engine_builds == 2 and opt.engine == "distributed", (opt.engine_builds, opt.engine)
    assert set(map(id, opt.state)) == {id(p) for p in model.parameters()}  # no stale entries


def case_resume():
    """A Trainer resuming: the optimizer built, prepare() swaps, then the checkpoint is loaded
    before any step: load_state_dict notices the swap first."""
    torch.manual_seed(4)
    plain = Net()
    direct = shard(copy.deepcopy(plain))
    ref_opt = mt.Muon(groups(direct), **MUON)
    train(direct, ref_opt, 2)
    saved = copy.deepcopy(ref_opt.state_dict())
    opt = mt.Muon(groups(plain), **MUON)
    model = accelerate_swap(plain, opt)
    with torch.no_grad():
        for p, r in zip(model.parameters(), direct.parameters()):
            p.to_local().copy_(r.to_local())
    opt.load_state_dict(saved)
    assert opt.engine_builds == 2, opt.engine_builds
    assert len(opt.state_dict()["state"]) == sum(1 for _ in model.parameters())
    train(model, opt, 1)
    train(direct, ref_opt, 1)
    compare(model, opt, direct, ref_opt, "resume")


def grad_for(name: str, shape, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{step}".encode()))
    return torch.randn(*shape, generator=g)


def set_grads(model, step: int) -> None:
    for name, p in model.named_parameters():
        g = grad_for(name, p.shape, step)
        p.grad = distribute_tensor(g, p.device_mesh, p.placements, src_data_rank=None) \
            if isinstance(p, DTensor) else g


def case_carried():
    torch.manual_seed(2)
    model = Net()
    ref_model = copy.deepcopy(model)
    ref_opt = mt.Muon(groups(ref_model), engine="local", **MUON)  # the one-process run
    opt = mt.Muon(groups(model), **MUON)
    for s in range(2):  # replicated plain tensors, then the swap with state in place
        set_grads(model, s)
        opt.step()
    accelerate_swap(model, opt)
    for s in range(2, 4):
        set_grads(model, s)
        opt.step()
    for s in range(3):
        set_grads(ref_model, s)
        ref_opt.step()
    earlier = {n: p.detach().clone() for n, p in ref_model.named_parameters()}
    set_grads(ref_model, 3)
    ref_opt.step()
    compare(model, opt, ref_model, ref_opt, "carried")
    for name, p in model.named_parameters():  # negative control: one step fewer differs
        assert not same(full(p), earlier[name]), f"carried: {name} equals the 3-step run"
    assert all(float(s["step"]) == 4.0 for s in opt.state.values())


def case_mismatch():
    torch.manual_seed(3)
    model = Net()
    opt = mt.Muon(groups(model), **MUON)
    other = shard(Net(h=10))  # same names, other shapes for up / down
    new = dict(other.named_parameters())
    for group in opt.param_groups:
        group["params"] = [new[name] for name in group["param_names"]]
    set_grads(other, 0)
    before = {n: full(p).clone() for n, p in other.named_parameters()}
    expect_same_error(opt.step, ValueError, "param group 0, parameter 0 'layers.0.up.weight'",
                      "global shape (10, 8) where the original had (13, 8)",
                      "build the optimizer on the model as it will be trained")
    assert opt.engine_builds == 1
    for n, p in other.named_parameters():
        assert same(full(p), before[n]), f"mismatch: {n} changed"
    for group in opt.param_groups:  # a group that lost a parameter cannot be matched either
        group["params"] = group["params"][:-1]
        break
    expect_same_error(opt.step, ValueError, "param group 0 holds 3 parameters but 4")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")  # as accelerate does; meshmuon makes its c10d communicator
    cases = {"fresh": case_fresh, "resume": case_resume, "carried": case_carried,
             "mismatch": case_mismatch}
    run_cases(cases, args.cases)


if __name__ == "__main__":
    guarded(main)
