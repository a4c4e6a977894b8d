# Split orthogonalization (num_heads / split_sizes, issue 37) against references that do not come
# from meshmuon: a Dion-style group translated by from_dion steps each row block as Dion's update of a
# separate matrix (migrate_reference.py, float64, per block: its own normalization and adjust_lr),
# each block's first update is the block's polar factor (LAPACK SVD, float64) within the Newton-
# Schulz band, and, when Dion's GitHub snapshot is on this machine, Dion's own Muon (run on the CPU
# in a subprocess) agrees within its bf16 Newton-Schulz bound. Negative controls: the whole matrix's
# reference / polar factor / unsplit meshmuon run is far outside each bound.
# Run: PYTHONPATH=build/python-stage python3 -m pytest tests/python/test_split_numerics.py -q
import json
import os
import shutil
import subprocess
import sys
import tarfile
import io
from pathlib import Path

import pytest
import torch

import meshmuon.torch as dt
from migrate_reference import DION, POLAR_EXPRESS, Reference

SCHEDULE = [(0.02, 0.1, 0.9), (0.03, 0.05, 0.95), (0.01, 0.2, 0.85)]  # lr, wd, mu
# fused GQA QKV [q 32 | k 16 | v 16] x 16 (uneven blocks) and a per-head projection [64, 32] as
# 4 heads of [16, 32] (wide blocks of a tall matrix: per block, adjust_lr and the Gram side differ)
QKV, QKV_SPLIT = (64, 16), (32, 16, 16)
PROJ, HEADS = (64, 32), 4
TOL = 1e-4  # fp32 against float64 over the schedule, in units of lr_adj (as test_migrate_numerics)


def blocks_of(shape, split):
    out, row = [], 0
    for b in split:
        out.append((row, row + b))
        row += b
    return out


def dion_groups(params, split=True):
    qkv, proj = params
    extra = (dict(split_sizes=QKV_SPLIT), dict(num_heads=HEADS)) if split else ({}, {})
    return [dict(params=[qkv], **extra[0]), dict(params=[proj], **extra[1])]


def make_params(seed=7):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=gen) * 0.1) for s in (QKV, PROJ)], gen


def splits():
    return [blocks_of(QKV, QKV_SPLIT), blocks_of(PROJ, [PROJ[0] // HEADS] * HEADS)]


def test_from_dion_steps_each_block_as_dion_steps_a_matrix():
    params, gen = make_params()
    whole = [Reference(p.detach(), DION) for p in params]  # negative control: unsplit
    refs = [[Reference(p.detach()[a:b], DION) for a, b in blocks] for p, blocks in zip(params, splits())]
    opt = dt.Muon(**dt.from_dion(dion_groups(params), adjust_lr="rms_norm"), ns_matmul_dtype="fp32")
    assert [g.get("split_sizes") for g in opt.param_groups] == [QKV_SPLIT, None]
    assert [g.get("num_heads") for g in opt.param_groups] == [None, HEADS]
    worst, worst_whole = 0.0, 0.0
    for lr, wd, mu in SCHEDULE:
        grads = [torch.randn(*p.shape, generator=gen) for p in params]
        for group in opt.param_groups:
            group["lr"], group["weight_decay"], group["mu"] = lr, wd, mu  # Dion's own keys
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for p, g, blocks, brefs, wref in zip(params, grads, splits(), refs, whole):
            lr_w = wref.step(g, lr, wd, mu)
            worst_whole = max(worst_whole, (p.detach().double() - wref.p).abs().max().item() / lr_w)
            for (a, b), ref in zip(blocks, brefs):
                lr_adj = ref.step(g[a:b], lr, wd, mu)
                worst = max(worst, (p.detach()[a:b].double() - ref.p).abs().max().item() / lr_adj)
    assert worst < TOL, worst
    assert worst_whole > 100 * TOL, worst_whole  # the whole matrix's update is another one


def polar(x: torch.Tensor) -> torch.Tensor:
    u, _, vh = torch.linalg.svd(x.double(), full_matrices=False)  # LAPACK
    return u @ vh


def ns_bound(x: torch.Tensor, scale=1.02, eps=1e-8) -> float:
    """The Newton-Schulz bound of one block: Newton-Schulz maps each singular value s of
    X / (scale |X|_F + eps) through the schedule's odd polynomials (exact arithmetic), so its output
    is U f(S) V^T and ||U f(S) V^T - U V^T||_2 = max |f(s) - 1| (Dion's Polar Express, 5 steps)."""
    x = x.double()
    s = torch.linalg.svdvals(x) / (scale * x.norm() + eps)
    for a, b, c in POLAR_EXPRESS:
        s = a * s + b * s**3 + c * s**5
    return (s - 1).abs().max().item()


SLACK = 1e-4  # fp32 products against the exact polynomial


def test_each_blocks_first_update_is_its_polar_factor():
    params, gen = make_params(seed=3)
    before = [p.detach().clone() for p in params]
    kwargs = dt.from_dion(dion_groups(params), adjust_lr=None, weight_decay=0.0)  # lr_adj = lr
    opt = dt.Muon(**kwargs, ns_matmul_dtype="fp32")
    grads = [torch.randn(*p.shape, generator=gen) for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()  # heavy ball, no Nesterov, first step: the orthogonalized input is the gradient
    lr = opt.param_groups[0]["lr"]
    for p, p0, g, blocks in zip(params, before, grads, splits()):
        update = (p0.double() - p.detach().double()) / lr
        whole = polar(g)
        for a, b in blocks:
            bound = ns_bound(g[a:b])
            err = torch.linalg.matrix_norm(update[a:b] - polar(g[a:b]), ord=2).item()
            assert err <= bound + SLACK, (p.shape, a, b, err, bound)
            # negative control: the whole matrix's polar factor restricted to the block's rows
            assert torch.linalg.matrix_norm(update[a:b] - whole[a:b], ord=2).item() > 2 * bound + 0.1


# ---- Dion itself, from its GitHub snapshot (fetched under /work/.mirror), when present -----------

DION_GIT = Path(os.environ.get("MESHMUON_DION_MIRROR", "/work/.mirror/microsoft+dion/repo"))
DION_SCRIPT = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from dion.muon import Muon
spec = json.loads(open(sys.argv[2]).read())
params = [torch.nn.Parameter(torch.tensor(w)) for w in spec["weights"]]
groups = [dict(params=[p], **extra) for p, extra in zip(params, spec["extra"])]
opt = Muon(groups, lr=spec["lr"], mu=spec["mu"], weight_decay=spec["wd"], adjust_lr="rms_norm")
for step in spec["grads"]:
    for p, g in zip(params, step):
        p.grad = torch.tensor(g)
    opt.step()
open(sys.argv[3], "w").write(json.dumps([p.detach().tolist() for p in params]))
"""


def dion_snapshot(tmp: Path) -> Path:
    """Dion's python package from the fetched snapshot (a bare git directory), or a skip."""
    git = shutil.which("git")
    if git is None or not (DION_GIT / "HEAD").exists():
        pytest.skip(f"Dion's snapshot is not on this machine ({DION_GIT}); fetch github:microsoft/dion")
    archive = subprocess.run([git, "--git-dir", str(DION_GIT), "archive", "HEAD", "dion"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp


def run_dion(root: Path, weights, grads, extra, lr, mu, wd):
    spec, result = root / "spec.json", root / "result.json"
    spec.write_text(json.dumps(dict(weights=[w.tolist() for w in weights], extra=extra, lr=lr, mu=mu,
                                    wd=wd, grads=[[g.tolist() for g in step] for step in grads])))
    # torch.compile is Dion's speed-up, not its arithmetic: eager keeps the CPU run short
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", DION_SCRIPT, str(root), str(spec), str(result)],
                         capture_output=True,
                         text=True, env=env, timeout=600)
    if out.returncode != 0 and "ModuleNotFoundError" in out.stderr:
        pytest.skip(f"Dion's snapshot does not import here: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr[-3000:]
    return [torch.tensor(w) for w in json.loads(result.read_text())]


# Dion orthogonalizes in bf16 (dion/polar_express.py: G.bfloat16()), meshmuon here in fp32: per
# step, a bf16 Newton-Schulz bound of 2^-4 lr_adj per element (tests/python/tolerances.py's dense
# bf16-products bound); measured: at most 0.085 lr_adj after 2 steps, and 0.29 to 0.52 for the
# unsplit run (the negative control).
DION_BOUND = 2**-4


def test_dion_num_heads_and_split_sizes_migrate(tmp_path):
    root = dion_snapshot(tmp_path)
    params, gen = make_params(seed=5)
    weights = [p.detach().clone() for p in params]
    lr, mu, wd, steps = 0.02, 0.95, 0.1, 2
    grads = [[torch.randn(*p.shape, generator=gen) for p in params] for _ in range(steps)]
    extra = [dict(split_sizes=list(QKV_SPLIT)), dict(num_heads=HEADS)]
    theirs = run_dion(root, weights, grads, extra, lr, mu, wd)

    def ours(split):
        ps = [torch.nn.Parameter(w.clone()) for w in weights]
        groups = [dict(params=[p], **(e if split else {})) for p, e in zip(ps, extra)]
        opt = dt.Muon(**dt.from_dion(groups, lr=lr, mu=mu, weight_decay=wd, adjust_lr="rms_norm"),
                      ns_matmul_dtype="fp32")
        for step in grads:
            for p, g in zip(ps, step):
                p.grad = g.clone()
            opt.step()
        return [p.detach() for p in ps]

    for split in (True, False):  # negative control: meshmuon unsplit against Dion split
        for w, t, blocks in zip(ours(split), theirs, splits()):
            errs = []
            for a, b in blocks:
                lr_adj = lr * 0.2 * max(b - a, w.shape[1]) ** 0.5  # Dion's rms_norm on the block
                errs.append((w[a:b] - t[a:b]).abs().max().item() / lr_adj)
            if split:
                assert max(errs) < steps * DION_BOUND, (tuple(w.shape), errs)
            else:
                assert max(errs) > 2 * steps * DION_BOUND, (tuple(w.shape), errs)
