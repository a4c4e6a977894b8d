# The agreement bounds with torch.optim.Muon stated in docs/python.md ("Numerics vs
# torch.optim.Muon"), shared by the tests: after T steps |p_meshmuon - p_torch| <= T * lr_adj * beta,
# beta per step from the parameter's (one expert's) shape m x n and the meshmuon mode.
import math

# mode: (multiple of bound_any for any input, bound for dense inputs with min(m, n) >= 34)
MODE_BOUNDS = {"fp32": (1.0, 2**-5), "ns_bf16": (1 / 8, 2**-6), "bf16_products": (2.0, 2**-4)}


def bound_any(m, n):
    """B(m, n): per-step bound in units of lr_adj for any input (Jordan coefficients, 5 steps):
    2^-5 for a vector, else min(1.5, 3 sqrt(ln(mn) / max(m, n)))."""
    if min(m, n) == 1:
        return 2**-5
    return min(1.5, 3 * math.sqrt(math.log(m * n) / max(m, n)))


def per_step_bound(mode, m, n, dense=False):
    mult, dense_bound = MODE_BOUNDS[mode]
    return dense_bound if dense else mult * bound_any(m, n)
