"""Hugging Face Trainer (transformers 5.23, over Accelerate 1.15, FSDP2 included) with
meshmuon.torch.Muon: the Muon / AdamW split by names and shapes (meshmuon.torch.param_groups),
hyperparameters from TrainingArguments, the Trainer's own lr schedulers and checkpoints.

    from meshmuon.integrations.hf import MuonTrainer
    trainer = MuonTrainer(model=model, args=args, train_dataset=ds, muon=dict(lr=0.02))

or, keeping the Trainer class: Trainer(..., optimizer_cls_and_kwargs=(MuonFactory, dict(args=args,
muon=dict(lr=0.02)))). The Trainer refuses `optimizers=(opt, sched)` under FSDP, and under FSDP2 it
builds the optimizer on the unsharded model: Accelerate's prepare() then swaps the parameters in
place, which meshmuon.torch.Muon follows at its next step (meshmuon/torch/_rebind.py). See
docs/integrations.md."""
from __future__ import annotations

from typing import Any, Optional

from torch import nn
from transformers import Trainer, TrainingArguments

from .. import torch as mt


def _decay_names(model: nn.Module) -> set[str]:
    """The parameters the Trainer decays (its own rule: not biases, not norms)."""
    return set(Trainer.get_decay_parameter_names(None, model))


def param_groups_for(model: nn.Module, args: Optional[TrainingArguments] = None, *,
                     muon: Optional[dict] = None, adamw: Optional[dict] = None,
                     decay: Optional[set] = None, **split: Any) -> list[dict]:
    """meshmuon.torch.param_groups(model) with the Trainer's hyperparameters: Muon groups get
    lr=args.learning_rate, weight_decay=args.weight_decay and adjust_lr_fn="match_rms_adamw" (so
    that one learning rate serves both algorithms, Moonlight's rule), AdamW groups the Trainer's
    lr, betas, eps and weight decay, with weight_decay=0 for the parameters the Trainer does not
    decay (biases, norms: its get_decay_parameter_names, or the names in `decay`). `muon` /
    `adamw` override; `split`
    passes on to param_groups (lm_head_names, expert_pattern, is_muon, split, ...)."""
    base_muon, base_adamw = {}, {}
    if args is not None:
        base_muon = dict(lr=args.learning_rate, weight_decay=args.weight_decay,
                         adjust_lr_fn="match_rms_adamw")
        base_adamw = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                          eps=args.adam_epsilon, weight_decay=args.weight_decay)
    groups = mt.param_groups(model, muon=dict(base_muon, **(muon or {})),
                             adamw=dict(base_adamw, **(adamw or {})), **split)
    decay, out = _decay_names(model) if decay is None else set(decay), []
    for group in groups:
        if group["algorithm"] != "adamw":
            out.append(group)
            continue
        kept = [(n, p) for n, p in group["params"] if n in decay]
        free = [(n, p) for n, p in group["params"] if n not in decay]
        out += [dict(group, params=kept)] * bool(kept)
        out += [dict(group, params=free, weight_decay=0.0)] * bool(free)
    return out


def build_muon(model: nn.Module, args: Optional[TrainingArguments] = None, *,
               muon: Optional[dict] = None, adamw: Optional[dict] = None,
               split: Optional[dict] = None, decay: Optional[set] = None,
               **options: Any) -> mt.Muon:
    """meshmuon.torch.Muon over param_groups_for(model, args, muon=, adamw=, decay=,
    **(split or {})); `options` are Muon's keyword options (comm_dtype, strategy, ...)."""
    groups = param_groups_for(model, args, muon=muon, adamw=adamw, decay=decay, **(split or {}))
    return mt.Muon(groups, **options)


class MuonFactory:
    """The Trainer's optimizer factory (transformers' is_optimizer_factory: not an Optimizer
    class, so the Trainer calls MuonFactory()(model, **kwargs)): kwargs are build_muon's."""

    def __call__(self, model: nn.Module, **kwargs: Any) -> mt.Muon:
        return build_muon(model, **kwargs)


class MuonTrainer(Trainer):
    """A Trainer whose optimizer is meshmuon.torch.Muon (create_optimizer overridden; the lr
    scheduler, gradient clipping, accumulation and checkpoints are the Trainer's). Keyword
    arguments `muon`, `adamw`, `split` and `muon_options` (Muon's keyword options) are build_muon's."""

    def __init__(self, *args: Any, muon: Optional[dict] = None, adamw: Optional[dict] = None,
                 split: Optional[dict] = None, muon_options: Optional[dict] = None, **kwargs: Any):
        self._meshmuon = dict(muon=muon, adamw=adamw, split=split, **(muon_options or {}))
        super().__init__(*args, **kwargs)

    def create_optimizer(self, model: Optional[nn.Module] = None) -> mt.Muon:
        if self.optimizer is None:
            model = self.model if model is None else model
            self.optimizer = build_muon(model, self.args, decay=self.get_decay_parameter_names(model),
                                        **self._meshmuon)
        return self.optimizer
