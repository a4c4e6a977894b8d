"""Three steps of meshmuon.torch.Muon on an FSDP2 model under torchrun or mpirun, as a user of the
wheel runs them (torchrun: the c10d communicator, no MPI; mpirun: meshmuon's MPI communicator on the
Open MPI the job brings). After each real backward pass the gradients are replaced by
ones computed from the full parameters (FSDP2's own reduction may round differently per world size,
which is torch's business, not meshmuon's), so the result must be bitwise that of one process.
Rank 0 writes the full parameters to OUT.

Run: python -m torch.distributed.run --standalone --nproc-per-node N tests/wheel/fsdp2_step.py OUT
  or mpirun -np N python tests/wheel/fsdp2_step.py OUT
(tests/wheel/cleanroom.sh runs it at 1 and 2 ranks and compares the files bitwise)."""
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

import meshmuon.torch as mt
from meshmuon.torch import _comms


def main(out: str) -> None:
    rank, world = mt.init_distributed()
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
    if rank == 0:
        torch.save({"initial": initial, "final": full, "comm": _comms.communicator(world, "cpu").backend}, out)
        print(f"fsdp2_step: {world} rank(s), {len(full)} parameters, loss {loss.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
