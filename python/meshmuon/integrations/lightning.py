"""PyTorch Lightning (2.6.6) with meshmuon.torch.Muon: `configure_optimizers` returns it, built on
the parameters as `configure_model` left them (DTensors under ModelParallelStrategy's FSDP2 / TP),
with Lightning's lr-scheduler configuration; Lightning's distributed checkpoints (DCP) save and
reshard its state like any torch optimizer's.

    from meshmuon.integrations.lightning import configure_muon

    class Module(L.LightningModule):
        def configure_model(self):
            for block in self.model.layers:
                fully_shard(block, mesh=self.device_mesh["data_parallel"])
            fully_shard(self.model, mesh=self.device_mesh["data_parallel"])

        def configure_optimizers(self):
            return configure_muon(self.model, muon=dict(lr=0.02), adamw=dict(lr=3e-3),
                                  scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(...))

See docs/integrations.md."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from .. import torch as mt


def configure_muon(model: nn.Module, *, muon: Optional[dict] = None, adamw: Optional[dict] = None,
                   scheduler: Optional[Callable[[mt.Muon], Any]] = None, interval: str = "step",
                   split: Optional[dict] = None, **options: Any) -> Any:
    """What configure_optimizers returns: meshmuon.torch.Muon over meshmuon.torch.param_groups(
    model, muon=, adamw=, **(split or {})) with Muon's keyword `options`; with `scheduler`
    (a function of the optimizer returning an LRScheduler), Lightning's dict {"optimizer",
    "lr_scheduler": {"scheduler", "interval"}} (stepped every optimizer step by default)."""
    opt = mt.Muon(mt.param_groups(model, muon=muon, adamw=adamw, **(split or {})), **options)
    if scheduler is None:
        return opt
    sched = scheduler(opt)
    if not isinstance(sched, torch.optim.lr_scheduler.LRScheduler):
        raise TypeError(f"[lightning] configure_muon: scheduler(opt) returned "
                        f"{type(sched).__name__}; return a torch.optim.lr_scheduler.LRScheduler")
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": interval}}
