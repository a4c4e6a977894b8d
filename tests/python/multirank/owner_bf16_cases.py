"""bf16 parameters under owner placement (meshmuon.torch.own), run under torchrun by test_owner_bf16.py:
each owned bf16 matrix steps through an fp32 master in its Owned(k) layout (the layout model's, decision
059: whole on its owner, [0, cols] elsewhere), BITWISE the one-process step of that matrix given the
same (reduced) gradient; a rank that does not own a matrix holds a [0, cols] master. Before the one
layout model this raised "ranks disagree on the parameters" (the masters lost the Owned layout)."""
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
import torch.distributed as dist  # noqa: E402
from harness import guarded, run_cases  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402


def one_process_step(p0, grad, lr):
    q = nn.Parameter(p0.clone())
    opt = dt.Muon([dict(params=[q], lr=lr)], engine="local")
    q.grad = grad.clone()
    opt.step()
    return q.detach()


def case_bf16_owned(world):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.Linear(32, 24, bias=False),
                          nn.Linear(24, 16, bias=False)).to(torch.bfloat16)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    mesh = init_device_mesh("cpu", (world,))
    placement = dt.own(model, mesh, select="owner")
    fully_shard(model, mesh=mesh, ignored_params=placement.params)
    lr = 0.02
    opt = dt.Muon(dt.param_groups(model, muon=dict(lr=lr)))
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1 + rank)).to(torch.bfloat16)
    model(x).float().square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    owned_here = 0
    for n, p in model.named_parameters():
        master = opt.state[p]["master"]
        assert master.dtype == torch.float32 and master.shape == p.shape, (n, master.shape, p.shape)
        if placement.owner(n) != rank:
            assert p.shape[0] == 0, f"{n}: a non-owner holds {tuple(p.shape)}"
            continue
        owned_here += 1
        want = one_process_step(start[n], grads[n], lr)
        assert torch.equal(p.detach(), want), f"{n}: not the one-process step"
        noise = torch.randn(grads[n].shape, generator=torch.Generator().manual_seed(7)) * grads[n].abs().mean()
        other = one_process_step(start[n], (grads[n].float() + noise).to(grads[n].dtype), lr)  # negative control
        assert not torch.equal(p.detach(), other), f"{n}: the check cannot tell gradients apart"
    counts = [None] * world
    dist.all_gather_object(counts, owned_here)
    assert sum(counts) == 3 and all(c >= 1 for c in counts), counts  # every matrix has one owner


def main():
    rank_, world = dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29512")))
    meshmuon.blas_set_num_threads(1)
    run_cases({"bf16_owned": lambda: case_bf16_owned(world)}, "bf16_owned")


if __name__ == "__main__":
    guarded(main)
