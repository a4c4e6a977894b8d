"""Three steps of meshmuon.torch.Muon on an FSDP2 model under torchrun, as a user of the wheel runs
them (no MPI: the c10d communicator). After each real backward pass the gradients are replaced by
ones computed from the full parameters (FSDP2's own reduction may round differently per world size,
which is torch's business, not meshmuon's), so the result must be bitwise that of one process.
Rank 0 writes the full parameters to OUT.

Run: python -m torch.distributed.run --standalone --nproc-per-node N tests/wheel/fsdp2_step.py OUT
(tests/wheel/cleanroom.sh runs it at 1 and 2 ranks and compares the two files bitwise)."""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

import meshmuon.torch as mt


def main(out: str) -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(40, 64), torch.nn.Linear(64, 96, bias=False),
                                torch.nn.GELU(), torch.nn.Linear(96, 64, bias=True),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 40, bias=False))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    initial = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}
    opt = mt.Muon(mt.param_groups(model, vocab_size=40), lr=0.02)
    for step in range(3):
        tokens = torch.randint(0, 40, (8, 12), generator=torch.Generator().manual_seed(step))
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 40), tokens[:, 1:].reshape(-1))
        loss.backward()
        for p in model.parameters():
            full = p.full_tensor().detach()
            p.grad = distribute_tensor(torch.sin(full * (step + 3) + 0.5) * 0.1, mesh, p.placements)
        opt.step()
        opt.zero_grad(set_to_none=True)
    full = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}
    if dist.get_rank() == 0:
        torch.save({"initial": initial, "final": full}, out)
        print(f"fsdp2_step: {world} rank(s), {len(full)} parameters, loss {loss.item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
