# The torch.optim.Optimizer contract of meshmuon.torch.Muon around its state: copy.deepcopy and pickle
# give optimizers that step like the original; load_state_dict runs pre-hooks -> checks -> load ->
# post-hooks as torch does (and state_dict its hooks); torch.optim.Muon's state dicts load, other
# optimizers' are named. Every test steps and compares values.
import copy
import math
import pickle

import pytest
import torch

import meshmuon.torch as dt
from tolerances import per_step_bound


def params(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in shapes]


def set_grads(ps, seed):
    g = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def group_params(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def mixed(dtype=torch.float32):
    """A Muon group (two matrices) and an AdamW group (a vector), stepped 3 times."""
    w, v, b = params((8, 6), (6, 4), (6,), dtype=dtype)
    opt = dt.Muon([dict(params=[w, v]), dict(params=[b], algorithm="adamw", lr=0.01)], lr=0.02)
    for s in range(3):
        set_grads([w, v, b], s)
        opt.step()
    return opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_deepcopy_and_pickle_step_like_the_original(dtype, how):
    opt = mixed(dtype)
    c = copy.deepcopy(opt) if how == "deepcopy" else pickle.loads(pickle.dumps(opt))
    mine, theirs = group_params(opt), group_params(c)
    assert all(a is not b and torch.equal(a, b) for a, b in zip(mine, theirs)), how
    assert c.engine == opt.engine and c.engine_builds == opt.engine_builds
    for p, q in zip(mine, theirs):  # the state is the copy's own engine memory, equal values
        for key, value in opt.state[p].items():
            assert torch.equal(c.state[q][key], value), (how, key)
            assert c.state[q][key].data_ptr() != value.data_ptr(), (how, key)
    before = [p.detach().clone() for p in mine]
    state_before = {k: v.clone() for k, v in opt.state[mine[0]].items()}
    set_grads(theirs, 10)
    c.step()
    # the copy's step left the original alone...
    assert all(torch.equal(a, b) for a, b in zip(mine, before)), how
    assert all(torch.equal(opt.state[mine[0]][k], v) for k, v in state_before.items()), how
    # ...and equals the original's next step on the same gradients, bitwise
    set_grads(mine, 10)
    opt.step()
    for p, q, old in zip(mine, theirs, before):
        assert torch.equal(p, q), how
        assert not torch.equal(p, old), how  # it moved
    assert c.state[theirs[0]]["step"].item() == 4


def test_copy_keeps_options_and_the_state_of_parameters_without_grad():
    w, v = params((5, 5), (4, 6))
    opt = dt.Muon([w, v], lr=0.03, ns_steps=4, eps_mode="add", adamw_defaults=dict(lr=0.5))
    set_grads([w], 1)
    opt.step()  # v never had a gradient: its state is the initial one, step 0
    c = copy.deepcopy(opt)
    cw, cv = group_params(c)
    assert c.state[cv]["step"].item() == 0 and c.state[cw]["step"].item() == 1
    assert c.param_groups[0]["eps_mode"] == "add" and c._adamw_defaults["lr"] == 0.5
    assert "differentiable" not in c.defaults  # the base class's __setstate__ adds it
    assert {k for k in vars(opt) if not k.startswith("_")} == {k for k in vars(c) if not k.startswith("_")}
    opt.state["note"] = 1  # an entry not keyed by a parameter (as torch's hook tests add) is kept
    assert copy.deepcopy(opt).state["note"] == 1


def test_non_contiguous_bf16_parameter_steps_as_the_contiguous_one():
    base = torch.randn(6, 8).bfloat16()
    w = torch.nn.Parameter(base.t())
    c = torch.nn.Parameter(base.t().contiguous())
    initial = c.detach().clone()
    ow, oc = dt.Muon([w], lr=0.05), dt.Muon([c], lr=0.05)
    for s in range(2):
        g = torch.randn(8, 6).bfloat16()
        w.grad, c.grad = g.clone(), g.clone()
        ow.step(), oc.step()
    assert torch.equal(w, c) and not w.is_contiguous() and not torch.equal(c, initial)


def test_load_state_dict_hook_order():
    """pre-hooks (their dict replaces the input) -> checks -> load -> post-hooks (see the loaded
    state; what they replace sticks), as torch.optim.Optimizer.load_state_dict."""
    source = mixed()
    saved = source.state_dict()
    target = mixed()
    w = group_params(target)[0]
    marks = []

    def pre(opt, sd):  # returns a new dict whose momentum is 2x and whose lr differs
        marks.append("pre")
        sd = copy.deepcopy(sd)
        sd["state"][0]["momentum_buffer"] = sd["state"][0]["momentum_buffer"] * 2
        sd["param_groups"][0]["lr"] = 0.123
        return sd

    def post(opt):
        marks.append("post")
        # sees the loaded state, the pre-hook's values
        assert torch.equal(opt.state[w]["momentum_buffer"], saved["state"][0]["momentum_buffer"] * 2)
        opt.state[w]["momentum_buffer"] = torch.full_like(opt.state[w]["momentum_buffer"], 7.0)

    target.register_load_state_dict_pre_hook(pre)
    target.register_load_state_dict_post_hook(post)
    pointer = target.state[w]["momentum_buffer"].data_ptr()
    target.load_state_dict(saved)
    assert marks == ["pre", "post"]
    assert target.param_groups[0]["lr"] == 0.123
    buf = target.state[w]["momentum_buffer"]
    assert buf.data_ptr() == pointer and torch.equal(buf, torch.full_like(buf, 7.0))
    # the engine steps from the post-hook's value: as an optimizer loaded with 7s directly
    direct = mixed()
    sd = copy.deepcopy(saved)
    sd["state"][0]["momentum_buffer"].fill_(7.0)
    sd["param_groups"][0]["lr"] = 0.123
    direct.load_state_dict(sd)
    for o in (target, direct):
        set_grads(group_params(o), 20)
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(group_params(target), group_params(direct)))
    assert saved["param_groups"][0]["lr"] == 0.02  # the caller's dict is not modified


def test_load_state_dict_pre_hook_runs_before_the_checks():
    saved = mixed().state_dict()
    broken = copy.deepcopy(saved)
    broken["state"][0]["momentum"] = broken["state"][0].pop("momentum_buffer")  # renamed
    target = mixed()
    with pytest.raises(ValueError, match="lacks 'momentum_buffer'"):  # negative control
        target.load_state_dict(broken)

    def fix(opt, sd):
        sd["state"] = copy.copy(sd["state"])
        sd["state"][0] = dict(sd["state"][0])
        sd["state"][0]["momentum_buffer"] = sd["state"][0].pop("momentum")
        return sd

    target.register_load_state_dict_pre_hook(fix)
    target.load_state_dict(broken)
    w = group_params(target)[0]
    assert torch.equal(target.state[w]["momentum_buffer"], saved["state"][0]["momentum_buffer"])


def test_state_dict_hooks():
    opt = mixed()
    calls = []
    opt.register_state_dict_pre_hook(lambda o: calls.append("pre"))

    def post(o, sd):
        calls.append("post")
        sd = dict(sd)
        sd["extra"] = 1
        return sd

    opt.register_state_dict_post_hook(post)
    sd = opt.state_dict()
    assert calls == ["pre", "post"] and sd["extra"] == 1
    assert torch.equal(sd["state"][0]["momentum_buffer"], opt.state[group_params(opt)[0]]["momentum_buffer"])


# ---- torch.optim.Muon's state dicts -----------------------------------------------------------

LR, STEPS = 0.02, 3


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(64, 48, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(48, 16, bias=False))


@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_torch_muon_state_dict_loads_and_continues_as_torch(adjust_lr_fn, nesterov):
    torch.manual_seed(0)
    model = mlp()
    x, y = torch.randn(64, 32), torch.randn(64, 16)
    ref = torch.optim.Muon(model.parameters(), lr=LR, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)

    def grads(m):
        m.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        return [p.grad.clone() for p in m.parameters()]

    for _ in range(STEPS):
        grads(model)
        ref.step()
    saved = copy.deepcopy(ref.state_dict())
    twin = copy.deepcopy(model)
    # torch.optim.Muon's configuration in meshmuon: its positional arguments, bf16 rounding as torch's
    opt = dt.Muon(twin.parameters(), lr=LR, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn, ns_bf16=True)
    fresh = dt.Muon(copy.deepcopy(model).parameters(), lr=LR, nesterov=nesterov,
                    adjust_lr_fn=adjust_lr_fn, ns_bf16=True)
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["algorithm"] == "muon" and opt.param_groups[0]["ns_bf16"]
    for p, q in zip(model.parameters(), twin.parameters()):  # the buffers as torch's, bitwise
        assert torch.equal(opt.state[q]["momentum_buffer"], ref.state[p]["momentum_buffer"])
        assert opt.state[q]["step"].item() == 0  # torch.optim.Muon keeps no step count
    for _ in range(STEPS):  # the same gradients (torch's trajectory) to both: compares the optimizers
        for g, q, f in zip(grads(model), twin.parameters(), fresh.param_groups[0]["params"]):
            q.grad, f.grad = g.clone(), g.clone()
        ref.step(), opt.step(), fresh.step()
    for p, q, f in zip(model.parameters(), twin.parameters(), fresh.param_groups[0]["params"]):
        m, n = p.shape
        adj = LR * (0.2 * math.sqrt(max(m, n)) if adjust_lr_fn else math.sqrt(max(1.0, m / n)))
        bound = STEPS * adj * per_step_bound("ns_bf16", m, n)
        assert (p - q).abs().max().item() <= bound
        # the momentum carried over: torch's buffer; negative control: without it, far from it
        buf, fresh_buf = opt.state[q]["momentum_buffer"], fresh.state[f]["momentum_buffer"]
        assert torch.allclose(buf, ref.state[p]["momentum_buffer"], rtol=1e-5, atol=1e-7)
        assert not torch.allclose(fresh_buf, ref.state[p]["momentum_buffer"], rtol=1e-2, atol=1e-4)


def test_torch_muon_state_dict_of_a_parameter_not_yet_stepped_starts_from_zero():
    w, v = params((6, 6), (6, 3))
    ref = torch.optim.Muon([w, v], lr=LR)
    w.grad = torch.randn(6, 6)
    ref.step()  # v has no gradient: torch made no state for it
    saved = ref.state_dict()
    assert 1 not in saved["state"]
    a, b = params((6, 6), (6, 3), seed=1)
    opt = dt.Muon([a, b], lr=LR)
    set_grads([a, b], 3)
    opt.step()  # b's buffer is nonzero before the load
    opt.load_state_dict(saved)
    assert torch.equal(opt.state[a]["momentum_buffer"], ref.state[w]["momentum_buffer"])
    assert not opt.state[b]["momentum_buffer"].any()


def test_torch_muon_state_dict_into_a_group_that_cannot_take_it():
    w = params((6, 6))[0]
    ref = torch.optim.Muon([w], lr=LR)
    w.grad = torch.randn(6, 6)
    ref.step()
    saved = ref.state_dict()
    with pytest.raises(ValueError, match="normuon_v"):
        dt.Muon(params((6, 6)), normuon=True).load_state_dict(saved)
    with pytest.raises(ValueError, match="momentum_kind='ema'"):
        dt.Muon(params((6, 6)), momentum_kind="heavy_ball").load_state_dict(saved)
    with pytest.raises(ValueError, match="this optimizer's is 'adamw'"):
        dt.Muon([dict(params=params((6, 6)), algorithm="adamw")]).load_state_dict(saved)


def test_another_optimizers_state_dict_is_named():
    w = params((6, 6))[0]
    adamw = torch.optim.AdamW([w])
    w.grad = torch.randn(6, 6)
    adamw.step()
    target = dt.Muon([dict(params=params((6, 6)), algorithm="adamw")])
    before = {k: v.clone() for k, v in target.state[group_params(target)[0]].items()}
    with pytest.raises(ValueError, match=r"not meshmuon.torch.Muon's or torch.optim.Muon's.*"
                                         r"torch.optim.Adam / AdamW.*load it into the optimizer that saved it"):
        target.load_state_dict(adamw.state_dict())
    assert all(torch.equal(target.state[group_params(target)[0]][k], v) for k, v in before.items())
    nanochat = {"state": {0: {"momentum_buffer": torch.zeros(6, 6)}},
                "param_groups": [{"kind": "muon", "params": [0], "lr": 0.02, "momentum": 0.95}]}
    with pytest.raises(ValueError, match="nanochat's MuonAdamW"):
        dt.Muon(params((6, 6))).load_state_dict(nanochat)
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    sgd.step()
    with pytest.raises(ValueError, match=r"torch.optim.SGD"):
        dt.Muon(params((6, 6))).load_state_dict(sgd.state_dict())
