# meshmuon.torch.Muon(offload_state=True): parameters and every state tensor bitwise equal to the same
# run without offload, on the local and the distributed engine (one process) and ZeRO, for Muon
# (EMA with and without Nesterov), NorMuon with heavy ball, an expert stack and AdamW; the counters
# in last_step_stats; a state_dict saved from an offloading optimizer resumes bitwise; bad values
# of the kwarg are a ValueError naming it; meshmuon.LocalOptimizer / meshmuon.Optimizer take it too.
import copy

import pytest
import torch

import meshmuon
import meshmuon.torch as dt


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.a = torch.nn.Parameter(torch.randn(24, 10, generator=g))
        self.b = torch.nn.Parameter(torch.randn(10, 17, generator=g))
        self.c = torch.nn.Parameter(torch.randn(6, 6, generator=g))
        self.experts = torch.nn.Parameter(torch.randn(3, 5, 8, generator=g))
        self.bias = torch.nn.Parameter(torch.randn(17, generator=g))
        self.gain = torch.nn.Parameter(torch.randn(4, 6, generator=g))

    def forward(self, x):
        h = torch.tanh(x @ self.a) @ self.b + self.bias
        e = torch.einsum("eab,b->ea", self.experts, h[:, :8].mean(0)).sum()
        return (h ** 2).mean() + e + (self.c @ self.c).sum() * 1e-2 + self.gain.square().mean()


def groups(m):
    return [
        {"params": [m.a], "lr": 0.02},  # EMA, Nesterov
        {"params": [m.c], "lr": 0.03, "nesterov": False},
        {"params": [m.b], "lr": 0.01, "normuon": True, "momentum_kind": "heavy_ball"},
        {"params": [m.experts], "expert_stacks": True, "lr": 0.02},
        {"params": [m.bias, m.gain], "algorithm": "adamw", "lr": 0.005},
    ]


def train(offload, steps=4, **kw):
    m = Net()
    opt = dt.Muon(groups(m), offload_state=offload, **kw)
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(7))
    stats = []
    for _ in range(steps):
        opt.zero_grad()
        m(x).backward()
        opt.step()
        stats.append(opt.last_step_stats)
    return m, opt, stats


def bits(m, opt):
    out = [p.detach().clone().view(torch.int32) for p in m.parameters()]
    for p in m.parameters():
        for key, t in sorted(opt.state[p].items()):
            if key != "step":
                out.append(t.detach().clone().contiguous().view(torch.int32))
    return out


def same_bits(x, y):
    return len(x) == len(y) and all(torch.equal(a, b) for a, b in zip(x, y))


@pytest.mark.parametrize("kw", [dict(), dict(threads=2), dict(engine="distributed", chunk_bytes=512),
                                dict(engine="distributed", chunk_bytes=512, window=1), dict(zero=True)],
                         ids=["local", "local-threads2", "distributed", "distributed-window1", "zero"])
def test_offload_is_bitwise_no_offload(kw):
    m0, opt0, stats0 = train(False, **kw)
    m1, opt1, stats1 = train(True, **kw)
    assert same_bits(bits(m0, opt0), bits(m1, opt1))
    state_bytes = sum(t.numel() * 4 for p in m1.parameters() for k, t in opt1.state[p].items()
                      if k not in ("step", "master"))  # ZeRO's fp32 master is the parameter, not state
    for s0, s1 in zip(stats0, stats1):
        assert s0["offload_bytes_in"] == s0["offload_bytes_out"] == s0["peak_state_resident_bytes"] == 0
        assert s1["offload_bytes_in"] == s1["offload_bytes_out"] == state_bytes
        assert 0 < s1["peak_state_resident_bytes"]


def test_negative_control_one_ulp_is_caught():
    m0, opt0, _ = train(False, steps=2)
    m1, opt1, _ = train(True, steps=2)
    b1 = bits(m1, opt1)
    b1[0].view(-1)[0] += 1  # one ulp
    assert not same_bits(bits(m0, opt0), b1)


def test_state_dict_of_an_offloading_optimizer_resumes_bitwise():
    ref, opt_ref, _ = train(False, steps=4)
    m = Net()
    opt = dt.Muon(groups(m), offload_state=True)
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(7))
    for _ in range(2):
        opt.zero_grad()
        m(x).backward()
        opt.step()
    saved_model, saved_opt = copy.deepcopy(m.state_dict()), copy.deepcopy(opt.state_dict())
    m2 = Net()
    m2.load_state_dict(saved_model)
    opt2 = dt.Muon(groups(m2), offload_state=True)
    opt2.load_state_dict(saved_opt)
    for _ in range(2):
        opt2.zero_grad()
        m2(x).backward()
        opt2.step()
    assert same_bits(bits(ref, opt_ref), bits(m2, opt2))


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_bad_offload_state_names_the_option(bad):
    with pytest.raises(ValueError, match="offload_state"):
        dt.Muon(groups(Net()), offload_state=bad)


def test_core_optimizers_take_offload_state():
    info = meshmuon.ParamInfo()
    info.name, info.shape = "w", [8, 5]
    g = meshmuon.ParamGroup()
    g.params = [0]
    w = {}
    for offload in (False, True):
        opt = meshmuon.LocalOptimizer([info], [g], offload_state=offload)
        p = torch.linspace(-1, 1, 40).reshape(8, 5).contiguous()
        for t in range(3):
            opt.step([p], [torch.cos(p * (t + 1))])
        w[offload] = (p.view(torch.int32).clone(), opt.last_stats())
    assert torch.equal(w[False][0], w[True][0])
    assert w[False][1]["offload_bytes_in"] == 0 and w[True][1]["offload_bytes_in"] == 8 * 5 * 4
