"""A digest of meshmuon.torch's results (parameters and optimizer state after a few steps) over the
adapter's layouts, to compare before and after a refactor that must not change a bit.

    torchrun --nproc-per-node 3 tools/probe/bitwise_probe.py > after.txt   (also runs at 1 rank)

Cases: plain fp32 (local core; distributed core at several ranks), bf16 parameters (fp32 masters),
NorMuon, split heads, FSDP2 Shard(0) on uneven shards (DTensor), ZeRO with reduce_grads, owner
placement (meshmuon.torch.own) beside FSDP2. Rank 0 prints one line per case: its name and the
SHA-256 of every parameter's and state tensor's full value in order. Gradients are deterministic
functions of the step (no data), the same on every rank.
"""
import hashlib
import os
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn

torch.set_num_threads(1)
import meshmuon.torch as dt  # noqa: E402


def full(t):
    return t.full_tensor() if type(t).__name__ == "DTensor" else t


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        t = full(t).detach().cpu().contiguous().reshape(-1)
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def grad(shape, name, step):
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{step}".encode()))
    return torch.randn(shape, generator=g)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 24, bias=True), nn.Linear(24, 22, bias=False),
                         nn.Linear(22, 12, bias=False))


def run(name, m, opt, steps=3, via_backward=False):
    params = dict(m.named_parameters())
    for s in range(steps):
        if via_backward:  # owner placement: gradients through its hooks
            x = grad((5, 12), "x", s)
            m(x).square().sum().backward()
        else:
            for n, p in params.items():
                g = grad(tuple(p.shape), n, s).to(p.dtype)
                if type(p).__name__ == "DTensor":
                    from torch.distributed.tensor import distribute_tensor
                    g = distribute_tensor(g, p.device_mesh, p.placements)
                p.grad = g
        opt.step()
        opt.zero_grad()
    sd = opt.state_dict()
    state = [v for k in sorted(sd["state"]) for _, v in sorted(sd["state"][k].items())
             if isinstance(v, torch.Tensor)]
    owned = [p for p in params.values() if p.numel() or type(p).__name__ == "DTensor"]
    line = f"{name}: params {digest(owned)} state {digest(state)}"
    if dist.is_initialized() and dist.get_world_size() > 1:
        lines = [None] * dist.get_world_size()
        dist.all_gather_object(lines, line)
        line = " | ".join(lines)
    if int(os.environ.get("RANK", "0")) == 0:
        print(line, flush=True)


def groups(m, **muon):
    return dt.param_groups(m, muon=dict(lr=0.02, **muon), adamw=dict(lr=3e-3))


def main():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dt.init_distributed()
    m = model()
    run("plain_fp32", m, dt.Muon(groups(m)))
    m = model().to(torch.bfloat16)
    run("bf16_masters", m, dt.Muon(groups(m)))
    m = model()
    run("normuon", m, dt.Muon(groups(m, normuon=True)))
    m = model()
    run("split_heads", m, dt.Muon(groups(m, num_heads=2)))
    if world == 1:
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    m = model()
    for layer in m:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    run("fsdp_uneven", m, dt.Muon(groups(m)))
    m = model()
    run("zero_reduce_grads", m, dt.Muon(groups(m), zero=True, reduce_grads="mean"))
    m = model()
    placement = dt.own(m, mesh, select="owner")
    fully_shard(m, mesh=mesh, ignored_params=placement.params)
    run("owner_fsdp", m, dt.Muon(groups(m)), via_backward=True)


if __name__ == "__main__":
    main()
