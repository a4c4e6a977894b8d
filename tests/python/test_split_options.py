# Split orthogonalization's surface (num_heads / split_sizes, issue 37): param_groups tags attention
# weights per head, bad values raise naming the group or parameter before anything is modified, the
# keys are fixed after construction, the plan shows the blocks, NorMuon's per-row state limit.
# Run: PYTHONPATH=build/python-stage python3 -m pytest tests/python/test_split_options.py -q
import pytest
import torch
from torch import nn

import meshmuon.torch as dt


class Attn(nn.Module):
    """GQA attention with a fused QKV (4 query heads, 2 kv heads, head_dim 4) and separate q / k / v
    weights, an output projection and a norm."""

    def __init__(self, d=16, heads=4, kv=2, hd=4):
        super().__init__()
        self.qkv = nn.Linear(d, (heads + 2 * kv) * hd, bias=False)
        self.wq = nn.Linear(d, heads * hd, bias=False)
        self.wk = nn.Linear(d, kv * hd, bias=False)
        self.wv = nn.Linear(d, kv * hd, bias=False)
        self.wo = nn.Linear(heads * hd, d, bias=False)
        self.norm = nn.RMSNorm(d)


def by_name(groups):
    return {n: {k: v for k, v in g.items() if k != "params"} for g in groups for n, _ in g["params"]}


def test_param_groups_tags_heads():
    model = Attn()
    groups = dt.param_groups(model, muon=dict(lr=0.02), split={
        r"^qkv": dict(num_heads=4 + 2 * 2),          # q, k, v each per head (fused)
        r"^wq": dict(num_heads=4), r"^w[kv]": dict(num_heads=2)})  # separate weights per head
    g = by_name(groups)
    assert g["qkv.weight"]["num_heads"] == 8 and g["wq.weight"]["num_heads"] == 4
    assert g["wk.weight"]["num_heads"] == g["wv.weight"]["num_heads"] == 2
    assert "num_heads" not in g["wo.weight"] and g["wo.weight"]["lr"] == 0.02
    assert g["qkv.weight"]["lr"] == 0.02 and g["norm.weight"]["algorithm"] == "adamw"
    opt = dt.Muon(groups)
    plan = opt.plan().json
    blocks = {e["name"]: e.get("blocks") for e in plan["entries"]}
    assert blocks["qkv.weight"] == [4] * 8 and blocks["wk.weight"] == [4, 4] and blocks["wo.weight"] is None
    assert "split: 4 parameters orthogonalized as 16 row blocks" in str(opt.plan())
    # GQA's uneven q | k | v blocks
    groups = dt.param_groups(model, split={r"^qkv": dict(split_sizes=(16, 8, 8))})
    assert by_name(groups)["qkv.weight"]["split_sizes"] == (16, 8, 8)
    with pytest.raises(ValueError, match=r"split pattern 'norm' matches 'norm.weight', an AdamW"):
        dt.param_groups(model, split={"norm": dict(num_heads=2)})


def test_split_changes_the_step_and_one_block_is_whole():
    torch.manual_seed(0)
    w0 = torch.randn(12, 4)
    w = [nn.Parameter(w0.clone()) for _ in range(3)]
    opts = [dt.Muon([dict(params=[w[0]])]), dt.Muon([dict(params=[w[1]], num_heads=3)]),
            dt.Muon([dict(params=[w[2]], split_sizes=[4, 4, 4])])]
    g = torch.randn(12, 4)
    for p, o in zip(w, opts):
        p.grad = g.clone()
        o.step()
    assert torch.equal(w[1], w[2]) and not torch.equal(w[0], w[1])  # num_heads=3 is (4, 4, 4)
    whole = nn.Parameter(w[0].detach().clone())  # one block (split_sizes=[12]) is the whole matrix
    ref = nn.Parameter(w[0].detach().clone())
    for p, kw in ((whole, dict(split_sizes=[12])), (ref, {})):
        opt = dt.Muon([dict(params=[p], **kw)])
        p.grad = g.clone()
        opt.step()
    assert torch.equal(whole, ref)


@pytest.mark.parametrize("kw,match", [
    (dict(num_heads=True), r"group 0: num_heads=True; use a positive integer"),
    (dict(num_heads=0), r"group 0: num_heads=0; use a positive integer"),
    (dict(split_sizes=(4, 0, 8)), r"group 0: split_sizes=\(4, 0, 8\); use a list of positive"),
    (dict(split_sizes=4), r"group 0: split_sizes=4"),
    (dict(split_sizes=(6, 6), num_heads=2), r"num_heads and split_sizes are both set"),
    (dict(num_heads=5), r"parameter 'param_groups\[0\]\[0\]': num_heads 5 does not divide its 12 rows"),
    (dict(split_sizes=(6, 5)), r"split_sizes sum to 11 but its matrices have 12 rows"),
    (dict(num_heads=4, normuon=True), r"NorMuon on a block of 3 rows × 4 columns"),
])
def test_bad_values_raise_before_anything_changes(kw, match):
    p = nn.Parameter(torch.randn(12, 4))
    before = p.detach().clone()
    with pytest.raises(ValueError, match=match):
        opt = dt.Muon([dict(params=[p], **kw)])
        p.grad = torch.randn(12, 4)
        opt.step()
    assert torch.equal(p, before)


def test_split_is_fixed_after_construction_and_normuon_blocks_work():
    p = nn.Parameter(torch.randn(12, 4))
    opt = dt.Muon([dict(params=[p], split_sizes=(4, 8), normuon=True)])  # blocks ≥ 4 columns: per row
    p.grad = torch.randn(12, 4)
    opt.step()
    assert opt.state[p]["normuon_v"].shape == (12, 1)
    opt.param_groups[0]["split_sizes"] = (8, 4)
    before = p.detach().clone()
    with pytest.raises(ValueError, match=r"split_sizes changed after construction"):
        opt.step()
    assert torch.equal(p, before)
    # the state dict round trip keeps the split (a structural key)
    opt.param_groups[0]["split_sizes"] = (4, 8)
    sd = opt.state_dict()
    fresh = dt.Muon([dict(params=[nn.Parameter(p.detach().clone())], split_sizes=(4, 8), normuon=True)])
    fresh.load_state_dict(sd)
    other = dt.Muon([dict(params=[nn.Parameter(p.detach().clone())], normuon=True)])
    with pytest.raises(ValueError, match=r"split_sizes"):
        other.load_state_dict(sd)


@pytest.mark.parametrize("normuon", [False, True])
def test_a_block_steps_as_a_separate_parameter_of_its_shape(normuon):
    # an expert stack [3, 8, 4] in 2 heads and a fused [12, 4] in (8, 4): each block's step is the
    # step of a separate parameter holding the block, bit for bit (normalization, NorMuon rows, the lr rule on
    # the block's shape: 'original' gives sqrt(2) for [8, 4] and 1 for [4, 4])
    torch.manual_seed(1)
    stack, fused = torch.randn(3, 8, 4), torch.randn(12, 4)
    a, b = nn.Parameter(stack.clone()), nn.Parameter(fused.clone())
    opt = dt.Muon([dict(params=[a], expert_stacks=True, num_heads=2, normuon=normuon),
                   dict(params=[b], split_sizes=(8, 4), normuon=normuon)], lr=0.02)
    parts = [nn.Parameter(stack[:, :4].clone()), nn.Parameter(stack[:, 4:].clone()),
             nn.Parameter(fused[:8].clone()), nn.Parameter(fused[8:].clone())]
    ref = dt.Muon([dict(params=parts[:2], expert_stacks=True, normuon=normuon),
                   dict(params=parts[2:], normuon=normuon)], lr=0.02)
    for _ in range(3):
        gs, gf = torch.randn(3, 8, 4), torch.randn(12, 4)
        a.grad, b.grad = gs.clone(), gf.clone()
        for p, g in zip(parts, (gs[:, :4], gs[:, 4:], gf[:8], gf[8:])):
            p.grad = g.clone()
        opt.step()
        ref.step()
    got = [a[:, :4], a[:, 4:], b[:8], b[8:]]
    for g, p in zip(got, parts):  # bitwise: the same kernels on the same bytes
        assert torch.equal(g, p), (g - p).abs().max()


def test_qk_clip_acts_on_split_weights_head_by_head():
    # q [32, 16] per head (4 heads of 8 rows), k [16, 16] (2 kv heads): QK-clip scales the rows of
    # each clipped head after the split update; unclipped heads are bitwise the run without clip
    torch.manual_seed(2)
    q0, k0 = torch.randn(32, 16), torch.randn(16, 16)
    logits = {0: [120.0, 30.0, 250.0, 90.0]}
    runs = []
    for clip in (True, False):
        q, k = nn.Parameter(q0.clone()), nn.Parameter(k0.clone())
        kw = dict(clip_config=dict(q_proj="layers.0.wq", k_proj="layers.0.wk", head_dim=8, threshold=100.0)) \
            if clip else {}
        opt = dt.Muon([dict(params=[("layers.0.wq", q)], num_heads=4),
                       dict(params=[("layers.0.wk", k)], num_heads=2)], lr=0.05, **kw)
        q.grad, k.grad = torch.randn(32, 16, generator=torch.Generator().manual_seed(3)), \
            torch.randn(16, 16, generator=torch.Generator().manual_seed(4))
        opt.step(qk_logits=logits) if clip else opt.step()
        runs.append((q.detach().clone(), k.detach().clone()))
    (qc, kc), (qn, kn) = runs
    for h, logit in enumerate(logits[0]):
        rows = slice(8 * h, 8 * h + 8)
        if logit <= 100.0:
            assert torch.equal(qc[rows], qn[rows]), h
        else:
            ratio = qc[rows] / qn[rows]
            assert ratio.max() < 1 and torch.allclose(ratio, ratio.mean(), rtol=1e-5), (h, ratio)
    assert not torch.equal(kc, kn)  # the key heads of clipped query heads are scaled too
