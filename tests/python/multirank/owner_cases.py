"""Multi-rank cases of owner placement for FSDP2 models (meshmuon.torch.own, _layout/owner), run under torchrun
by test_owner.py. A small GPT-like model: its block matrices owned (whole on one rank each), the rest
(embedding, norms, an expert stack, the head) with fully_shard; real forward / backward with gradient
accumulation (2 micro-batches), meshmuon.torch.clip_grad_norm_, Muon + AdamW steps, zero_grad.

- train: after each backward the owner's gradient is BITWISE the documented reduction of the ranks'
  local gradients (computed here by a one-process replica: fp32 sums in rank order, one division,
  accumulated over micro-batches); the non-owners hold an empty [0, cols] gradient. After clipping
  and the step every parameter and its state are BITWISE the one-process meshmuon step given the same
  gradients (owned: the oracle's; FSDP2's: its reduced ones) and the same total norm; the step moves
  0 bytes (owned matrices step where they live; negative control: the same model without own moves
  bytes), and the clip was active (coefficient < 1).
- dcp_save / dcp_load_*: 2 steps with deterministic gradients, DCP save (owner placement or plain
  FSDP2), load at another world size into owner placement or plain FSDP2, 2 more steps: BITWISE the
  uninterrupted one-process run of 4 steps.
Prints "CASE <name> OK" (rank 0) per passing case; any failure aborts the job (exit code != 0).
"""
from __future__ import annotations

import argparse
import copy
import os
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
from dist_cases import grad_for  # noqa: E402  (deterministic full gradients by name and step)
from harness import expect_same_error, guarded, run_cases, say  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, distribute_tensor  # noqa: E402

MUON = dict(lr=0.02, weight_decay=0.1)
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
V, D, H = 11, 8, 12


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.wq = nn.Linear(D, D, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.up = nn.Linear(D, H, bias=False)
        self.down = nn.Linear(H, D, bias=False)

    def forward(self, x):
        x = x + self.wo(torch.tanh(self.wq(self.norm(x))))
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    """2 blocks of 4 matrices (8 owned: uneven over 3 ranks), an expert stack [3, D, D] (Muon, stays
    sharded over experts), an embedding, norms and a head (AdamW)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.experts = nn.Parameter(torch.randn(3, D, D) * 0.3)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        x = x + torch.einsum("btd,edf->btf", x, self.experts) / 3
        return self.lm_head(x)


def rank() -> int:
    return dist.get_rank()


def groups(model):
    return dt.param_groups(model, muon=MUON, adamw=ADAMW)


def batch(step: int, micro: int, r: int):
    g = torch.Generator().manual_seed(zlib.crc32(f"batch/{step}/{micro}/{r}".encode()))
    tokens = torch.randint(0, V, (2, 5), generator=g)
    return tokens, torch.randint(0, V, (2, 5), generator=g)


def loss_of(model, step, micro, r):
    tokens, targets = batch(step, micro, r)
    return F.cross_entropy(model(tokens).reshape(-1, V), targets.reshape(-1))


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def full(placement, p: torch.Tensor) -> torch.Tensor:
    if isinstance(p, DTensor):
        return p.detach().full_tensor()
    if placement is not None and placement.owner(p) >= 0:
        return placement.full_tensor(p)
    return p.detach()


def build(world, mesh_shape, own=True, seed=1, bf16=False, **own_args):
    torch.manual_seed(seed)
    model = Net()
    ref = copy.deepcopy(model)
    names = ("rep", "shard") if len(mesh_shape) == 2 else ("fsdp",)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    if bf16:
        own_args["param_dtype"] = torch.bfloat16
    placement = dt.own(model, mesh, select="owner", **own_args) if own else None
    ignored = placement.params if placement is not None else None
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    for b in model.blocks:
        fully_shard(b, mesh=mesh, ignored_params=ignored, mp_policy=mp)
    fully_shard(model, mesh=mesh, ignored_params=ignored, mp_policy=mp)
    return model, ref, placement


def owned_names(placement):
    return set(placement.names) if placement is not None else set()


# ---- train ---------------------------------------------------------------------------------------

def oracle_grads(ref, names, step, world, sync_first=True):
    """The documented reduction of every rank's local gradient of each owned matrix (in fp32): per
    micro-batch fp32 sums in rank order and one division by the world size, micro-batches
    accumulated; with sync_first=False the first micro-batch's local gradient is kept (fp32) and added
    to the second's before their one reduction. `ref` may be a bf16 replica (mixed precision)."""
    params = dict(ref.named_parameters())
    out, kept = {}, None
    for micro in range(2):
        local = []
        for r in range(world):
            ref.zero_grad(set_to_none=True)
            loss_of(ref, step, micro, r).backward()
            local.append({n: params[n].grad.detach().to(torch.float32).clone() for n in names})
        if micro == 0 and not sync_first:
            kept = local
            continue
        if kept is not None:
            local = [{n: kept[r][n].add_(local[r][n]) for n in names} for r in range(world)]
        for n in names:
            acc = local[0][n].clone()
            for r in range(1, world):
                acc.add_(local[r][n])
            acc.div_(world)
            out[n] = acc if n not in out else out[n].add_(acc)
    ref.zero_grad(set_to_none=True)
    return out


def case_train(world, mesh_shape, reshard=True, sync_first=True, reduce="auto"):
    """reshard: own(reshard_after_forward=); sync_first=False: the first micro-batch's backward runs
    under set_requires_gradient_sync(False) (FSDP2's and the placement's); reduce: own(reduce=), both
    ways must give the oracle's bits."""
    model, ref, placement = build(world, mesh_shape, reshard_after_forward=reshard, reduce=reduce)
    names = owned_names(placement)
    assert len(names) == 8, names
    held = [n for n in names if placement.owner(n) == rank()]
    if world == 3:  # 8 matrices over 3 ranks: uneven, and the two of one layer never on one rank
        assert sorted(len([n for n in names if placement.owner(n) == r]) for r in range(3)) == [2, 3, 3]
    for blk in ("blocks.0.", "blocks.1."):
        owners = [placement.owner(n) for n in names if n.startswith(blk)]
        assert len(set(owners)) == min(4, world), (blk, owners)
    opt = dt.Muon(groups(model), **MUON)
    assert opt.engine == "distributed"
    strategies = opt.plan().strategies
    assert all(strategies[n] == "local" for n in names), strategies
    ref_opt = dt.Muon(groups(ref), engine="local", **MUON)
    params, ref_params = dict(model.named_parameters()), dict(ref.named_parameters())
    for step in range(3):
        for micro in range(2):
            sync = sync_first or micro == 1
            model.set_requires_gradient_sync(sync)
            placement.set_requires_gradient_sync(sync)
            loss_of(model, step, micro, rank()).backward()
        want = oracle_grads(ref, names, step, world, sync_first)
        for n in names:
            g = params[n].grad
            if placement.owner(n) == rank():
                assert same(g, want[n]), f"step {step}: gradient of {n} is not the documented reduction " \
                                         f"(max diff {(g - want[n]).abs().max().item():.3g})"
            else:
                assert g is not None and tuple(g.shape) == (0, want[n].shape[1]), (n, g)
        grads = {n: full(placement, p.grad) if n not in names else want[n] for n, p in params.items()}
        norm_ref = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
        total = dt.clip_grad_norm_(model.parameters(), max_norm=0.5)
        assert torch.allclose(total, norm_ref, rtol=1e-5), (float(total), float(norm_ref))
        assert float(total) > 0.5, "the clip must be active (negative control of its effect)"
        for n, p in ref_params.items():
            p.grad = grads[n].clone()
        torch.nn.utils.clip_grads_with_norm_(list(ref_params.values()), 0.5, total)
        before = {n: p.detach().clone() for n, p in ref_params.items()}
        opt.step()
        ref_opt.step()
        stats = opt.last_step_stats
        assert stats["bytes_sent"] == 0 and stats["bytes_recv"] == 0, stats
        opt.zero_grad()
        ref_opt.zero_grad()
        assert all(params[n].grad is None for n in names)
        for n, p in params.items():
            got = full(placement, p)
            assert same(got, ref_params[n].detach()), \
                f"step {step}: {n} differs from the one-process step by " \
                f"{(got - ref_params[n].detach()).abs().max().item():.3g}"
            assert not same(got, before[n]), f"step {step}: {n} did not change (negative control)"
        for n in held:  # the owner's state is the one-process state
            st, rst = opt.state[params[n]], ref_opt.state[ref_params[n]]
            assert same(st["momentum_buffer"], rst["momentum_buffer"]), n
    # negative control: the same model sharded by FSDP2 alone moves bytes in its optimizer step
    model2, _, _ = build(world, mesh_shape, own=False)
    opt2 = dt.Muon(groups(model2), **MUON)
    loss_of(model2, 0, 0, rank()).backward()
    opt2.step()
    assert opt2.last_step_stats["bytes_sent"] > 0 or world == 1


def case_mixed(world):
    """param_dtype=bf16 (with FSDP2's MixedPrecisionPolicy for the rest): the forward runs on bf16
    copies (round to nearest even of the owner's fp32 matrix), the owner's fp32 gradient is BITWISE
    the documented reduction of the ranks' bf16 local gradients (a bf16 replica computes them), and
    the step moves 0 bytes."""
    model, ref, placement = build(world, (world,), bf16=True)
    ref = ref.to(torch.bfloat16)
    names = owned_names(placement)
    opt = dt.Muon(groups(model), **MUON)
    params = dict(model.named_parameters())
    for step in range(2):
        for micro in range(2):
            loss_of(model, step, micro, rank()).backward()
        want = oracle_grads(ref, names, step, world)
        for n in names:
            if placement.owner(n) == rank():
                g = params[n].grad
                assert g.dtype == torch.float32 and same(g, want[n]), f"bf16 step {step}: gradient of {n}"
        opt.step()
        assert opt.last_step_stats["bytes_sent"] == 0
        opt.zero_grad()
        with torch.no_grad():  # the replica follows the fp32 masters, rounded as the forward sees them
            for n, p in ref.named_parameters():
                p.copy_(full(placement, params[n]).to(torch.bfloat16))


# ---- DCP -----------------------------------------------------------------------------------------

def set_grads(model, placement, step):
    for name, p in model.named_parameters():
        o = placement.owner(p) if placement is not None else -1
        shape = p.shape if o < 0 else meshmuon.torch._layout.layout_of(p).shape
        g = grad_for(name, shape, step)
        if isinstance(p, DTensor):
            p.grad = distribute_tensor(g, p.device_mesh, p.placements, src_data_rank=None)
        elif o >= 0:
            p.grad = g if o == rank() else p.new_empty((0, shape[1]))
        else:
            p.grad = g


def run_steps(model, placement, opt, first, count):
    for s in range(first, first + count):
        set_grads(model, placement, s)
        opt.step()


def case_dcp_save(world, ckpt, own):
    model, _, placement = build(world, (world,), own=own)
    opt = dt.Muon(groups(model), **MUON)
    run_steps(model, placement, opt, 0, 2)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)


def case_dcp_load(world, ckpt, mesh_shape, own):
    model, ref, placement = build(world, mesh_shape, own=own)
    opt = dt.Muon(groups(model), **MUON)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    run_steps(model, placement, opt, 2, 2)
    ref_opt = dt.Muon(groups(ref), engine="local", **MUON)
    run_steps(ref, None, ref_opt, 0, 4)
    ref_params = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        assert same(full(placement, p), ref_params[n].detach()), f"{n} differs after the DCP round trip"
        st, rst = opt.state[p], ref_opt.state[ref_params[n]]
        if placement is not None and placement.owner(p) >= 0:
            if placement.owner(p) == rank():
                assert same(st["momentum_buffer"], rst["momentum_buffer"]), n
        else:
            for k in rst:
                if k != "step":
                    v = st[k]
                    assert same(v.full_tensor() if isinstance(v, DTensor) else v, rst[k]), (n, k)
        assert float(st["step"]) == 4.0, (n, st["step"])


def case_dcp_negative(world, ckpt):
    """Negative control of the DCP cases: the same continuation without the load differs."""
    model, ref, placement = build(world, (world,), own=True)
    opt = dt.Muon(groups(model), **MUON)
    run_steps(model, placement, opt, 2, 2)
    ref_opt = dt.Muon(groups(ref), engine="local", **MUON)
    run_steps(ref, None, ref_opt, 0, 4)
    ref_params = dict(ref.named_parameters())
    assert not all(same(full(placement, p), ref_params[n].detach()) for n, p in model.named_parameters())


def case_bad_input(world):
    """Bad arguments raise ValueError / TypeError naming the option, on every rank, before any change."""
    torch.manual_seed(1)
    model = Net()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    expect_same_error(lambda: dt.own(model, select="sharded-please"), ValueError, "select='sharded-please'")
    expect_same_error(lambda: dt.own(model, select=["blocks.*.nothing"]), ValueError, "blocks.*.nothing")
    expect_same_error(lambda: dt.own(model, select=3), TypeError, "select")
    expect_same_error(lambda: dt.own(model, reduce_dtype=torch.float16), ValueError, "reduce_dtype")
    expect_same_error(lambda: dt.own(model, param_dtype=torch.float16), ValueError, "param_dtype")
    expect_same_error(lambda: dt.own(model, reduce="tree"), ValueError, "reduce='tree'")
    assert all(same(p.detach(), before[n]) for n, p in model.named_parameters())
    placement = dt.own(model, select=["blocks.0.*"])
    assert sorted(placement.names) == sorted(f"blocks.0.{m}.weight" for m in ("wq", "wo", "up", "down"))
    # a strict load: keys held elsewhere are not missing, a key missing for real still is (every rank)
    sd = model.state_dict()
    assert all((n in sd) == (placement.owner(n) == rank()) for n in placement.names), sorted(sd)
    model.load_state_dict(sd)
    del sd["embed.weight"]  # loaded before the owned modules, under their attribute name "weight"
    expect_same_error(lambda: model.load_state_dict(sd), RuntimeError, "embed.weight")
    # a matrix already owned is not eligible again
    expect_same_error(lambda: dt.own(model, select=["blocks.0.wq.weight"]), ValueError, "blocks.0.wq.weight")
    auto = dt.own(Net(), select="auto")
    assert all(why.startswith(("owner (cost)", "sharded (cost)")) for why in auto.choices.values()), auto.choices


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    ap.add_argument("--ckpt", default="")
    args = ap.parse_args()
    rank_, world = dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29512")))
    meshmuon.blas_set_num_threads(1)
    half = (2, world // 2) if world % 2 == 0 else (world,)
    cases = {
        "train_fsdp": lambda: case_train(world, (world,)),
        "train_hsdp": lambda: case_train(world, half, reshard=False, sync_first=False, reduce="gather"),
        "train_fsdp_gather": lambda: case_train(world, (world,), reduce="gather"),
        "mixed": lambda: case_mixed(world),
        "dcp_save_owner": lambda: case_dcp_save(world, args.ckpt + "/owner", True),
        "dcp_save_fsdp": lambda: case_dcp_save(world, args.ckpt + "/fsdp", False),
        "dcp_owner_to_owner": lambda: case_dcp_load(world, args.ckpt + "/owner", half, True),
        "dcp_owner_to_fsdp": lambda: case_dcp_load(world, args.ckpt + "/owner", (world,), False),
        "dcp_fsdp_to_owner": lambda: case_dcp_load(world, args.ckpt + "/fsdp", (world,), True),
        "dcp_fsdp_to_owner_hsdp": lambda: case_dcp_load(world, args.ckpt + "/fsdp", half, True),
        "dcp_negative": lambda: case_dcp_negative(world, args.ckpt),
        "bad_input": lambda: case_bad_input(world),
    }
    run_cases(cases, args.cases)


if __name__ == "__main__":
    guarded(main)
