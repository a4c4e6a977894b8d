# Bad input raises ValueError / TypeError naming the problem, before anything is modified.
import pytest
import torch

import meshmuon.torch as dt


def p(*shape, **kw):
    return torch.nn.Parameter(torch.randn(*shape, **kw))


def test_1d_tensor_in_a_muon_group():
    with pytest.raises(ValueError, match=r"shape \(5,\) \(1-D\).*AdamW"):
        dt.Muon([p(4, 4), p(5)])


def test_3d_tensor_in_a_muon_group_needs_expert_stacks():
    with pytest.raises(ValueError, match="expert_stacks=True"):
        dt.Muon([p(2, 4, 4)])
    dt.Muon([dict(params=[p(2, 4, 4)], expert_stacks=True)])


def test_parameter_in_two_groups_or_twice_in_one():
    w = p(4, 4)
    # in two groups: the base class's wording (code matches on it), before anything is built
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        dt.Muon([dict(params=[w]), dict(params=[w], algorithm="adamw")])
    opt = dt.Muon([w])
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        opt.add_param_group(dict(params=[w]))
    assert len(opt.param_groups) == 1 and opt.engine_builds == 1
    # twice in one group: torch's warning, and the parameter kept once (stepped once)
    v, ref = p(4, 4), p(4, 4)
    with torch.no_grad():
        ref.copy_(v)
    with pytest.warns(UserWarning, match="a parameter group with duplicate parameters"):
        twice = dt.Muon([v, v], lr=0.1)
    once = dt.Muon([ref], lr=0.1)
    assert twice.param_groups[0]["params"] == [v]
    g = torch.randn(4, 4)
    v.grad, ref.grad = g.clone(), g.clone()
    twice.step(), once.step()
    assert torch.equal(v, ref) and twice.state[v]["step"].item() == 1


def test_named_duplicate_is_kept_once_with_its_name():
    v = p(3, 3)
    with pytest.warns(UserWarning, match="duplicate parameters"):
        opt = dt.Muon([("w", v), ("w", v)])
    assert opt.param_groups[0]["params"] == [v] and opt.param_groups[0]["param_names"] == ["w"]


def test_non_contiguous_parameter_steps_as_the_contiguous_one():
    """Accepted as by every torch optimizer: the engine steps a contiguous shadow, copied back; the
    results are bitwise those of the contiguous parameter, the gradient may be non-contiguous too,
    and a write to the parameter between steps is seen (the shadow is refreshed each step)."""
    base = torch.randn(6, 8)
    w = torch.nn.Parameter(base.t())  # a non-contiguous leaf
    assert not w.is_contiguous()
    c = torch.nn.Parameter(base.t().contiguous())
    initial = c.detach().clone()
    ow, oc = dt.Muon([w], lr=0.05), dt.Muon([c], lr=0.05)
    for step in range(3):
        g = torch.randn(8, 6)
        w.grad = torch.randn(6, 8).t().copy_(g) if step == 1 else g.clone()  # non-contiguous grad
        c.grad = g.clone()
        ow.step(), oc.step()
        assert torch.equal(w, c), step
        assert not torch.equal(w, initial)  # it moved (not vacuous)
        if step == 1:
            with torch.no_grad():  # a write between steps is stepped from
                w.mul_(0.5), c.mul_(0.5)
    assert not w.is_contiguous() and w.data_ptr() == base.data_ptr()
    assert torch.equal(ow.state[w]["momentum_buffer"], oc.state[c]["momentum_buffer"])
    # AdamW groups and a non-contiguous 1-D view alike
    b = torch.nn.Parameter(torch.randn(10, 2)[:, 0])
    bc = torch.nn.Parameter(b.detach().clone())
    ob, obc = dt.Muon([dict(params=[b], algorithm="adamw")]), dt.Muon([dict(params=[bc], algorithm="adamw")])
    for _ in range(2):
        g = torch.randn(10)
        b.grad, bc.grad = g.clone(), g.clone()
        ob.step(), obc.step()
    assert torch.equal(b, bc) and not b.is_contiguous()


def test_tensor_lr_must_be_one_element():
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):  # torch's wording
        dt.Muon([p(3, 3)], lr=torch.tensor([0.1, 0.2]))
    opt = dt.Muon([p(3, 3)], lr=torch.tensor(0.01))  # 1-element: accepted, as torch
    with pytest.raises(ValueError, match="param group 1: Tensor lr must be 1-element"):
        opt.add_param_group(dict(params=[p(3, 3)], lr=torch.tensor([0.1, 0.2])))
    assert len(opt.param_groups) == 1


def test_wrong_dtypes():
    with pytest.raises(TypeError, match="fp32 master"):  # bf16 is accepted (fp32 masters)
        dt.Muon([p(4, 4, dtype=torch.float16)])
    with pytest.raises(TypeError, match="fp32 master"):
        dt.Muon([p(4, 4, dtype=torch.float64)])
    w = p(4, 4)
    opt = dt.Muon([w])
    w.grad_dtype = None  # torch otherwise refuses gradients of another dtype itself
    w.grad = torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        opt.step()
    w.grad = torch.randn(4, 4).bfloat16()  # bf16 gradients are accepted
    opt.step()
    assert opt.state[w]["step"].item() == 1


def test_not_a_tensor_unknown_algorithm_and_misplaced_keys():
    with pytest.raises(TypeError, match="not a Tensor"):
        dt.Muon([[1.0, 2.0]])
    with pytest.raises(ValueError, match="algorithm 'sgd'"):
        dt.Muon([dict(params=[p(3, 3)], algorithm="sgd")])
    with pytest.raises(ValueError, match=r"\['betas'\] belong to the other algorithm"):
        dt.Muon([dict(params=[p(3, 3)], betas=(0.9, 0.99))])
    with pytest.raises(ValueError, match=r"\['momentum'\] belong to the other algorithm"):
        dt.Muon([dict(params=[p(3)], algorithm="adamw", momentum=0.9)])


def test_unknown_group_keys_are_named_with_meshmuons_key():
    # nanochat's `kind` / `beta2` and Motif's `use_muon` used to be ignored silently (NorMuon quietly off)
    with pytest.raises(ValueError, match=r"unknown keys 'beta2' \(use normuon=True, normuon_beta2="):
        dt.Muon([dict(params=[p(3, 3)], beta2=0.95)])
    with pytest.raises(ValueError, match=r"'kind' \(use algorithm='muon' or algorithm='adamw'\)"):
        dt.Muon([dict(params=[p(3, 3)], kind="muon")])
    with pytest.raises(ValueError, match=r"'use_muon' \(use algorithm='muon'"):
        dt.Muon([dict(params=[p(3)], algorithm="adamw", use_muon=False)])
    with pytest.raises(ValueError, match=r"'momentun' \(use momentum\)"):  # a typo: the closest key
        dt.Muon([dict(params=[p(3, 3)], momentun=0.9)])
    with pytest.raises(ValueError, match=r"'zzz'; meshmuon's group keys are"):
        dt.Muon([dict(params=[p(3, 3)], zzz=1)])
    opt = dt.Muon([dict(params=[p(3, 3)], name="hidden", initial_lr=0.02)])  # torch's own keys pass
    with pytest.raises(ValueError, match="unknown keys 'beta2'"):  # add_param_group checks too
        opt.add_param_group(dict(params=[p(4, 4)], beta2=0.9))
    assert len(opt.param_groups) == 1


def test_unknown_keys_of_every_group_are_named_at_once():
    with pytest.raises(ValueError) as info:
        dt.Muon([dict(params=[p(3, 3)], kind="muon"), dict(params=[p(3, 3)]),
                 dict(params=[p(3)], algorithm="adamw", wd=0.1, zzz=2)])
    message = str(info.value)
    assert "param group 0: unknown keys 'kind'" in message
    assert "param group 2: unknown keys 'wd' (use weight_decay), 'zzz'" in message
    assert "param group 1" not in message  # negative control: a good group is not named


def test_bad_hyperparameters_are_caught_before_the_step_changes_anything():
    with pytest.raises(ValueError, match=r"momentum -0.5 must be finite and >= 0"):
        dt.Muon([p(3, 3)], momentum=-0.5)
    with pytest.raises(ValueError, match="unknown schedule"):
        dt.Muon([p(3, 3)], ns_schedule="fast")
    w = p(3, 3)
    opt = dt.Muon([w])
    w.grad = torch.randn(3, 3)
    opt.param_groups[0]["lr"] = -1.0
    before = w.detach().clone()
    with pytest.raises(ValueError, match="lr -1 must be finite and >= 0"):
        opt.step()
    assert torch.equal(w, before)
    opt.param_groups[0]["lr"] = 0.01
    opt.param_groups[0]["normuon"] = True
    with pytest.raises(ValueError, match="normuon changed after construction"):
        opt.step()


def test_qk_layout_errors():
    w, b = p(8, 4), p(4)
    with pytest.raises(ValueError, match="not a parameter of a Muon group"):
        dt.Muon([dict(params=[w]), dict(params=[b], algorithm="adamw")],
                qk_layout={b: dict(layer=0, kind="q", heads=1, head_dim=4)})
    with pytest.raises(ValueError, match="heads"):
        dt.Muon([w], qk_layout={w: dict(layer=0, kind="q", heads=3, head_dim=4)})
    with pytest.raises(ValueError, match="missing keys"):
        dt.Muon([w], qk_layout={w: dict(layer=0, kind="q")})
