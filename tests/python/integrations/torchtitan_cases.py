"""torchtitan's optimizer container with optimizer_name="MeshMuon" (rank side; test_torchtitan.py
launches it with torchrun). torchtitan's pieces are used directly: MeshMuonOptimizers.Config (its
OptimizersContainer: ParamGroupConfig patterns, FQN param_names, flat FQN-keyed state dicts), its
LRSchedulersContainer and DCP as its checkpointer uses it. Not its llama3 model: on a CPU-only
install `torchtitan.models.llama3` cannot be imported (models.common.moe -> token_dispatcher ->
distributed.minimal_async_ep.kernels does `import triton`, a GPU compiler torch's CPU build does
not bring), so the model is swap_cases.Net sharded as torchtitan's apply_fsdp does (each block,
then the root).
- steps (2 ranks): FSDP2, 3 steps of deterministic gradients: parameters and state BITWISE the
  same container built on the plain model in one process (engine="local"); lrs those of the
  schedule; then a DCP checkpoint of the optimizer and lr scheduler state, and the reference's
  values after 3 and 4 steps.
- reshard (1 rank): the checkpoint loads into a container over plain tensors (another world size
  and layout): state BITWISE the saved reference's; one more step BITWISE the reference's 4th.
Run by hand: torchrun --nproc-per-node 2 torchtitan_cases.py --cases steps --out /tmp/tt, then
torchrun --nproc-per-node 1 torchtitan_cases.py --cases reshard --out /tmp/tt
"""
from __future__ import annotations

import argparse
import copy
import os

import torch

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from harness import guarded, run_cases  # noqa: E402
from swap_cases import Net, full, same, set_grads, shard  # noqa: E402
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    run_cases({"steps": lambda: case_steps(a.out), "reshard": lambda: case_reshard(a.out)}, a.cases)


if __name__ == "__main__":
    guarded(main)
