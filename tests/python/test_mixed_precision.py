"""bf16 parameters with fp32 masters in one process (meshmuon.torch.Muon, docs/python.md "Mixed
precision"): the masters are BITWISE the fp32 run given the same gradients, every bf16 parameter is
its master rounded to nearest even (checked against an integer RNE, not torch's own conversion), the
masters are state key "master" and round-trip through state_dict bitwise."""
from __future__ import annotations

import copy
import io
import zlib

import pytest
import torch
import torch.nn as nn

import meshmuon.torch as dt

MUON = dict(lr=0.02, weight_decay=0.1)
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.fc1 = nn.Linear(8, 24)
        self.norm = nn.LayerNorm(24)
        self.fc2 = nn.Linear(24, 16, bias=False)
        self.experts = nn.Parameter(torch.randn(3, 6, 5) * 0.3)


def groups(model, normuon=True):
    return dt.param_groups(model, muon=dict(MUON, normuon=normuon), adamw=ADAMW)


def grad_for(name, shape, step):
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{step}".encode()))
    return torch.randn(*shape, generator=g)


def set_grads(model, step, dtype):
    for name, p in model.named_parameters():
        # bf16-representable values, so the fp32 reference sees exactly the bf16 run's gradients
        p.grad = grad_for(name, p.shape, step).to(torch.bfloat16).to(dtype)


def rne_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 round to nearest even, in integer arithmetic (finite inputs)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = torch.where(rounded >= 0x8000, rounded - 0x10000, rounded)
    return rounded.to(torch.int16).view(torch.bfloat16)


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def make_pair(seed=0):
    torch.manual_seed(seed)
    model = Net().to(torch.bfloat16)
    ref = copy.deepcopy(model).to(torch.float32)  # exact: bf16 values widened
    return model, ref


def test_bf16_masters_match_fp32_run_bitwise():
    model, ref = make_pair()
    opt = dt.Muon(groups(model), **MUON)
    ref_opt = dt.Muon(groups(ref), **MUON)
    assert opt.engine == "local"
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    for step in range(3):
        set_grads(model, step, torch.bfloat16)
        set_grads(ref, step, torch.float32)
        opt.step()
        ref_opt.step()
    ref_params = dict(ref.named_parameters())
    rounded_differs = 0
    for name, p in model.named_parameters():
        r = ref_params[name].detach()
        master = opt.state[p]["master"]
        assert master.dtype == torch.float32 and master.shape == p.shape
        assert same(master, r), f"{name}: master differs from the fp32 run"
        assert p.dtype == torch.bfloat16 and p.data_ptr() == ptrs[name]
        assert same(p.detach(), rne_bf16(r)), f"{name}: bf16 parameter is not RNE(master)"
        # negative control: the master keeps bits the bf16 parameter does not
        rounded_differs += int((p.detach().float() != master).sum())
        for key in opt.state[p]:
            if key not in ("master", "step"):
                assert same(opt.state[p][key], ref_opt.state[ref_params[name]][key]), (name, key)
    assert rounded_differs > 0


def test_bf16_masters_state_dict_round_trip():
    model, _ = make_pair(1)
    opt = dt.Muon(groups(model), **MUON)
    for step in range(2):
        set_grads(model, step, torch.bfloat16)
        opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    saved = opt.state_dict()
    assert all("master" in saved["state"][k] for k in saved["state"])
    # uninterrupted
    for step in range(2, 4):
        set_grads(model, step, torch.bfloat16)
        opt.step()
    # resumed: a fresh model/optimizer with other values, loaded
    buf.seek(0)
    ck = torch.load(buf)
    model2, _ = make_pair(2)
    opt2 = dt.Muon(groups(model2), **MUON)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["optim"])
    for step in range(2, 4):
        set_grads(model2, step, torch.bfloat16)
        opt2.step()
    p2 = dict(model2.named_parameters())
    for name, p in model.named_parameters():
        assert same(p.detach(), p2[name].detach()), name
        for key, value in opt.state[p].items():
            assert same(value, opt2.state[p2[name]][key]), (name, key)
    # negative control: a state dict without the masters is refused before anything changes
    bad = copy.deepcopy(ck["optim"])
    for entry in bad["state"].values():
        entry.pop("master", None)
    with pytest.raises(ValueError, match="master"):
        opt2.load_state_dict(bad)


def test_mixed_fp32_and_bf16_parameters_and_bad_dtypes():
    torch.manual_seed(3)
    a = nn.Parameter(torch.randn(8, 6).to(torch.bfloat16))
    b = nn.Parameter(torch.randn(8, 6))
    opt = dt.Muon([dict(params=[("a", a), ("b", b)])], **MUON)
    assert "master" in opt.state[a] and "master" not in opt.state[b]
    a.grad = torch.ones(8, 6, dtype=torch.bfloat16)
    b.grad = torch.ones(8, 6)
    opt.step()
    assert same(a.detach(), rne_bf16(opt.state[a]["master"]))
    h = nn.Parameter(torch.randn(4, 4).half())
    with pytest.raises(TypeError, match="float16"):
        dt.Muon([dict(params=[("h", h)])])
