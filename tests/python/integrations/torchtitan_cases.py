"""torchtitan's optimizer container with optimizer_name="MeshMuon" (rank side; test_torchtitan.py
launches it with torchrun). torchtitan's pieces are used directly: MeshMuonOptimizers.Config (its
OptimizersContainer: ParamGroupConfig patterns, FQN param_names, flat FQN-keyed state dicts), its
LRSchedulersContainer and DCP as its checkpointer uses it.
- steps (2 ranks): swap_cases.Net sharded as torchtitan's apply_fsdp does (each block, then the
  root), FSDP2, 3 steps of deterministic gradients: parameters and state BITWISE the same container
  built on the plain model in one process (engine="local"); lrs those of the schedule; then a DCP
  checkpoint of the optimizer and lr scheduler state, and the reference's values after 3 and 4
  steps.
- reshard (1 rank): the checkpoint loads into a container over plain tensors (another world size
  and layout): state BITWISE the saved reference's; one more step BITWISE the reference's 4th.
- llama3_fsdp, llama3_tp (2 ranks; need triton importable, see below): torchtitan's own llama3
  "debugmodel" flavor (its first 2 layers) built on meta and parallelized by its own
  parallelize_llama (ParallelDims mesh; FSDP2 over 2 ranks, or TP 2 with its sequence parallel and
  FSDP of degree 1), materialized and initialized by its init_weights; 3 forward/backward steps on
  token batches: parameters after each MeshMuonOptimizers step BITWISE those of the same container
  stepping a plain copy of the model in one process with the same (full) gradients.
  What torchtitan needs to run this on CPU with gloo (read in its 0.3.0 sources):
  * `import torchtitan.models.llama3` imports models.common.moe -> token_dispatcher ->
    distributed.minimal_async_ep.kernels, which does `import triton` at module import (its
    @triton.jit kernels): triton (torch's pin, 3.7.1) must be installed; it is never called here.
  * torchtitan.tools.utils.device_type is "cuda" when no accelerator is found, and ParallelDims
    builds its mesh on it: set to "cpu" in torchtitan.distributed.parallel_dims (a module global).
  * Language-model attention is flex (torch.compile with max_autotune) or varlen (CUDA); the
    model's layers get torchtitan's ScaledDotProductAttention instead (its maskless backend, what
    its graph_trainer tests use; causal, no masks).
  * Model.Config.update_from_config imports torchtitan.trainer (torchdata): its llama3 sharding
    step, set_llama3_sharding_config, is called directly.
  * spmd_backend="partial_dtensor" (the default "spmd_types" fails in fully_shard: "When
    dp_mesh_dims is provided, all parameters must be DTensors on the full SPMD mesh").
  * its FSDP disables gradient division (set_gradient_divide_factor(1.0)), a PREMUL_SUM
    reduce-scatter gloo lacks ("Cannot use ReduceOp.PREMUL_SUM with Gloo"): each FSDP module gets
    set_force_sum_reduction_for_comms(True) (the same sum, FSDP2's public switch).
  * mixed_precision_param="float32" (TrainingConfig), so the plain copy computes the same.
Run by hand: torchrun --nproc-per-node 2 torchtitan_cases.py --cases steps --out /tmp/tt, then
torchrun --nproc-per-node 1 torchtitan_cases.py --cases reshard --out /tmp/tt;
torchrun --nproc-per-node 2 torchtitan_cases.py --cases llama3_fsdp,llama3_tp --out /tmp/tt
"""
from __future__ import annotations

import argparse
import copy
import os

import torch

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from harness import guarded, run_cases  # noqa: E402
from swap_cases import Net, full, same, set_grads, shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torchtitan.components.optimizer import LRSchedulersContainer, ParamGroupConfig  # noqa: E402

import meshmuon.torch as mt  # noqa: E402
from meshmuon.integrations.torchtitan import MeshMuonOptimizers  # noqa: E402

STEPS = 5


def config(**options) -> MeshMuonOptimizers.Config:
    return MeshMuonOptimizers.Config(
        param_groups=[
            ParamGroupConfig(pattern=r"embed|norm|lm_head|bias", optimizer_name="MeshMuon",
                             optimizer_kwargs=dict(algorithm="adamw", lr=3e-3, weight_decay=0.0)),
            ParamGroupConfig(pattern=r".*", optimizer_name="MeshMuon",
                             optimizer_kwargs=dict(lr=0.02, weight_decay=0.1)),
        ],
        implementation="foreach", optimizer_factory_kwargs_by_name={"MeshMuon": options})


def build(model, **options):
    opts = config(**options).build(model_parts=[model])
    scheds = LRSchedulersContainer.Config(warmup_steps=1, decay_type="linear").build(
        optimizers=opts, training_steps=STEPS)
    return opts, scheds


def step(model, opts, scheds, s: int) -> None:
    set_grads(model, s)
    opts.step()
    scheds.step()
    opts.zero_grad()


def state_of(opts) -> dict:
    """The container's flat FQN-keyed state (torchtitan's checkpoint layout), full tensors."""
    return {k: full(v).clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
            for k, v in opts.state_dict().items()}


def check_state(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), (what, sorted(set(got) ^ set(want))[:6])
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert same(full(got[key]), value), f"{what}: {key} differs"
        else:
            assert got[key] == value, (what, key, got[key], value)


def case_steps(out: str):
    torch.manual_seed(7)
    plain = Net()
    ref = copy.deepcopy(plain)
    model = shard(plain)
    opts, scheds = build(model)
    muon = opts.optimizers[0]
    assert len(opts.optimizers) == 1 and isinstance(muon, mt.Muon) and muon.engine == "distributed"
    assert [g["algorithm"] for g in muon.param_groups] == ["adamw", "muon"]
    assert "fused" not in muon.param_groups[0] and muon.param_groups[1]["param_names"][0] == \
        "layers.0.up.weight", muon.param_groups[1]["param_names"]
    ref_opts, ref_scheds = build(ref, engine="local")
    for s in range(3):
        step(model, opts, scheds, s)
        step(ref, ref_opts, ref_scheds, s)
    assert [g["lr"] for g in muon.param_groups] == [3e-3 * 0.5, 0.02 * 0.5]  # 1 warmup, linear
    refs = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert same(full(p), refs[name].detach()), f"steps: {name} differs"
    want = state_of(ref_opts)
    check_state(state_of(opts), want, "steps")
    dcp.save({"optimizer": opts.state_dict(), "lr_scheduler": scheds.state_dict()},
             checkpoint_id=os.path.join(out, "step3"))
    params3 = {n: p.detach().clone() for n, p in ref.named_parameters()}
    step(ref, ref_opts, ref_scheds, 3)
    if dist.get_rank() == 0:
        torch.save(dict(params3=params3, state3=want,
                        params4={n: p.detach().clone() for n, p in ref.named_parameters()}),
                   os.path.join(out, "reference.pt"))


def case_reshard(out: str):
    saved = torch.load(os.path.join(out, "reference.pt"), weights_only=False)
    model = Net()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(saved["params3"][n])
    opts, scheds = build(model)
    assert opts.optimizers[0].engine == "local"
    sd = {"optimizer": opts.state_dict(), "lr_scheduler": scheds.state_dict()}
    dcp.load(sd, checkpoint_id=os.path.join(out, "step3"))
    opts.load_state_dict(sd["optimizer"])
    scheds.load_state_dict(sd["lr_scheduler"])
    check_state(state_of(opts), saved["state3"], "reshard")
    step(model, opts, scheds, 3)
    for n, p in model.named_parameters():
        assert same(p.detach(), saved["params4"][n]), f"reshard: {n} differs after step 4"
        assert not same(p.detach(), saved["params3"][n]), f"reshard: {n} did not move"


def llama3(tp: int):
    """torchtitan's llama3 debug model (2 layers, SDPA), parallelized by its parallelize_llama on
    all ranks (FSDP, or TP `tp`), initialized; and a plain copy of it."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs, parallelize_llama
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    parallel_dims.device_type = "cpu"  # torchtitan's pick is "cuda" when no accelerator is found
    cfg = llama3_configs["debugmodel"](attn_backend="flex")
    cfg.layers = cfg.layers[:2]
    for layer in cfg.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    parallelism = ParallelismConfig(tensor_parallel_degree=tp, spmd_backend="partial_dtensor")
    set_llama3_sharding_config(cfg, enable_sp=parallelism.enable_sequence_parallel)
    with torch.device("meta"):
        model = cfg.build()
    dims = parallel_dims.ParallelDims.from_config(parallelism, dist.get_world_size())
    dims.build_mesh()
    model = parallelize_llama(model, parallel_dims=dims,
                              training=TrainingConfig(mixed_precision_param="float32"),
                              parallelism=parallelism, compile_config=CompileConfig(),
                              ac_config=None, dump_folder="")
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    model.to_empty(device="cpu")
    torch.manual_seed(11)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    plain = cfg.build()
    with torch.no_grad():
        weights = {n: full(p) for n, p in model.named_parameters()}
        for n, p in plain.named_parameters():
            p.copy_(weights[n])
    return model, plain


def titan_config(**options) -> MeshMuonOptimizers.Config:
    return MeshMuonOptimizers.Config(
        param_groups=[
            ParamGroupConfig(pattern=r"tok_embeddings|norm|lm_head", optimizer_name="MeshMuon",
                             optimizer_kwargs=dict(algorithm="adamw", lr=3e-3, weight_decay=0.0)),
            ParamGroupConfig(pattern=r".*", optimizer_name="MeshMuon",
                             optimizer_kwargs=dict(lr=0.02, weight_decay=0.1)),
        ],
        optimizer_factory_kwargs_by_name={"MeshMuon": options})


def case_llama3(tp: int):
    model, plain = llama3(tp)
    kinds = {type(p).__name__ for p in model.parameters()}
    assert kinds == {"DTensor"}, kinds
    if tp > 1:
        wo = model.layers["0"].attention.wo.weight
        placed = wo.placements
        assert "tp" in wo.device_mesh.mesh_dim_names and placed[-1].is_shard(1), placed
    opts = titan_config().build(model_parts=[model])
    ref = titan_config(engine="local").build(model_parts=[plain])
    muon = opts.optimizers[0]
    assert len(opts.optimizers) == 1 and muon.engine == "distributed"
    assert [g["algorithm"] for g in muon.param_groups] == ["adamw", "muon"]
    assert muon.param_groups[1]["param_names"][0] == "layers.0.attention.qkv_linear.wqkv.weight"
    vocab = plain.lm_head.weight.shape[0]
    refs = dict(plain.named_parameters())
    for s in range(3):
        rank = dist.get_rank() if tp == 1 else 0  # TP ranks read the same batch
        gen = torch.Generator().manual_seed(100 + 10 * s + rank)
        tokens = torch.randint(0, vocab, (2, 16), generator=gen)
        out = model(tokens)
        out = out.full_tensor() if isinstance(out, DTensor) else out
        targets = torch.roll(tokens, -1, 1).reshape(-1)
        loss = F.cross_entropy(out.reshape(-1, vocab).float(), targets)
        assert torch.isfinite(loss), loss
        loss.backward()
        grads = {n: full(p.grad) for n, p in model.named_parameters()}
        for n, p in plain.named_parameters():
            p.grad = grads[n].clone()
        before = {n: full(p).clone() for n, p in model.named_parameters()}
        opts.step()
        opts.zero_grad()
        ref.step()
        ref.zero_grad()
        for n, p in model.named_parameters():
            assert same(full(p), refs[n].detach()), f"llama3 tp={tp} step {s}: {n} differs"
            assert not same(full(p), before[n]), f"llama3 tp={tp} step {s}: {n} did not move"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    run_cases({"steps": lambda: case_steps(a.out), "reshard": lambda: case_reshard(a.out),
               "llama3_fsdp": lambda: case_llama3(1), "llama3_tp": lambda: case_llama3(2)}, a.cases)


if __name__ == "__main__":
    guarded(main)
