# meshmuon.torch.Muon as a torch.optim.Optimizer: schedulers, signatures, state, zero-copy, hooks,
# closures, add_param_group, non-finite policy, QK-clip, NorMuon and expert stacks.
import copy
import inspect

import pytest
import torch

import meshmuon.torch as dt


def model():
    return torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.Tanh(), torch.nn.Linear(20, 6))


def loss_of(m, seed=1):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 12, generator=g), torch.randn(16, 6, generator=g)
    return torch.nn.functional.mse_loss(m(x), y)


def make(m, **kw):
    return dt.Muon(dt.param_groups(m), **kw)


def train(m, opt, steps, seed=1):
    for _ in range(steps):
        opt.zero_grad()
        loss_of(m, seed).backward()
        opt.step()


def test_lr_scheduler_changes_take_effect():
    m0 = model()
    runs = {}
    for scheduled in (False, True):
        m = copy.deepcopy(m0)
        opt = make(m, lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.0) if scheduled else None
        params = []
        for _ in range(3):
            opt.zero_grad()
            loss_of(m).backward()
            opt.step()
            params.append([p.detach().clone() for p in m.parameters()])
            if sched:
                sched.step()
        runs[scheduled] = params
    # Step 1 is identical; with gamma 0 the lr is 0 afterwards, so nothing moves any more.
    assert all(torch.equal(a, b) for a, b in zip(runs[False][0], runs[True][0]))
    assert all(torch.equal(a, b) for a, b in zip(runs[True][0], runs[True][2]))
    assert not all(torch.equal(a, b) for a, b in zip(runs[False][0], runs[False][2]))


@pytest.mark.parametrize("name", ["load_state_dict", "state_dict", "add_param_group", "zero_grad"])
def test_overridden_method_signatures_equal_the_base_class(name):
    assert inspect.signature(getattr(dt.Muon, name)) == \
        inspect.signature(getattr(torch.optim.Optimizer, name))


def test_step_signature_is_the_base_class_plus_keyword_only_qk_logits():
    base = inspect.signature(torch.optim.Optimizer.step).parameters
    ours = inspect.signature(dt.Muon.step).parameters
    assert list(ours)[:2] == list(base)[:2] == ["self", "closure"]
    assert ours["closure"] == base["closure"]
    assert inspect.signature(dt.Muon.step).return_annotation == \
        inspect.signature(torch.optim.Optimizer.step).return_annotation
    extra = [p for n, p in ours.items() if n not in base]
    assert [p.name for p in extra] == ["qk_logits"]
    assert extra[0].kind is inspect.Parameter.KEYWORD_ONLY and extra[0].default is None


def test_state_keys_are_complete_eagerly_and_documented():
    m = model()
    opt = make(m, normuon=True)
    keys = {n: set(opt.state[p]) for n, p in m.named_parameters()}
    assert keys["0.weight"] == keys["2.weight"] == {"momentum_buffer", "normuon_v", "step"}
    assert keys["0.bias"] == keys["2.bias"] == {"exp_avg", "exp_avg_sq", "step"}
    st = opt.state[m[0].weight]
    assert st["normuon_v"].shape == (20, 1)  # per row when rows >= cols
    assert st["step"].dtype == torch.float32 and st["step"].ndim == 0 and st["step"].item() == 0
    assert len(opt.state_dict()["state"]) == 4
    train(m, opt, 2)
    assert all(opt.state[p]["step"].item() == 2 for p in m.parameters())


def test_state_dict_round_trip_continues_bitwise():
    m0 = model()
    m_a, m_b = copy.deepcopy(m0), copy.deepcopy(m0)
    opt_a = make(m_a, normuon=True, cautious_wd=True)
    train(m_a, opt_a, 3)
    saved_opt = copy.deepcopy(opt_a.state_dict())
    saved_model = copy.deepcopy(m_a.state_dict())
    train(m_a, opt_a, 3, seed=2)

    m_b.load_state_dict(saved_model)
    opt_b = make(m_b, normuon=True, cautious_wd=True)
    bound = {k: v.data_ptr() for k, v in opt_b.state[m_b[0].weight].items()}
    opt_b.load_state_dict(saved_opt)
    assert {k: v.data_ptr() for k, v in opt_b.state[m_b[0].weight].items()} == bound
    assert opt_b.state[m_b[0].weight]["step"].item() == 3
    train(m_b, opt_b, 3, seed=2)
    for a, b in zip(m_a.parameters(), m_b.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(opt_a.state.values(), opt_b.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    # Negative control: without loading, the continuation differs.
    m_c = copy.deepcopy(m0)
    m_c.load_state_dict(saved_model)
    opt_c = make(m_c, normuon=True, cautious_wd=True)
    train(m_c, opt_c, 3, seed=2)
    assert not all(torch.equal(a, c) for a, c in zip(m_a.parameters(), m_c.parameters()))


def test_load_state_dict_accepts_keyword_and_rejects_mismatched_layout():
    m = model()
    opt = make(m)
    sd = copy.deepcopy(opt.state_dict())
    opt.load_state_dict(state_dict=sd)  # DCP calls it by keyword
    other = make(model(), normuon=True)
    with pytest.raises(ValueError, match="normuon"):
        other.load_state_dict(sd)


def test_zero_copy_state_pointers_stable_and_params_updated_in_place():
    m = model()
    opt = make(m)
    ptrs = {id(p): p.data_ptr() for p in m.parameters()}
    state_ptrs = {(id(p), k): t.data_ptr() for p in m.parameters() for k, t in opt.state[p].items()}
    before = [p.detach().clone() for p in m.parameters()]
    train(m, opt, 3)
    assert {id(p): p.data_ptr() for p in m.parameters()} == ptrs
    assert {(id(p), k): t.data_ptr() for p in m.parameters()
            for k, t in opt.state[p].items()} == state_ptrs
    assert all(not torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert opt.state[m[0].weight]["momentum_buffer"].abs().sum() > 0


def test_closure_hooks_and_zero_grad_behave_as_the_base_class():
    m = model()
    opt = make(m)
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))

    def closure():
        opt.zero_grad()
        loss = loss_of(m)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and calls == ["pre", "post"]
    opt.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    before = [p.detach().clone() for p in m.parameters()]
    opt.step()  # no gradients: nothing happens, as in torch
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))


def test_parameters_without_grad_are_untouched():
    m = model()
    opt = make(m)
    loss_of(m).backward()
    m[2].weight.grad = None
    w, st = m[2].weight.detach().clone(), opt.state[m[2].weight]["momentum_buffer"].clone()
    opt.step()
    assert torch.equal(m[2].weight, w)
    assert torch.equal(opt.state[m[2].weight]["momentum_buffer"], st)
    assert opt.state[m[2].weight]["step"].item() == 0 and opt.state[m[0].weight]["step"].item() == 1


def test_step_counts_do_not_follow_the_default_dtype():
    # the counters are one float32 vector on the CPU (each "step" a view): a partial step counts
    # with that vector's dtype and device, whatever the defaults became after construction
    m = model()
    opt = make(m)
    loss_of(m).backward()
    m[2].weight.grad = None
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        opt.step()
    finally:
        torch.set_default_dtype(old)
    st = opt.state[m[0].weight]["step"]
    assert st.dtype == torch.float32 and st.ndim == 0 and st.item() == 1
    assert opt.state[m[2].weight]["step"].item() == 0


def test_add_param_group_rebuilds_once_and_keeps_state():
    m = model()
    extra = torch.nn.Linear(6, 9)
    opt = make(m)
    assert opt.engine_builds == 1
    train(m, opt, 2)
    momentum = opt.state[m[0].weight]["momentum_buffer"].clone()
    opt.add_param_group(dict(params=[("extra.weight", extra.weight)]))
    opt.add_param_group(dict(params=[("extra.bias", extra.bias)], algorithm="adamw"))
    assert opt.engine_builds == 3
    assert torch.equal(opt.state[m[0].weight]["momentum_buffer"], momentum)
    assert opt.state[m[0].weight]["step"].item() == 2
    assert set(opt.state[extra.bias]) == {"exp_avg", "exp_avg_sq", "step"}
    assert opt.param_groups[-1]["betas"] == (0.9, 0.999) and "momentum" not in opt.param_groups[-1]
    train(m, opt, 1)
    assert opt.engine_builds == 3  # steps never rebuild


def test_group_defaults_follow_torch():
    m = model()
    opt = make(m)
    muon, adamw = opt.param_groups
    ref = torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults
    for key in ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
                "adjust_lr_fn"):
        assert muon[key] == ref[key], key
    ref = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]).defaults
    for key in ("lr", "betas", "eps", "weight_decay"):
        assert adamw[key] == ref[key], key


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_non_finite_policy(policy):
    m = model()
    opt = make(m, non_finite=policy)
    loss_of(m).backward()
    m[0].weight.grad[3, 4] = float("inf")
    before = [p.detach().clone() for p in m.parameters()]
    if policy == "raise":
        from meshmuon import MeshmuonError
        with pytest.raises(MeshmuonError, match="not finite"):
            opt.step()
    else:
        opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert all(opt.state[p]["step"].item() == 0 for p in m.parameters())


def test_qk_clip_scales_query_rows_through_step_logits():
    wq = torch.nn.Parameter(torch.randn(8, 6))  # 2 heads x head_dim 4
    opt = dt.Muon([wq], lr=0.0, weight_decay=0.0, qk_clip_threshold=10.0,
                  qk_layout={wq: dict(layer=0, kind="q", heads=2, head_dim=4)})
    wq.grad = torch.randn(8, 6)
    before = wq.detach().clone()
    opt.step(qk_logits={0: torch.tensor([40.0, 5.0])})  # head 0 over tau: rows x sqrt(10/40)
    torch.testing.assert_close(wq[:4], before[:4] * 0.5)
    assert torch.equal(wq[4:], before[4:])
    with pytest.raises(ValueError, match="no logits were given for layer 0"):
        opt.step()


def test_expert_stacks_are_batches_of_matrices():
    stack = torch.nn.Parameter(torch.randn(3, 8, 5))
    opt = dt.Muon([dict(params=[stack], expert_stacks=True)], lr=0.1, weight_decay=0.0)
    stack.grad = torch.randn(3, 8, 5)
    before = stack.detach().clone()
    opt.step()
    # Each expert moves on its own: same result as three separate 8x5 matrices.
    singles = [torch.nn.Parameter(before[e].clone()) for e in range(3)]
    ref = dt.Muon(singles, lr=0.1, weight_decay=0.0)
    for e, p in enumerate(singles):
        p.grad = stack.grad[e].clone()
    ref.step()
    for e in range(3):
        assert torch.equal(stack[e], singles[e])


@pytest.mark.parametrize("comm_dtype", ["fp32", "bf16"])
def test_comm_dtype_bf16_rounds_the_update_where_it_would_travel(comm_dtype):
    w = torch.nn.Parameter(torch.zeros(16, 16))  # p = 0, lr = 1, square, no decay: p_after = -U
    opt = dt.Muon([w], lr=1.0, weight_decay=0.0, comm_dtype=comm_dtype)
    w.grad = torch.randn(16, 16)
    opt.step()
    is_bf16 = torch.equal(w.detach().bfloat16().float(), w.detach())
    assert is_bf16 == (comm_dtype == "bf16")
    with pytest.raises(ValueError, match="comm_dtype"):
        dt.Muon([torch.nn.Parameter(torch.zeros(2, 2))], comm_dtype="fp16")


def test_engine_choice_and_the_distributed_core_on_plain_tensors():
    # one process: plain tensors take the local core; engine="distributed" forces the other core
    # (single communicator, Replicate on no mesh dims): bitwise the same parameters and state
    m0 = model()
    runs = {}
    for kind in (None, "distributed"):
        m = copy.deepcopy(m0)
        opt = make(m, lr=0.05, engine=kind, normuon=True)
        assert opt.engine == (kind or "local")
        assert opt.last_step_stats["engine"] == (kind or "local")  # stats on both engines
        train(m, opt, 3)
        runs[kind] = (m, opt)
    (ml, ol), (md, od) = runs[None], runs["distributed"]
    for pl, pd in zip(ml.parameters(), md.parameters()):
        assert torch.equal(pl, pd)
        assert sorted(ol.state[pl]) == sorted(od.state[pd])
        for key, value in ol.state[pl].items():
            assert type(od.state[pd][key]) is torch.Tensor and torch.equal(value, od.state[pd][key])
    assert od.last_step_stats["applied"]
    assert not torch.equal(next(ml.parameters()), next(m0.parameters()))  # the steps changed it
    with pytest.raises(ValueError, match="engine="):
        make(model(), engine="mpi")
