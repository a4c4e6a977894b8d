# PyTorch's own optimizer contract, checked on meshmuon.torch.Muon as a user would: an OptimizerInfo for
# meshmuon.torch.Muon made from torch.optim.Muon's entry in torch's optim_db
# (torch.testing._internal.common_optimizers: its optim_inputs_func, optim_error_inputs_func,
# scheduler_inputs and supports_* flags), and the checks of test/test_optim.py's TestOptimRenewed
# that apply to a CPU float32 optimizer without foreach / fused / capturable / complex / sparse
# support, reproduced here (test/test_optim.py is not in the wheel). Every check runs on
# torch.optim.Muon too, as the control: the harness passes it, so a check that meshmuon passes is one
# torch's own Muon passes, not a vacuous one.
#
# Where the test file uses 1-D parameters (a bias) torch.optim.Muon cannot take them, so the checks
# use 2-D ones ([10, 1] for the bias) for both optimizers.
import copy
import functools
import io
import pickle

import pytest
import torch
from torch.nn import Parameter
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

import meshmuon.torch as dt
from meshmuon.torch._options import MUON_DEFAULTS
from meshmuon.torch._state_dict import TORCH_MUON_KEYS

# torch's test helpers import expecttest (pinned in scripts/requirements.txt, installed by make setup)
from torch.testing._internal.common_optimizers import OptimizerErrorEnum, optim_db  # noqa: E402

DEVICE, DTYPE = "cpu", torch.float32
TORCH_INFO = next(info for info in optim_db if info.optim_cls is torch.optim.Muon)
MESHMUON_INFO = copy.copy(TORCH_INFO)
MESHMUON_INFO.optim_cls = dt.Muon
# The group keys meshmuon has beyond torch.optim.Muon's (its options added later): a dict or a pickled
# optimizer of an older meshmuon lacks some, and loading must fill them from the defaults as torch's
# optimizers fill theirs. torch's Muon entry has none (its not_og_supported_flags is empty), so the
# check test_can_load_older_state_dict would be vacuous on meshmuon without these.
MESHMUON_INFO.not_og_supported_flags = tuple(sorted(
    set(MUON_DEFAULTS) - TORCH_MUON_KEYS))
INFOS = {"meshmuon": MESHMUON_INFO, "torch": TORCH_INFO}

# Error inputs of torch's Muon entry whose wording cannot apply to meshmuon, and what meshmuon does instead
# (checked in test_errors in their place).
MESHMUON_DIFFERS = {
    "only support 2D parameters": (
        "meshmuon takes 3-D [E, A, B] expert stacks in groups with expert_stacks=True; without it the "
        "error names that option", ValueError, "expert_stacks=True"),
    "does not support complex parameters": (
        "meshmuon checks dtypes at construction (fp32, or bf16 with fp32 masters), not at the step",
        TypeError, "complex64; meshmuon takes fp32 parameters"),
}


def inputs(info):
    return info.optim_inputs_func(device=DEVICE)


def weight_bias(contiguous=True):
    if contiguous:
        return Parameter(torch.randn(10, 5)), Parameter(torch.randn(10, 1))
    return Parameter(torch.randn(10, 5, 2)[..., 0]), Parameter(torch.randn(10, 1, 2)[..., 0])


def loss_of(weight, bias, x):
    return (weight.mv(x) + bias[:, 0]).pow(2).sum()


def fwd_bwd(optimizer, weight, bias, x):
    optimizer.zero_grad()
    loss = loss_of(weight, bias, x)
    loss.backward()
    return loss


def params_with_grads(n=2):
    params = [Parameter(torch.randn(2, 3)) for _ in range(n)]
    for p in params:
        p.grad = torch.rand_like(p)
    return params


def assert_equal(a, b):
    """TestCase.assertEqual: tensors within its float32 tolerances, containers item by item, other
    values equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (a.keys(), getattr(b, "keys", None))
        for key in a:
            assert_equal(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_equal(x, y)
    else:
        assert a == b, (a, b)


# ---- the checks (TestOptimRenewed's names) ---------------------------------------------------------

def test_optim_infos_do_not_specify_global_cliquey_kwargs(info):
    for optim_input in inputs(info):
        assert not any(f in optim_input.kwargs for f in ("foreach", "fused", "differentiable"))


def test_errors(info):
    for error_input in info.optim_error_inputs_func(device=DEVICE, dtype=DTYPE):
        optim_input = error_input.optimizer_error_input
        params, kwargs = optim_input.params, optim_input.kwargs
        kind, regex = error_input.error_type, error_input.error_regex
        if info is MESHMUON_INFO and optim_input.desc in MESHMUON_DIFFERS:
            _, kind, regex = MESHMUON_DIFFERS[optim_input.desc]
            with pytest.raises(kind, match=regex):
                info.optim_cls(params, **kwargs)
            continue
        if error_input.error_on == OptimizerErrorEnum.CONSTRUCTION_ERROR:
            if issubclass(kind, Warning):
                with pytest.warns(kind, match=regex):
                    info.optim_cls(params, **kwargs)
            else:
                with pytest.raises(kind, match=regex):
                    info.optim_cls(params, **kwargs)
        else:
            optimizer = info.optim_cls(params, **kwargs)
            with pytest.raises(kind, match=regex):
                optimizer.step()


def forloop_goes_right_direction(info, contiguous, with_lrsched):
    for schedulers_constructor in (info.scheduler_inputs if with_lrsched else [None]):
        for optim_input in inputs(info):  # fresh inputs: a Tensor lr is mutated by the schedulers
            weight, bias = weight_bias(contiguous)
            x = torch.randn(5)
            optimizer = info.optim_cls([weight, bias], **optim_input.kwargs)
            schedulers = [s(optimizer) for s in (schedulers_constructor or [])]
            closure = functools.partial(fwd_bwd, optimizer, weight, bias, x)
            initial = closure().item()
            for _ in range(20):
                loss = closure()
                optimizer.step()
                for scheduler in schedulers:
                    scheduler.step(loss) if isinstance(scheduler, ReduceLROnPlateau) else scheduler.step()
            assert closure().item() < initial, optim_input.desc
            assert weight.is_contiguous() == contiguous


def test_param_group_with_lrscheduler_goes_right_direction(info):
    for schedulers_c in info.scheduler_inputs:
        weight, bias = weight_bias()
        x = torch.randn(5)
        optimizer = info.optim_cls([{"params": [weight]}, {"params": [bias], "lr": 0.01}])
        schedulers = [s(optimizer) for s in schedulers_c]
        closure = functools.partial(fwd_bwd, optimizer, weight, bias, x)
        initial = closure().item()
        for _ in range(20):
            loss = optimizer.step(closure)
            for scheduler in schedulers:
                scheduler.step(loss) if isinstance(scheduler, ReduceLROnPlateau) else scheduler.step()
        assert closure().item() < initial


def test_tensor_lr(info):
    for optim_input in inputs(info):
        weight, bias = weight_bias()
        weight_c = weight.detach().clone().requires_grad_(True)
        bias_c = bias.detach().clone().requires_grad_(True)
        x = torch.randn(5)
        kwargs = dict(optim_input.kwargs)
        kwargs["lr"] = 1e-3
        optimizer_r = info.optim_cls([weight, bias], **kwargs)
        kwargs["lr"] = torch.tensor(kwargs["lr"])
        optimizer = info.optim_cls([weight_c, bias_c], **kwargs)
        for _ in range(5):
            fwd_bwd(optimizer_r, weight, bias, x)
            fwd_bwd(optimizer, weight_c, bias_c, x)
            optimizer_r.step()
            optimizer.step()
            assert_equal(weight, weight_c)
            assert_equal(bias, bias_c)


def test_step_is_noop_when_params_have_no_grad(info):
    params = [torch.randn(2, 3, requires_grad=False) for _ in range(2)]
    old = [p.detach().clone() for p in params]
    for optim_input in inputs(info):
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        optimizer.step(lambda: torch.tensor([1.0]))
        assert all(torch.equal(a, b) for a, b in zip(params, old))


def test_step_is_noop_for_zero_grads(info):
    """TestOptimRenewed skips inputs with a nonzero weight_decay key, but Muon's *default* weight
    decay is 0.1 (decoupled: applied whatever the gradient), so the check is that a zero gradient
    moves the parameter by the decay alone: exactly p * (1 - lr * wd), and not at all with wd 0."""
    for optim_input in inputs(info):
        for wd in (0.0, optim_input.kwargs.get("weight_decay", 0.1)):
            param = torch.randn(5, 1, requires_grad=True)
            old = param.detach().clone()
            kwargs = dict(optim_input.kwargs, weight_decay=wd)
            optimizer = info.optim_cls([param], **kwargs)
            param.grad = torch.zeros_like(param)
            optimizer.step(lambda: torch.tensor([1.0]))
            lr = float(kwargs.get("lr", 1e-3))
            assert_equal(param.detach(), old * (1 - lr * wd))


def test_optimizer_can_be_printed(info):
    params = [Parameter(torch.randn(2, 3)) for _ in range(2)]
    for optim_input in inputs(info):
        text = repr(info.optim_cls(params, **optim_input.kwargs))
        assert "Parameter Group 0" in text and "lr:" in text


def test_state_dict_deterministic(info):
    for optim_input in inputs(info):
        weight, bias = Parameter(torch.randn(2, 3)), Parameter(torch.randn(2, 1))
        x = torch.randn(3)
        optimizer = info.optim_cls([weight, bias], **optim_input.kwargs)
        closure = functools.partial(fwd_bwd, optimizer, weight, bias, x)
        for _ in range(10):
            closure()
            optimizer.step()
        with torch.no_grad():
            weight_c, bias_c = Parameter(weight.clone()), Parameter(bias.clone())
        optimizer_c = info.optim_cls([weight_c, bias_c], **optim_input.kwargs)
        closure_c = functools.partial(fwd_bwd, optimizer_c, weight_c, bias_c, x)
        optimizer_c.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        for _ in range(10):
            closure()
            optimizer.step()
            closure_c()
            optimizer_c.step()
            assert_equal(weight, weight_c)
            assert_equal(bias, bias_c)
        assert_equal(optimizer.state_dict(), optimizer_c.state_dict())
        # repeated parameters have identical representations (pytorch#36831)
        optimizer_c.param_groups.extend(optimizer_c.param_groups)
        assert_equal(optimizer.state_dict()["param_groups"][-1],
                     optimizer_c.state_dict()["param_groups"][-1])


def test_can_load_older_state_dict(info):
    for optim_input in inputs(info):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(2, 3, bias=False), torch.nn.Sigmoid(),
                                    torch.nn.Linear(3, 1, bias=False), torch.nn.Sigmoid())
        x = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]).reshape(3, 2)
        optimizer = info.optim_cls(model.parameters(), **optim_input.kwargs)

        def step():
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()

        for _ in range(3):
            step()
        old = copy.deepcopy(optimizer.state_dict())
        for group in old["param_groups"]:
            for flag in info.not_og_supported_flags:
                group.pop(flag, None)
        optimizer.load_state_dict(old)
        step()  # can still step


def test_can_unpickle_older_optimizer(info):
    """Not a TestOptimRenewed test: an optimizer pickled by an older version (its groups and
    defaults without the newer keys) unpickles, steps, and steps as the original (torch's
    optimizers fill such keys in __setstate__: group.setdefault("foreach", None), ...)."""
    for optim_input in inputs(info):
        params = params_with_grads()
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        for _ in range(3):
            optimizer.step()
        state = optimizer.__getstate__()
        state = dict(state, param_groups=[dict(g) for g in state["param_groups"]],
                     defaults=dict(state["defaults"]))
        for group in [state["defaults"]] + state["param_groups"]:
            for flag in info.not_og_supported_flags:
                group.pop(flag, None)
        older = info.optim_cls.__new__(info.optim_cls)  # as pickle makes it
        older.__setstate__(pickle.loads(pickle.dumps(state)))
        copies = [p for g in older.param_groups for p in g["params"]]
        for p, q in zip(params, copies):  # a new gradient, so the step depends on the momentum
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        optimizer.step()
        older.step()
        assert all(torch.equal(p, q) for p, q in zip(params, copies)), optim_input.desc
        for flag in info.not_og_supported_flags:
            assert all(g[flag] == optimizer.defaults[flag] for g in older.param_groups), flag


def older_model():
    """The model of torch's state-dict checks for Muon: 2-D weights only."""
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(2, 3, bias=False), torch.nn.Sigmoid(),
                               torch.nn.Linear(3, 1, bias=False), torch.nn.Sigmoid())


def can_load_from_to_named_state_dict(info, is_named_optim0, is_named_optim1):
    """TestOptimRenewed.test_can_load_from_to_named_state_dict (parametrized over both flags): a
    state dict of an optimizer given named_parameters() or parameters() loads into one given
    either, steps, and keeps the parameter names when either side had them."""
    for optim_input in inputs(info):
        model = older_model()
        x = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]).reshape(3, 2)

        def step(optimizer):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()

        params = model.named_parameters() if is_named_optim0 else model.parameters()
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        for _ in range(3):
            step(optimizer)
        old = copy.deepcopy(optimizer.state_dict())
        params = model.named_parameters() if is_named_optim1 else model.parameters()
        optimizer2 = info.optim_cls(params, **optim_input.kwargs)
        optimizer2.load_state_dict(old)
        step(optimizer2)
        if is_named_optim0 or is_named_optim1:
            assert optimizer2.state_dict()["param_groups"][0]["param_names"] == ["0.weight", "2.weight"]


def test_save_load_equality_with_weights_only(info, is_named_optim=False):
    for optim_input in inputs(info):
        weight, bias = Parameter(torch.randn(2, 3)), Parameter(torch.randn(2, 1))
        x = torch.randn(3)
        params = [("name0", weight), ("name1", bias)] if is_named_optim else [weight, bias]
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        closure = functools.partial(fwd_bwd, optimizer, weight, bias, x)
        for _ in range(3):
            optimizer.step(closure)
        sd = optimizer.state_dict()
        buffer = io.BytesIO()
        torch.save(sd, buffer)
        buffer.seek(0)
        assert_equal(torch.load(buffer, weights_only=False), sd)
        buffer.seek(0)
        assert_equal(torch.load(buffer, weights_only=True), sd)


def test_load_nontensor_step(info):
    params = params_with_grads()
    for optim_input in inputs(info):
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        for _ in range(3):
            optimizer.step()
        state_dict = copy.deepcopy(optimizer.state_dict())
        for p_state in state_dict["state"].values():
            if torch.is_tensor(p_state.get("step")):
                p_state["step"] = p_state["step"].item()
        optimizer.load_state_dict(state_dict)
        optimizer.step()


def test_deepcopy_copies_all_public_attrs(info):
    params = params_with_grads()
    for optim_input in inputs(info):
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        for _ in range(3):
            optimizer.step()

        def public(obj):
            return {k for k in obj.__dict__ if not k.startswith("_")}

        assert public(optimizer) == public(copy.deepcopy(optimizer))


def copy_steps_as_the_original(info, how):
    """Not a TestOptimRenewed test (it only compares attributes): a copy must also step, from
    its own state, as the original's next step."""
    for optim_input in inputs(info):
        params = params_with_grads()
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        for _ in range(3):
            optimizer.step()
        c = copy.deepcopy(optimizer) if how == "deepcopy" else pickle.loads(pickle.dumps(optimizer))
        copies = [p for g in c.param_groups for p in g["params"]]
        for p, q in zip(params, copies):
            q.grad = p.grad.clone()
        before = [p.detach().clone() for p in params]
        c.step()
        assert all(torch.equal(p, b) for p, b in zip(params, before))  # the original untouched
        optimizer.step()
        for p, q, b in zip(params, copies, before):
            assert torch.equal(p, q) and not torch.equal(p, b)
            for key, value in optimizer.state[p].items():
                assert torch.equal(c.state[q][key], value), key


def step_hook(info, register, start, after_two):
    """torch's test_step_post_hook / test_step_pre_hook (CHECKS below): a hook runs at each step until
    removed."""
    data = start

    def hook(opt, args, kwargs):
        nonlocal data
        data += 2

    params = [torch.tensor([[1.0, 1.0]])]
    for optim_input in inputs(info):
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        data = start
        handle = getattr(optimizer, register)(hook)
        optimizer.step()
        optimizer.step()
        assert data == after_two
        handle.remove()
        optimizer.step()
        assert data == after_two


def test_step_all_hooks(info):
    def global_pre(opt, args, kwargs):
        data.append(0)

    def global_post(opt, args, kwargs):
        data.append(5)

    def local_pre(opt, args, kwargs):
        data.append(1)

    def local_post(opt, args, kwargs):
        data.append(2)

    params = [torch.tensor([[1.0, 1.0]])]
    for optim_input in inputs(info):
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        optimizer2 = torch.optim.SGD(params)
        data = []
        handles = [register_optimizer_step_pre_hook(global_pre),
                   register_optimizer_step_post_hook(global_post),
                   optimizer.register_step_pre_hook(local_pre),
                   optimizer.register_step_post_hook(local_post)]
        try:
            optimizer.step()
            assert data == [0, 1, 2, 5]
            optimizer2.step()
            assert data == [0, 1, 2, 5, 0, 5]
            optimizer.step()
            assert data == [0, 1, 2, 5, 0, 5, 0, 1, 2, 5]
        finally:
            for handle in handles:
                handle.remove()
        optimizer.step()
        optimizer2.step()
        assert data == [0, 1, 2, 5, 0, 5, 0, 1, 2, 5]


def _state_dict_pre_hook(optimizer):
    optimizer.state["test"] = 1


def _state_dict_post_hook(optimizer, state_dict):
    if "test" in state_dict["state"]:
        state_dict["state"].pop("test")
        state_dict["ran_state_dict_pre_hook"] = True
    else:
        state_dict["ran_state_dict_pre_hook"] = False
    return state_dict


def test_state_dict_pre_hook(info):
    param = torch.rand(2, 3, requires_grad=True)
    param.grad = torch.rand(2, 3)
    for optim_input in inputs(info):
        optimizer = info.optim_cls([param], **optim_input.kwargs)
        optimizer.register_state_dict_pre_hook(_state_dict_pre_hook)
        assert optimizer.state_dict()["state"]["test"] == 1


def test_state_dict_post_hook(info):
    param = torch.rand(2, 3, requires_grad=True)
    param.grad = torch.rand(2, 3)
    for optim_input in inputs(info):
        optimizer = info.optim_cls([param], **optim_input.kwargs)
        optimizer.register_state_dict_post_hook(_state_dict_post_hook)
        assert optimizer.state_dict()["ran_state_dict_pre_hook"] is False


def test_state_dict_pre_post_hook(info):
    param = torch.rand(2, 3, requires_grad=True)
    param.grad = torch.rand(2, 3)
    for optim_input in inputs(info):
        optimizer = info.optim_cls([param], **optim_input.kwargs)
        optimizer.register_state_dict_pre_hook(_state_dict_pre_hook)
        optimizer.register_state_dict_post_hook(_state_dict_post_hook)
        state_dict = optimizer.state_dict()
        assert "test" not in state_dict["state"] and state_dict["ran_state_dict_pre_hook"] is True


def _load_state_dict_pre_hook1(optimizer, state_dict):
    state_dict["param_groups"][0]["lr"] = 0.002


def _load_state_dict_pre_hook2(optimizer, state_dict):
    my_state_dict = copy.deepcopy(state_dict)  # a returned dict must be the one used
    my_state_dict["param_groups"][0]["lr"] = 0.003
    return my_state_dict


def _load_state_dict_post_hook(optimizer):
    optimizer.state["ran_load_state_dict_pre_hook2"] = optimizer.param_groups[0]["lr"] == 0.003
    optimizer.state["ran_load_state_dict_post_hook"] = True


def test_load_state_dict_pre_hook_and_prepend(info):
    param = torch.rand(2, 3, requires_grad=True)
    param.grad = torch.rand(2, 3)
    for optim_input in inputs(info):
        optimizer = info.optim_cls([param], **optim_input.kwargs)
        state_dict = optimizer.state_dict()
        optimizer.register_load_state_dict_pre_hook(_load_state_dict_pre_hook1)
        optimizer.load_state_dict(state_dict)
        assert optimizer.param_groups[0]["lr"] == 0.002
        optimizer.register_load_state_dict_pre_hook(_load_state_dict_pre_hook2, prepend=True)
        optimizer.load_state_dict(state_dict)
        assert optimizer.param_groups[0]["lr"] == 0.002  # prepended: hook1 runs last


def test_load_state_dict_post_hook(info):
    param = torch.rand(2, 3, requires_grad=True)
    param.grad = torch.rand(2, 3)
    for optim_input in inputs(info):
        optimizer = info.optim_cls([param], **optim_input.kwargs)
        optimizer.register_load_state_dict_post_hook(_load_state_dict_post_hook)
        optimizer.load_state_dict(optimizer.state_dict())
        assert not optimizer.state["ran_load_state_dict_pre_hook2"]
        assert optimizer.state["ran_load_state_dict_post_hook"]


def test_load_state_dict_pre_post_hook(info):
    param = torch.rand(2, 3, requires_grad=True)
    param.grad = torch.rand(2, 3)
    for optim_input in inputs(info):
        optimizer = info.optim_cls([param], **optim_input.kwargs)
        optimizer.register_load_state_dict_pre_hook(_load_state_dict_pre_hook2)
        optimizer.register_load_state_dict_post_hook(_load_state_dict_post_hook)
        optimizer.load_state_dict(optimizer.state_dict())
        assert optimizer.state["ran_load_state_dict_pre_hook2"]
        assert optimizer.state["ran_load_state_dict_post_hook"]


def test_non_empty_state(info):
    model = torch.nn.Linear(5, 5, bias=False)
    x = torch.rand(2, 5)
    for optim_input in inputs(info):
        optimizer = info.optim_cls(model.parameters(), **optim_input.kwargs)
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        assert optimizer.state and all(len(state) > 0 for state in optimizer.state.values())


def test_param_groups_weight_decay(info):
    for optim_input in inputs(info):
        weight, bias = weight_bias()
        x = torch.randn(5)
        bias_kwargs = dict(optim_input.kwargs, weight_decay=0.0)
        optimizer = info.optim_cls([dict(params=[weight], **optim_input.kwargs),
                                    dict(params=[bias], **bias_kwargs)])
        initial = loss_of(weight, bias, x).item()
        for _ in range(20):
            loss = fwd_bwd(optimizer, weight, bias, x)
            optimizer.step()
        assert loss.item() < initial


def test_param_groups_lr(info):
    for optim_input in inputs(info):
        weight, bias = weight_bias()
        x = torch.randn(5)
        kwargs = {k: v for k, v in optim_input.kwargs.items() if k != "lr"}
        optimizer = info.optim_cls([dict(params=[weight], **kwargs),
                                    dict(params=[bias], lr=0.01, **kwargs)])
        initial = loss_of(weight, bias, x).item()
        for _ in range(20):
            loss = fwd_bwd(optimizer, weight, bias, x)
            optimizer.step()
        assert loss.item() < initial


# ---- what the brief also lists: zero_grad, add_param_group, an empty gradient -----------------------

def test_zero_grad(info):
    params = params_with_grads()
    optimizer = info.optim_cls(params)
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in params)
    optimizer.zero_grad()
    assert all(p.grad is None for p in params)


def test_add_param_group(info):
    for optim_input in inputs(info):
        first, later = params_with_grads(), params_with_grads(1)
        optimizer = info.optim_cls(first, **optim_input.kwargs)
        optimizer.step()
        optimizer.add_param_group({"params": later, "lr": 0.05})
        assert optimizer.param_groups[1]["lr"] == 0.05
        assert optimizer.param_groups[1]["momentum"] == optimizer.defaults["momentum"]
        before = later[0].detach().clone()
        optimizer.step()
        assert not torch.equal(later[0], before)
        assert "momentum_buffer" in optimizer.state[later[0]]


def test_empty_parameter_and_gradient(info):
    """A zero-size matrix (with its zero-size gradient) among the parameters: the step works and
    updates the others (test_optim's foreach parity tests append one for this)."""
    for optim_input in inputs(info):
        params = params_with_grads() + [Parameter(torch.empty(0, 4))]
        params[-1].grad = torch.empty(0, 4)
        before = [p.detach().clone() for p in params]
        optimizer = info.optim_cls(params, **optim_input.kwargs)
        optimizer.step()
        assert not torch.equal(params[0], before[0]) and params[-1].shape == (0, 4)


CHECKS = {name[len("test_"):]: fn for name, fn in list(globals().items())
          if name.startswith("test_") and callable(fn)}
CHECKS.update({
    f"forloop_goes_right_direction[contiguous={c},with_lrsched={s}]":
        functools.partial(forloop_goes_right_direction, contiguous=c, with_lrsched=s)
    for c in (True, False) for s in (True, False)})
CHECKS.update({"step_post_hook": functools.partial(step_hook, register="register_step_post_hook", start=2, after_two=6),
               "step_pre_hook": functools.partial(step_hook, register="register_step_pre_hook", start=5, after_two=9)})
# TestOptimRenewed's parametrized checks: the named-parameter variants (torch >= 2.6).
CHECKS.update({
    f"can_load_from_to_named_state_dict[is_named_optim0={a},is_named_optim1={b}]":
        functools.partial(can_load_from_to_named_state_dict, is_named_optim0=a, is_named_optim1=b)
    for a in (True, False) for b in (True, False)})
CHECKS["save_load_equality_with_weights_only[is_named_optim=True]"] = functools.partial(
    CHECKS["save_load_equality_with_weights_only"], is_named_optim=True)
CHECKS.update({f"copy_steps_as_the_original[{how}]":
               functools.partial(copy_steps_as_the_original, how=how) for how in ("deepcopy", "pickle")})
for _name in [n for n in globals() if n.startswith("test_")]:
    del globals()[_name]  # collected through test_conformance only


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("optimizer", sorted(INFOS))
def test_conformance(optimizer, check):
    CHECKS[check](INFOS[optimizer])


def test_meshmuon_differs_only_where_named():
    """The error inputs meshmuon answers in its own words are the two named, no more, and torch's
    entry still has them (else the table is stale)."""
    descs = {e.optimizer_error_input.desc for e in
             TORCH_INFO.optim_error_inputs_func(device=DEVICE, dtype=DTYPE)}
    assert set(MESHMUON_DIFFERS) <= descs
    assert len(MESHMUON_DIFFERS) == 2
