# meshmuon.torch.param_groups: Muon for hidden matrices, AdamW for embeddings, LM head, norms, biases,
# experts as Muon stacks, on a small GPT-like module.
import pytest
import torch
from torch import nn

import meshmuon.torch as dt

VOCAB, D = 50, 16


class MyRMSNorm(nn.Module):  # a model zoo's own norm class
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class Block(nn.Module):
    def __init__(self, moe=False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), MyRMSNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D, bias=False)
        if moe:
            self.router = nn.Linear(D, 4, bias=False)
            self.experts_w1 = nn.Parameter(torch.randn(4, 2 * D, D))  # [E, out, in]
        else:
            self.fc, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)


class GPT(nn.Module):
    def __init__(self, tied=True, head_name="lm_head", moe=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(32, D)
        self.blocks = nn.ModuleList([Block(), Block(moe=moe)])
        self.ln_f = nn.RMSNorm(D)
        head = nn.Linear(D, VOCAB, bias=False)
        if tied:
            head.weight = self.wte.weight
        setattr(self, head_name, head)


def names(groups, algorithm, expert=False):
    return sorted(n for g in groups if g["algorithm"] == algorithm
                  and bool(g.get("expert_stacks")) == expert for n, _ in g["params"])


@pytest.mark.parametrize("tied,head_name", [(True, "lm_head"), (False, "lm_head"),
                                            (False, "to_vocab")])
def test_gpt_like_model_groups(tied, head_name):
    model = GPT(tied=tied, head_name=head_name)
    groups = dt.param_groups(model)
    muon = names(groups, "muon")
    adamw = names(groups, "adamw")
    assert muon == sorted(f"blocks.{i}.{n}.weight" for i in (0, 1)
                          for n in ("qkv", "proj", "fc", "fc2"))
    for i in (0, 1):
        assert {f"blocks.{i}.ln1.weight", f"blocks.{i}.ln1.bias", f"blocks.{i}.ln2.weight",
                f"blocks.{i}.qkv.bias", f"blocks.{i}.fc.bias", f"blocks.{i}.fc2.bias"} <= set(adamw)
    assert {"wte.weight", "wpe.weight", "ln_f.weight"} <= set(adamw)
    # The head is AdamW: tied (it is the embedding's tensor, listed once), by name, or by vocab size.
    if not tied:
        assert f"{head_name}.weight" in adamw
    every = [p for g in groups for _, p in g["params"]]
    assert len(every) == len({id(p) for p in every}) == len(list(model.parameters()))
    opt = dt.Muon(groups)  # the groups are valid input
    assert opt.param_groups[0]["algorithm"] == "muon"


def test_experts_and_overrides():
    model = GPT(moe=True)
    groups = dt.param_groups(model, muon=dict(lr=0.02), adamw=dict(lr=3e-4),
                             experts=dict(weight_decay=0.0))
    assert names(groups, "muon", expert=True) == ["blocks.1.experts_w1"]
    assert "blocks.1.router.weight" in names(groups, "muon")
    by_kind = {(g["algorithm"], bool(g.get("expert_stacks"))): g for g in groups}
    assert by_kind[("muon", False)]["lr"] == 0.02 and by_kind[("adamw", False)]["lr"] == 3e-4
    assert by_kind[("muon", True)]["lr"] == 0.02 and by_kind[("muon", True)]["weight_decay"] == 0.0
    # With a name pattern, unmatched 3-D parameters go to AdamW.
    groups = dt.param_groups(model, expert_pattern=r"\.moe\.")
    assert "blocks.1.experts_w1" in names(groups, "adamw")
    dt.Muon(dt.param_groups(model))


def test_frozen_parameters_are_left_out_and_1d_never_reaches_muon():
    model = GPT(tied=False)
    model.blocks[0].qkv.weight.requires_grad_(False)
    groups = dt.param_groups(model)
    assert "blocks.0.qkv.weight" not in names(groups, "muon") + names(groups, "adamw")
    for g in groups:
        if g["algorithm"] == "muon":
            assert all(p.ndim >= 2 for _, p in g["params"])


def test_is_muon_routes_parameters_first():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 11))
    # the caller's rule: everything 2-D on Muon (the embedding and the head too), the rest by default
    groups = dt.param_groups(model, is_muon=lambda name, p: True if p.ndim == 2 else None)
    by_alg = {g["algorithm"]: [n for n, _ in g["params"]] for g in groups}
    assert by_alg["muon"] == ["0.weight", "1.weight", "2.weight"]
    assert by_alg["adamw"] == ["1.bias", "2.bias"]
    # False sends a matrix to AdamW
    groups = dt.param_groups(model, is_muon=lambda name, p: False if name == "1.weight" else None)
    by_alg = {g["algorithm"]: [n for n, _ in g["params"]] for g in groups}
    assert "muon" not in by_alg and "1.weight" in by_alg["adamw"]
    with pytest.raises(ValueError, match=r"is_muon\('1.bias'\) is True but the parameter is 1-D"):
        dt.param_groups(model, is_muon=lambda name, p: True)
    with pytest.raises(TypeError, match="return True, False or None"):
        dt.param_groups(model, is_muon=lambda name, p: "muon")
    with pytest.raises(TypeError, match="must be a callable"):
        dt.param_groups(model, is_muon=True)
    dt.Muon(dt.param_groups(model, is_muon=lambda name, p: True if p.ndim == 2 else None))
