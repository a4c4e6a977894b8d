"""Hugging Face Trainer over Accelerate with FSDP2 and meshmuon (rank side; test_hf_trainer.py
launches it with torchrun on 2 CPU ranks, gloo). A tiny Llama from a LlamaConfig (no hub), trained
by meshmuon.integrations.hf.MuonTrainer:
- trainer: 6 steps; the loss falls; every step's gradients (recorded before the optimizer step,
  after the Trainer's clipping) and lrs replayed on a hand-built FSDP2 model of the same init with
  meshmuon.torch.Muon built on its DTensors by hand and a hand-written linear schedule: the
  parameters and the optimizer state are BITWISE the Trainer's; the lrs equal.
- resume: 3 steps, checkpoint (the Trainer's FSDP2 sharded checkpoint: DCP), a new Trainer
  resumes to step 6: parameters and state BITWISE the uninterrupted run's (the 3-step ones differ).
CPU only: accelerate 1.15 turns FSDP on only for accelerator devices (state.py: the FSDP branch is
for MULTI_GPU / NPU / XPU / ...; on MULTI_CPU the fsdp config is silently ignored and the model is
trained unsharded), so CpuFsdp below sets the Trainer's accelerator to FSDP after it is built; the
rest (prepare's fully_shard and parameter swap, clipping, checkpoints) runs as shipped.
Run by hand: torchrun --nproc-per-node 2 hf_cases.py --cases trainer,resume --out /tmp/hf
"""
from __future__ import annotations

import argparse
import os

import torch

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin  # noqa: E402
from harness import guarded, run_cases  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments  # noqa: E402

import meshmuon.torch as mt  # noqa: E402
from meshmuon.integrations.hf import MuonTrainer  # noqa: E402

VOCAB, STEPS, LR, WD = 64, 6, 3e-2, 0.01


def make_model() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


class Data(torch.utils.data.Dataset):
    """Learnable sequences: arithmetic progressions modulo the vocabulary."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = (torch.arange(16) * (1 + i % 2) + i) % VOCAB
        return dict(input_ids=ids, labels=ids.clone())


def args_for(out: str, save: bool) -> TrainingArguments:
    return TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, max_steps=STEPS, learning_rate=LR,
        weight_decay=WD, lr_scheduler_type="linear", warmup_steps=0, max_grad_norm=1.0,
        use_cpu=True, report_to=[], logging_steps=1, disable_tqdm=True, seed=0,
        save_strategy="steps" if save else "no", save_steps=3,
        fsdp=True, fsdp_config={"fsdp_version": 2, "reshard_after_forward": True,
                                "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                "state_dict_type": "SHARDED_STATE_DICT"})


class CpuFsdp(MuonTrainer):
    """MuonTrainer with accelerate's FSDP turned on on CPU (see the module docstring)."""

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        state = self.accelerator.state
        state.distributed_type = DistributedType.FSDP
        state.fsdp_plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
        self.is_fsdp_enabled = True


class Record(TrainerCallback):
    """Each step's local gradients and group lrs, as the optimizer is about to see them."""

    def __init__(self, stop_at: int = 0):
        self.grads, self.lrs, self.stop_at = [], [], stop_at

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kw):
        self.grads.append({n: p.grad.to_local().clone() for n, p in model.named_parameters()})
        self.lrs.append([g["lr"] for g in optimizer.param_groups])

    def on_step_end(self, args, state, control, **kw):
        if self.stop_at and state.global_step == self.stop_at:
            control.should_training_stop = True


def train(out: str, save: bool = False, stop_at: int = 0, resume: str = None):
    model, record = make_model(), Record(stop_at)
    trainer = CpuFsdp(model=model, args=args_for(out, save), train_dataset=Data(),
                      callbacks=[record])
    trainer.train(resume_from_checkpoint=resume)
    assert isinstance(next(trainer.model.parameters()), DTensor)  # FSDP2 did shard it
    return trainer, record


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


def local(t):
    return (t.to_local() if isinstance(t, DTensor) else t).detach()


def compare(model, opt, ref_model, ref_opt, what: str) -> None:
    ref = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        r = ref[name]
        assert same(local(p), local(r)), f"{what}: {name} differs " \
                                         f"(max {(local(p) - local(r)).abs().max().item():.3g})"
        st, rst = opt.state[p], ref_opt.state[r]
        assert sorted(st) == sorted(rst) and st, (what, name, sorted(st), sorted(rst))
        for key in st:
            assert same(local(st[key]), local(rst[key])), f"{what}: state {name}.{key} differs"


def by_hand():
    """The same model sharded as accelerate does (each decoder layer, the embedding, the final
    norm with the head, the root) and meshmuon.torch.Muon with the Trainer's hyperparameters."""
    model = make_model()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model.model.embed_tokens)
    fully_shard([model.model.norm, model.lm_head], reshard_after_forward=False)
    fully_shard(model)
    groups = mt.param_groups(model, muon=dict(lr=LR, weight_decay=WD, adjust_lr_fn="match_rms_adamw"),
                             adamw=dict(lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD))
    adamw = groups.pop()
    assert adamw["algorithm"] == "adamw"
    decayed = [(n, p) for n, p in adamw["params"] if "norm" not in n and "bias" not in n]
    free = [(n, p) for n, p in adamw["params"] if "norm" in n or "bias" in n]
    groups += [dict(adamw, params=decayed), dict(adamw, params=free, weight_decay=0.0)]
    opt = mt.Muon(groups)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, (STEPS - s) / STEPS))
    return model, opt, sched


def case_trainer(out: str):
    trainer, record = train(os.path.join(out, "a"))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == STEPS and min(losses[-2:]) < 0.8 * losses[0], losses
    opt = trainer.optimizer.optimizer  # accelerate's AcceleratedOptimizer wraps meshmuon's
    assert isinstance(opt, mt.Muon) and opt.engine == "distributed" and opt.engine_builds == 2
    assert [g["algorithm"] for g in opt.param_groups] == ["muon", "adamw", "adamw"]
    model, ref_opt, sched = by_hand()
    for s, grads in enumerate(record.grads):
        assert record.lrs[s] == [g["lr"] for g in ref_opt.param_groups], (s, record.lrs[s])
        for name, p in model.named_parameters():
            p.grad = DTensor.from_local(grads[name], p.device_mesh, p.placements, shape=p.shape,
                                        stride=p.stride())
        if s == STEPS - 1:  # negative control: one step fewer differs
            mine = dict(trainer.model.named_parameters())
            assert not any(same(local(p), local(mine[n])) for n, p in model.named_parameters()
                           if n.endswith("proj.weight")), "trainer: 5 steps equal 6"
        ref_opt.step()
        sched.step()
        ref_opt.zero_grad()
    compare(trainer.model, opt, model, ref_opt, "trainer")


def case_resume(out: str):
    full, _ = train(os.path.join(out, "full"))
    half, _ = train(os.path.join(out, "half"), save=True, stop_at=3)
    ckpt = os.path.join(out, "half", "checkpoint-3")
    assert os.path.isdir(ckpt), os.listdir(os.path.join(out, "half"))
    for (name, p), q in zip(full.model.named_parameters(), half.model.parameters()):
        assert not same(local(p), local(q)), f"resume: {name} after 3 steps equals 6 steps"
    resumed, record = train(os.path.join(out, "half"), resume=ckpt)
    assert len(record.grads) == 3, len(record.grads)  # steps 4..6 only
    compare(resumed.model, resumed.optimizer.optimizer, full.model, full.optimizer.optimizer,
            "resume")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    run_cases({"trainer": lambda: case_trainer(a.out), "resume": lambda: case_resume(a.out)},
              a.cases)


if __name__ == "__main__":
    guarded(main)
