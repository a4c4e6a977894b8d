"""PyTorch Lightning's ModelParallelStrategy with meshmuon (rank side; test_lightning.py launches it
with torchrun on 2 CPU ranks, gloo). FSDP2 applied in configure_model (each block, then the root,
on the strategy's data_parallel mesh), configure_optimizers returning
meshmuon.integrations.lightning.configure_muon (Muon with a LambdaLR stepped per step):
- fit: 4 steps; every step's gradients and lrs (recorded in on_before_optimizer_step) replayed on
  a hand-built FSDP2 model of the same init with meshmuon.torch.Muon built by hand: parameters and
  state BITWISE Lightning's; one step fewer differs.
- resume: 2 epochs (one step each), trainer.save_checkpoint (Lightning's distributed checkpoint:
  DCP), a new Trainer fit(ckpt_path=...) to 4: BITWISE the uninterrupted run.
Run by hand: torchrun --nproc-per-node 2 lightning_cases.py --cases fit,resume --out /tmp/pl
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

torch.set_num_threads(1)

import pytorch_lightning as pl  # noqa: E402
import torch.distributed as dist  # noqa: E402
from harness import guarded  # noqa: E402
from pytorch_lightning.strategies import ModelParallelStrategy  # noqa: E402
from swap_cases import ADAMW, MUON, VOCAB, Net, same  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import meshmuon.torch as mt  # noqa: E402
from meshmuon.integrations.lightning import configure_muon  # noqa: E402

STEPS = 4


def schedule(step: int) -> float:
    return 1.0 - step / (2 * STEPS)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 8  # 2 ranks x batch 4: one step per epoch

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        tokens = torch.randint(0, VOCAB, (6,), generator=g)
        return tokens, torch.roll(tokens, -1)


def shard(net, mesh=None):
    for layer in net.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


class LM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.net = Net()
        self.grads, self.lrs = [], []

    def configure_model(self):
        shard(self.net, self.device_mesh["data_parallel"])

    def training_step(self, batch, index):
        tokens, targets = batch
        return F.cross_entropy(self.net(tokens).reshape(-1, VOCAB), targets.reshape(-1))

    def on_before_optimizer_step(self, optimizer):
        self.grads.append({n: p.grad.to_local().clone() for n, p in self.net.named_parameters()})
        self.lrs.append([g["lr"] for g in optimizer.param_groups])

    def configure_optimizers(self):
        return configure_muon(self.net, muon=MUON, adamw=ADAMW,
                              scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, schedule))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Data(), batch_size=4, shuffle=False)


def fit(epochs: int, ckpt: str = None) -> tuple[LM, pl.Trainer]:
    module = LM()
    trainer = pl.Trainer(accelerator="cpu", devices=2, max_epochs=epochs, logger=False,
                         strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, ckpt_path=ckpt)
    assert isinstance(module.net.lm_head.weight, DTensor)
    return module, trainer


def local(t):
    return (t.to_local() if isinstance(t, DTensor) else t).detach()


def compare(net, opt, ref_net, ref_opt, what: str) -> None:
    ref = dict(ref_net.named_parameters())
    for name, p in net.named_parameters():
        r = ref[name]
        assert same(local(p), local(r)), f"{what}: {name} differs"
        st, rst = opt.state[p], ref_opt.state[r]
        assert sorted(st) == sorted(rst) and st, (what, name, sorted(st), sorted(rst))
        for key in st:
            assert same(local(st[key]), local(rst[key])), f"{what}: state {name}.{key} differs"


def muon_of(trainer) -> mt.Muon:
    opt = trainer.optimizers[0]
    opt = getattr(opt, "optimizer", opt)  # Lightning's LightningOptimizer wraps it
    assert isinstance(opt, mt.Muon) and opt.engine == "distributed", type(opt)
    return opt


def case_fit(out: str):
    module, trainer = fit(STEPS)
    assert len(module.grads) == STEPS, len(module.grads)
    torch.manual_seed(5)
    net = shard(Net())
    ref_opt = mt.Muon(mt.param_groups(net, muon=MUON, adamw=ADAMW))
    sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, schedule)
    mine = dict(module.net.named_parameters())
    for s, grads in enumerate(module.grads):
        assert module.lrs[s] == [g["lr"] for g in ref_opt.param_groups], (s, module.lrs[s])
        if s == STEPS - 1:  # negative control: one step fewer differs
            assert not any(same(local(p), local(mine[n])) for n, p in net.named_parameters()
                           if p.ndim == 2 and "layers" in n), "fit: 3 steps equal 4"
        for name, p in net.named_parameters():
            p.grad = DTensor.from_local(grads[name], p.device_mesh, p.placements, shape=p.shape,
                                        stride=p.stride())
        ref_opt.step()
        sched.step()
    compare(module.net, muon_of(trainer), net, ref_opt, "fit")


def case_resume(out: str):
    full, full_trainer = fit(STEPS)
    half, half_trainer = fit(STEPS // 2)
    path = os.path.join(out, "half.ckpt")
    half_trainer.save_checkpoint(path)
    assert os.path.isdir(path), path  # a distributed (DCP) checkpoint: a folder of shards
    resumed, trainer = fit(STEPS, ckpt=path)
    assert len(resumed.grads) == STEPS // 2, len(resumed.grads)
    compare(resumed.net, muon_of(trainer), full.net, muon_of(full_trainer), "resume")
    for (name, p), q in zip(full.net.named_parameters(), half.net.parameters()):
        assert not same(local(p), local(q)), f"resume: {name} after 2 steps equals 4"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cases = {"fit": lambda: case_fit(a.out), "resume": lambda: case_resume(a.out)}
    for name in a.cases.split(","):  # run_cases needs the process group Lightning creates
        cases[name]()
        dist.barrier()
        if dist.get_rank() == 0:
            print(f"CASE {name} OK", flush=True)


if __name__ == "__main__":
    guarded(main)
