"""A step through the installed wheel's engine without torch (tests/wheel/cleanroom.sh, every CPython).

meshmuon.LocalOptimizer over numpy arrays (DLPack): a tall and a wide Muon matrix and an AdamW bias,
three steps of inputs made from integers (the same bits under every numpy). With --no-torch, checks
that torch is not installed (the step needs none). Checks that every parameter moved, and that one step's Muon update is
an orthogonalization (singular values of the update in Polar Express's band). Prints the parameters'
SHA-256: the clean room compares it across interpreters, which run the same engine and must agree
bitwise. Usage: python engine_step.py [--no-torch]
"""
import hashlib
import importlib.util
import sys

import numpy as np

import meshmuon


def values(n: int, seed: int) -> np.ndarray:
    """n floats in [-1, 1), a fixed function of (n, seed): splitmix64 on uint64 arrays (wrapping
    arithmetic, the same in every numpy), not numpy's generators, whose streams may change."""
    z = np.arange(n, dtype=np.uint64) + np.uint64((seed + 1) * 0x9E3779B97F4A7C15 % (1 << 64))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(40)).astype(np.float64) / float(1 << 23) - 1.0).astype(np.float32)


def main() -> None:
    if "--no-torch" in sys.argv[1:]:
        assert importlib.util.find_spec("torch") is None, "torch is installed here: this room runs without it"
    shapes = {"w_tall": (48, 20), "w_wide": (20, 48), "bias": (16,)}
    infos = []
    for name, shape in shapes.items():
        info = meshmuon.ParamInfo()
        info.name, info.shape = name, list(shape)
        infos.append(info)
    muon = meshmuon.GroupOptions()
    muon.lr, muon.weight_decay = 0.02, 0.0  # no decay: a step's change is lr_adj * U
    muon.ns.schedule = "polar_express"
    adamw = meshmuon.GroupOptions()
    adamw.algorithm, adamw.lr = "adamw", 3e-3
    groups = [meshmuon.ParamGroup(), meshmuon.ParamGroup()]
    groups[0].options, groups[0].params = muon, [0, 1]
    groups[1].options, groups[1].params = adamw, [2]
    opt = meshmuon.LocalOptimizer(infos, groups)

    params = [values(int(np.prod(s)), k).reshape(s) * 0.5 for k, s in enumerate(shapes.values())]
    initial = [p.copy() for p in params]
    for step in range(1, 4):
        grads = [values(p.size, 100 * step + k).reshape(p.shape) for k, p in enumerate(params)]
        before = params[0].copy()
        assert opt.step(params, grads), f"step {step} was skipped"
        if step == 1:  # the Muon update of w_tall: p <- p - lr_adj * U
            update = before - params[0]
            s = np.linalg.svd(update.astype(np.float64), compute_uv=False)
            s = s / s.max()
            assert s.min() > 0.5, f"the update is not an orthogonalization: singular values {s}"
    for name, p, p0 in zip(shapes, params, initial):
        assert not np.array_equal(p, p0), f"{name} did not move"
        assert np.isfinite(p).all(), name
    digest = hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest()
    print(f"engine_step: python {sys.version.split()[0]} meshmuon {meshmuon.__version__} sha256 {digest}")


if __name__ == "__main__":
    main()
