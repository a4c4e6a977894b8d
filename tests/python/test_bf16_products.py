# ns_matmul_dtype="bf16" (Newton-Schulz products from bf16 operands, oneDNN) and `threads`
# (parameters updated at once): numerics against torch.optim.Muon, bitwise thread invariance, and
# the side effects a user would not expect (the torch thread count) checked absent.
import math

import pytest
import torch

import meshmuon
import meshmuon.torch as dt
from tolerances import per_step_bound

STEPS, LR = 10, 0.02
# Both optimizers round the Newton-Schulz operands to bf16 (unit roundoff u = 2^-8), each with its own
# error, so over T steps |p_meshmuon - p_torch| <= T * lr_adj * beta, lr_adj = lr * sqrt(max(1, A/B)),
# beta = 2^-4 for these dense inputs with min(m, n) >= 34 and 2 B(m, n) for any input
# (docs/python.md, tolerances.py; per step and per shape class in test_tolerances.py).
SHAPES = [(300, 140), (140, 300), (200, 200), (5, 70)]  # past one 128-row block of the products


def lr_adj(shape):
    a, b = shape
    return LR * math.sqrt(max(1.0, a / b))


def run(make, p0, grads):
    ps = [torch.nn.Parameter(p.clone()) for p in p0]
    opt = make(ps)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in ps]


def fixed_problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    p0 = [torch.randn(s, generator=gen) * 0.1 for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(STEPS)]
    return p0, grads


@pytest.mark.parametrize("ns_method", ["plain", "symmetric"])
def test_bf16_products_match_torch_muon(ns_method):
    p0, grads = fixed_problem()
    ref = run(lambda ps: torch.optim.Muon(ps, lr=LR), p0, grads)
    got = run(lambda ps: dt.Muon(ps, lr=LR, ns_method=ns_method, ns_matmul_dtype="bf16"), p0, grads)
    worst = max((a - b).abs().max().item()
                / (STEPS * lr_adj(tuple(a.shape)) * per_step_bound("bf16_products", *a.shape,
                                                                   dense=min(a.shape) >= 34))
                for a, b in zip(got, ref))
    print(f"max |dp| / tolerance: {worst:.2f}")
    assert worst < 1
    # Negative control: the fp32 products give other bits than the bf16 ones.
    fp32 = run(lambda ps: dt.Muon(ps, lr=LR, ns_method=ns_method, ns_matmul_dtype="fp32"), p0, grads)
    assert any(not torch.equal(a, b) for a, b in zip(fp32, got))


@pytest.mark.parametrize("matmul", ["fp32", "bf16"])
def test_threads_do_not_change_any_bit(matmul):
    p0, grads = fixed_problem(1)
    runs = [run(lambda ps: dt.Muon(ps, lr=LR, ns_matmul_dtype=matmul, threads=t), p0, grads)
            for t in (1, 2, 3, None)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    with pytest.raises(ValueError, match="threads"):
        dt.Muon([torch.nn.Parameter(torch.zeros(4, 4))], threads=0)


def test_step_leaves_the_torch_thread_count_alone():
    # oneDNN and PyTorch's CPU wheel may share one OpenMP runtime: meshmuon restores its thread count.
    before = torch.get_num_threads()
    p0, grads = fixed_problem(2)
    run(lambda ps: dt.Muon(ps, lr=LR, ns_matmul_dtype="bf16", threads=2), p0, grads[:1])
    run(lambda ps: dt.Muon(ps, lr=LR, ns_matmul_dtype="bf16", threads=1), p0, grads[:1])
    assert torch.get_num_threads() == before


def test_gram_with_bf16_products_is_refused_before_anything_runs():
    p = torch.nn.Parameter(torch.randn(8, 32))
    p.grad = torch.randn(8, 32)
    before = p.detach().clone()
    with pytest.raises(ValueError, match="gram needs matmul_dtype fp32"):
        opt = dt.Muon([p], ns_method="gram", ns_matmul_dtype="bf16")
        opt.step()
    assert torch.equal(p.detach(), before)
    with pytest.raises(ValueError, match="ns_matmul_dtype"):
        dt.Muon([p], ns_matmul_dtype="fp16").step()
