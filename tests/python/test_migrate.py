# meshmuon.torch.migrate (docs/migration.md): every example in examples/migrate runs (subprocess); each
# translation maps every key the peer reads and names what it cannot map; foreign group keys are kept
# (passthrough), aliased (live) or fixed, survive steps and state dicts, and are checked.
# Numerics against the peers' own rules: test_migrate_numerics.py.
# Run: PYTHONPATH=build/python-stage python3 -m pytest tests/python/test_migrate.py -q
import os
import subprocess
import sys

import pytest
import torch

import meshmuon.torch as dt
from meshmuon.torch.migrate._common import has_key

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "migrate")
B_KEYS = all(has_key(k) for k in ("muon_eq", "muon_plus", "decay_lr"))
NO_B = dict(muon_eq=False, muon_plus=False, decay_lr="unadjusted")


def run_example(name, *args):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("name", ["torch_muon.py", "motif_groups.py", "dion_groups.py"])
def test_example_runs(name):
    assert run_example(name).splitlines()[-1].startswith(name[:-3] + ": ")


def test_example_nanochat_loop_approximate():
    assert "nanochat_loop: loss" in run_example("nanochat_loop.py", "--approximate")


def test_example_nanochat_loop_exact():
    if not B_KEYS:
        pytest.skip("this meshmuon build lacks muon_eq / muon_plus / decay_lr (issue 31 B); the merge "
                    "enables this test")
    assert "nanochat_loop: loss" in run_example("nanochat_loop.py")


def mats(*shapes):
    return [torch.nn.Parameter(torch.randn(*s) * 0.1) for s in shapes]


def without_params(group):
    return {k: v for k, v in group.items() if k != "params"}


def step(opt, params):
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()


# ---- nanochat --------------------------------------------------------------------------------

def nanochat_groups(params, vec):
    return [dict(kind="adamw", params=[vec], lr=0.2, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0),
            dict(kind="muon", params=params, lr=0.02, momentum=0.95, ns_steps=5, beta2=0.9,
                 weight_decay=0.1)]


def test_nanochat_maps_every_key():
    params, vec = mats((8, 4), (8, 4)), torch.nn.Parameter(torch.zeros(4))
    adamw, muon = dt.from_nanochat(nanochat_groups(params, vec), **NO_B)["params"]
    assert without_params(adamw) == dict(kind="adamw", algorithm="adamw", lr=0.2, weight_decay=0.0,
                                         betas=(0.8, 0.95), eps=1e-10,
                                         foreign_keys={"kind": {"fixed": "adamw"}})
    expected = dict(kind="muon", algorithm="muon", lr=0.02, weight_decay=0.1, beta2=0.9,
                    momentum=0.95, momentum_kind="ema", nesterov=True, ns_schedule="polar_express",
                    ns_steps=5, ns_scale=1.01, eps=1e-6, eps_mode="add", normuon=True,
                    normuon_beta2=0.9, cautious_wd=True, adjust_lr_fn="original",
                    expert_stacks=False,
                    foreign_keys={"kind": {"fixed": "muon"}, "beta2": "normuon_beta2"})
    if B_KEYS:
        expected.update(muon_eq=False, muon_plus=False, decay_lr="unadjusted")
    assert without_params(muon) == expected
    assert muon["params"] == params


def test_nanochat_refuses_what_it_cannot_map():
    params, vec = mats((8, 4)), torch.nn.Parameter(torch.zeros(4))
    groups = nanochat_groups(params, vec)
    # ns_steps 1-4 are a prefix of nanochat's table (a custom schedule: test_migrate_bounds.py)
    with pytest.raises(ValueError, match=r"group 1: ns_steps=0: .*use an int ns_steps >= 1"):
        dt.from_nanochat([groups[0], dict(groups[1], ns_steps=0)], **NO_B)
    with pytest.raises(ValueError, match=r"group 1: has no 'beta2'"):
        dt.from_nanochat([groups[0], {k: v for k, v in groups[1].items() if k != "beta2"}], **NO_B)
    with pytest.raises(ValueError, match=r"group 0: kind='lion' is not one of"):
        dt.from_nanochat([dict(groups[0], kind="lion")], **NO_B)
    with pytest.raises(ValueError, match=r"key 'nesterov' is not read by nanochat but is a meshmuon key"):
        dt.from_nanochat([groups[0], dict(groups[1], nesterov=False)], **NO_B)
    translated = dt.from_nanochat(groups, **NO_B)["params"]
    with pytest.raises(ValueError, match=r"group 0: has 'foreign_keys': it is a meshmuon group already"):
        dt.from_nanochat(translated, **NO_B)
    with pytest.raises(ValueError, match=r"decay_lr='x'"):
        dt.from_nanochat(groups, decay_lr="x")


def test_nanochat_names_engine_keys_this_build_lacks():
    params, vec = mats((8, 4)), torch.nn.Parameter(torch.zeros(4))
    if has_key("muon_eq"):
        assert dt.from_nanochat(nanochat_groups(params, vec))["params"][1]["muon_eq"] is True
    else:
        with pytest.raises(ValueError, match=r"MuonEq .* needs meshmuon's group key 'muon_eq'.*"
                                             r"muon_eq=False"):
            dt.from_nanochat(nanochat_groups(params, vec))


def test_nanochat_keys_the_loop_uses_survive_steps_and_state_dicts():
    params, vec = mats((8, 4), (4, 8)), torch.nn.Parameter(torch.zeros(4))
    groups = nanochat_groups(params[:1], vec) + [dict(nanochat_groups(params[1:], vec)[1])]
    opt = dt.Muon(**dt.from_nanochat(groups, **NO_B))
    for g in opt.param_groups:
        g["initial_lr"] = g["lr"]
    for it in range(3):
        for g in opt.param_groups:  # nanochat's loop idiom
            g["lr"] = g["initial_lr"] * (it + 1) / 3
            if g["kind"] == "muon":
                g["momentum"], g["weight_decay"] = 0.9, 0.05
        step(opt, params + [vec])
    assert [g["kind"] for g in opt.param_groups] == ["adamw", "muon", "muon"]
    saved = opt.state_dict()
    assert [g["kind"] for g in saved["param_groups"]] == ["adamw", "muon", "muon"]
    fresh = dt.Muon(**dt.from_nanochat(groups, **NO_B))
    fresh.load_state_dict(saved)
    assert fresh.param_groups[1]["foreign_keys"] == {"kind": {"fixed": "muon"},
                                                     "beta2": "normuon_beta2"}
    assert fresh.param_groups[1]["momentum"] == 0.9 and fresh.param_groups[1]["lr"] == 0.02
    step(fresh, params + [vec])


def test_alias_is_live_and_bitwise_the_meshmuon_key():
    """Writing nanochat's beta2 before a step equals writing meshmuon's normuon_beta2; not writing it
    (negative control) differs."""
    def run(write):
        torch.manual_seed(3)
        params, vec = mats((8, 4)), torch.nn.Parameter(torch.zeros(4))
        opt = dt.Muon(**dt.from_nanochat(nanochat_groups(params, vec), **NO_B))
        for it in range(3):
            if it == 1:
                write(opt.param_groups[1])
            step(opt, params + [vec])
        return params[0].detach().clone()

    def write_beta2(g):
        g["beta2"] = 0.5

    def write_meshmuon(g):
        g["foreign_keys"] = {"kind": {"fixed": "muon"}}  # no alias: meshmuon's key is the source
        g["normuon_beta2"] = 0.5

    aliased, direct, unchanged = run(write_beta2), run(write_meshmuon), run(lambda g: None)
    assert torch.equal(aliased, direct)
    assert not torch.equal(aliased, unchanged)


def test_fixed_key_change_raises_before_the_step_changes_anything():
    params, vec = mats((8, 4)), torch.nn.Parameter(torch.zeros(4))
    opt = dt.Muon(**dt.from_nanochat(nanochat_groups(params, vec), **NO_B))
    step(opt, params + [vec])
    before = params[0].detach().clone()
    opt.param_groups[1]["kind"] = "adamw"
    with pytest.raises(ValueError, match=r"key 'kind' was 'muon' when the group was translated"):
        step(opt, params + [vec])
    assert torch.equal(params[0].detach(), before)


# ---- foreign keys, directly ------------------------------------------------------------------

def test_unknown_key_without_declaration_is_still_refused():
    """Negative control: the passthrough is opt-in; a bare `kind` keeps meshmuon's error."""
    with pytest.raises(ValueError, match=r"unknown keys 'kind' \(use algorithm="):
        dt.Muon([dict(params=mats((4, 4)), kind="muon")])


@pytest.mark.parametrize("spec,match", [
    ({"lr": None}, r"'lr' is a meshmuon key; a foreign key must not be one"),
    ({"absent": None}, r"declares 'absent', which the group does not have"),
    ({"kind": "nonsense"}, r"'kind' aliases 'nonsense', which is not a meshmuon hyperparameter key"),
    ({"kind": {"frozen": 1}}, r"target of 'kind' must be None, a meshmuon key or"),
    ([("kind", None)], r"must be a dict"),
])
def test_foreign_keys_declaration_is_checked(spec, match):
    with pytest.raises(ValueError, match=match):
        dt.Muon([dict(params=mats((4, 4)), kind="muon", foreign_keys=spec)])


def test_passthrough_key_is_kept_and_ignored():
    torch.manual_seed(1)
    a = mats((6, 4))
    b = [torch.nn.Parameter(a[0].detach().clone())]
    tagged = dt.Muon([dict(params=a, my_tag=[1, 2], foreign_keys={"my_tag": None})], lr=0.02)
    plain = dt.Muon([dict(params=b)], lr=0.02)
    for _ in range(2):
        g = torch.randn(6, 4)
        a[0].grad, b[0].grad = g.clone(), g.clone()
        tagged.step()
        plain.step()
    assert torch.equal(a[0], b[0]) and tagged.param_groups[0]["my_tag"] == [1, 2]


# ---- Motif -----------------------------------------------------------------------------------

def test_motif_maps_every_key():
    w, e, v = mats((8, 4), (3, 8, 4), (4,))
    kwargs = dt.from_motif([dict(params=[w, e], names=["l.w", "experts"], use_muon=True),
                            dict(params=[v], use_muon=False)], lr=0.02, weight_decay=0.01,
                           expert_keys=["experts"], none_grad=False)
    muon, adamw = kwargs["params"]
    assert kwargs["none_grad"] is False
    assert muon["params"] == [("l.w", w), ("experts", e)]
    expected = dict(use_muon=True, none_grad=False, lr=0.02, weight_decay=0.01, names=["l.w", "experts"],
                    algorithm="muon", momentum=0.95, nesterov=True, momentum_kind="heavy_ball",
                    ns_schedule="you", ns_steps=5, ns_scale=1.0, eps=1e-7, eps_mode="add",
                    adjust_lr_fn="match_rms_adamw", cautious_wd=False, normuon=False,
                    expert_stacks=True,
                    foreign_keys={"use_muon": {"fixed": True}, "none_grad": {"fixed": False},
                                  "names": None})
    if B_KEYS:
        expected.update(muon_eq=False, muon_plus=False, decay_lr="unadjusted")
    assert without_params(muon) == expected
    assert adamw["params"] == [("param_groups[1][0]", v)]
    assert without_params(adamw) == dict(
        use_muon=False, none_grad=False, lr=0.02, weight_decay=0.01, algorithm="adamw",
        betas=(0.9, 0.95), eps=1e-8, adamw_betas=(0.9, 0.95), adamw_eps=1e-8,
        foreign_keys={"use_muon": {"fixed": False}, "none_grad": {"fixed": False},
                      "adamw_betas": "betas", "adamw_eps": "eps"})
    dt.Muon(**kwargs)


def test_motif_refuses_what_it_cannot_map():
    w, e = mats((8, 4), (3, 8, 4))
    with pytest.raises(ValueError, match=r"group 0: has no 'use_muon'"):
        dt.from_motif([dict(params=[w])])
    # any int ns_steps is Motif's 5 rows (its Newton-Schulz ignores it: test_migrate_bounds.py)
    with pytest.raises(ValueError, match=r"ns_steps='6' must be an int"):
        dt.from_motif([dict(params=[w], use_muon=True)], ns_steps="6")
    with pytest.raises(ValueError, match=r"parameter 1 'e' is 3-D and matches no expert_keys"):
        dt.from_motif([dict(params=[w, e], names=["w", "e"], use_muon=True)], expert_keys=["x"])
    with pytest.raises(ValueError, match=r"clip_config with q_indices"):
        dt.from_motif([dict(params=[w], use_muon=True)], clip_config=dict(q_indices=[0]))
    with pytest.raises(ValueError, match=r"groups differ in none_grad"):
        dt.from_motif([dict(params=[w], use_muon=True, none_grad=False),
                       dict(params=[e[0]], use_muon=True)])
    with pytest.raises(ValueError, match=r"has 1 names for 2 parameters"):
        dt.from_motif([dict(params=[w, e], names=["w"], use_muon=True)], expert_keys=["e"])


# ---- torch.optim.Muon ------------------------------------------------------------------------

def test_torch_muon_maps_every_key_from_params_or_an_optimizer():
    w = mats((8, 4))
    args = dict(lr=0.03, weight_decay=0.2, momentum=0.9, nesterov=False, ns_coefficients=(3, -3, 1),
                eps=1e-6, ns_steps=4, adjust_lr_fn="match_rms_adamw")
    from_params = dt.from_torch_muon(w, **args)["params"][0]
    from_opt = dt.from_torch_muon(torch.optim.Muon(w, **args))["params"][0]
    expected = dict(algorithm="muon", lr=0.03, weight_decay=0.2, momentum=0.9, nesterov=False,
                    momentum_kind="ema", ns_coefficients=(3.0, -3.0, 1.0), ns_steps=4,
                    ns_schedule=None, eps=1e-6, eps_mode="clamp", ns_scale=1.0,
                    adjust_lr_fn="match_rms_adamw", cautious_wd=False, normuon=False,
                    expert_stacks=False)
    if B_KEYS:
        expected.update(muon_eq=False, muon_plus=False, decay_lr="unadjusted")
    assert without_params(from_params) == expected == without_params(from_opt)
    opt = dt.Muon(**dt.from_torch_muon(w, **args))
    step(opt, w)


def test_torch_muon_refuses_what_it_cannot_map():
    w, v = mats((8, 4), (4,))
    with pytest.raises(ValueError, match=r"parameter 1 has shape \(4,\); torch.optim.Muon takes 2-D"):
        dt.from_torch_muon([w, v])
    with pytest.raises(ValueError, match=r"adjust_lr_fn='none' is not one of"):
        dt.from_torch_muon([w], adjust_lr_fn="none")
    with pytest.raises(ValueError, match=r"key 'normuon' is not read by torch.optim.Muon"):
        dt.from_torch_muon([dict(params=[w], normuon=True)])
    stepped = torch.optim.Muon([w], lr=0.02)
    w.grad = torch.randn_like(w)
    stepped.step()
    with pytest.raises(ValueError, match=r"has state for 1 parameters \(it has stepped\)"):
        dt.from_torch_muon(stepped)


# ---- Dion ------------------------------------------------------------------------------------

def test_dion_maps_every_key():
    tall, v = mats((8, 4), (4,))
    kwargs = dt.from_dion([dict(params=[tall], mu=0.9, cautious_wd=True),
                           dict(params=[v], algorithm="adamw", beta2=0.99)], lr=0.02, epsilon=1e-7)
    muon, adamw = kwargs["params"]
    expected = dict(algorithm="muon", lr=0.02, weight_decay=0.01, eps=1e-7, epsilon=1e-7, mu=0.9,
                    flatten=False, adjust_lr="spectral_norm", momentum=0.9, nesterov=False,
                    momentum_kind="heavy_ball", ns_steps=5, eps_mode="add", cautious_wd=True,
                    adjust_lr_fn="original", normuon=False, expert_stacks=False,
                    ns_schedule="polar_express", ns_scale=1.02,
                    foreign_keys={"epsilon": "eps", "flatten": {"fixed": False},
                                  "adjust_lr": {"fixed": "spectral_norm"}, "mu": "momentum"})
    if B_KEYS:
        expected.update(muon_eq=False, muon_plus=False, decay_lr="unadjusted")
    assert without_params(muon) == expected
    assert without_params(adamw) == dict(
        algorithm="adamw", lr=0.02, weight_decay=0.01, eps=1e-7, epsilon=1e-7, beta1=0.9,
        beta2=0.99, betas=(0.9, 0.99),
        foreign_keys={"epsilon": "eps", "beta1": "betas[0]", "beta2": "betas[1]"})
    you = dt.from_dion([dict(params=[tall])], use_polar_express=False)["params"][0]
    assert (you["ns_schedule"], you["ns_scale"]) == ("you", 1.0)
    dt.Muon(**kwargs)


def test_dion_refuses_what_it_cannot_map():
    tall, wide, v = mats((8, 4), (4, 8), (4,))
    with pytest.raises(ValueError, match=r"parameter 1 has shape \(4, 8\) \(A < B\): Dion's "
                                         r"spectral_norm"):
        dt.from_dion([tall, wide])
    assert dt.from_dion([tall, wide], adjust_lr=None)["params"][0]["adjust_lr_fn"] == "none"
    with pytest.raises(ValueError, match=r"algorithm='lion' is not one of"):
        dt.from_dion([dict(params=[v], algorithm="lion")])
    with pytest.raises(ValueError, match=r"use_gram_newton_schulz is not translated"):
        dt.from_dion([tall], use_gram_newton_schulz=True)
    # num_heads / split_sizes translate (issue 37), with Dion's own refusals; spectral_norm's A < B
    # refusal reads each block's shape: 4 heads of [8, 4] are [2, 4] blocks
    with pytest.raises(ValueError, match=r"parameter 0 has shape \(8, 4\) \(A < B\)"):
        dt.from_dion([dict(params=[tall], num_heads=4)])
    assert dt.from_dion([dict(params=[tall], num_heads=2)])["params"][0]["num_heads"] == 2
    with pytest.raises(ValueError, match=r"num_heads=3 does not divide dim 0"):
        dt.from_dion([dict(params=[tall], num_heads=3)], adjust_lr=None)
    with pytest.raises(ValueError, match=r"split_sizes \(4, 2\) do not sum to dim 0"):
        dt.from_dion([dict(params=[tall], split_sizes=(4, 2))], adjust_lr=None)
    with pytest.raises(ValueError, match=r"both set"):
        dt.from_dion([dict(params=[tall], split_sizes=(4, 4), num_heads=2)])
    with pytest.raises(ValueError, match=r"split_sizes=\(8,\): Dion takes"):
        dt.from_dion([dict(params=[tall], split_sizes=(8,))])
    with pytest.raises(ValueError, match=r"cautious_wd=True in an AdamW group"):
        dt.from_dion([dict(params=[v], algorithm="adamw", cautious_wd=True)])
    with pytest.raises(ValueError, match=r"step=3: the Dion Muon optimizer has stepped"):
        dt.from_dion([dict(params=[tall], step=3)])


def test_dion_wide_block_refusal_names_the_block():
    # a square matrix split into wide blocks: the refusal names the block's shape and the split,
    # not only the matrix's (which is not wide)
    square, tall = mats((64, 64), (16, 4))
    with pytest.raises(ValueError, match=r"parameter 0 has shape \(64, 64\) .*4 row blocks "
                                         r"\(num_heads=4\) of shape \(16, 64\).*lr·0\.5"):
        dt.from_dion([dict(params=[square], num_heads=4)], lr=0.01)
    with pytest.raises(ValueError, match=r"parameter 0 has shape \(16, 4\) .*row block 1 of shape "
                                         r"\(2, 4\) \(split_sizes=\(14, 2\)\)"):
        dt.from_dion([dict(params=[tall], split_sizes=(14, 2))])


def _nanochat_muon_group(beta2):
    return dict(kind="muon", params=[torch.nn.Parameter(torch.randn(8, 4))], lr=0.02,
                momentum=0.95, ns_steps=5, beta2=beta2, weight_decay=0.1)


# nanochat checks no beta2; meshmuon takes NorMuon's beta2 >= 0, finite (Dion's NorMuon's range):
# negative (a lerp weight above 1) and non-finite values (NaN parameters) are refused, naming beta2.
@pytest.mark.parametrize("beta2,why", [(-0.1, "is negative"), (float("nan"), "write inf or NaN"),
                                       (float("inf"), "write inf or NaN"), ("0.9", "not a number"),
                                       (True, "not a number")])
def test_nanochat_beta2_outside_its_range_is_refused(beta2, why):
    with pytest.raises(ValueError, match=rf"group 0: beta2=.*{why}"):
        dt.from_nanochat([_nanochat_muon_group(beta2)])


@pytest.mark.parametrize("beta2,normuon,normuon_beta2,alias", [
    (0.0, True, 0.0, "normuon_beta2"), (1.0 - 1e-12, True, 1.0 - 1e-12, "normuon_beta2"),
    (1.0, True, 1.0, "normuon_beta2"), (1.5, True, 1.5, "normuon_beta2"),
    (None, True, 0.0, {"fixed": None})])
def test_nanochat_beta2_ends_translate(beta2, normuon, normuon_beta2, alias):
    """nanochat's beta2 at 0, 1 (v stays at its zeros, in the engine too), above 1 and None
    (older nanochat reads 0.0) translate and step; None is fixed (a write raises before the step),
    the rest stay live aliases of normuon_beta2."""
    kwargs = dt.from_nanochat([_nanochat_muon_group(beta2)])
    group = kwargs["params"][0]
    assert group["normuon"] is normuon and group.get("normuon_beta2") == normuon_beta2
    assert group["beta2"] == beta2 and group["foreign_keys"]["beta2"] == alias
    opt = dt.Muon(**kwargs)
    p = opt.param_groups[0]["params"][0]
    p.grad = torch.randn_like(p)
    opt.step()
    if isinstance(alias, dict):
        opt.param_groups[0]["beta2"] = 0.9
        with pytest.raises(ValueError, match="'beta2' was .* cannot change after translation"):
            opt.step()
