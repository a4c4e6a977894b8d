# The Python suites whose outcome depends on the CPU, run again as the other kinds of x86-64 CPU
# would run them (tests/support/cpu_kind.sh: AVX2-only, where oneDNN has no bf16 matmul and torch's
# bf16 matmul is ~100x slower than fp32; AVX-512 without bf16, where oneDNN emulates it; OpenBLAS's
# SkylakeX core with oneDNN uncapped, what AVX-512 machines run without OPENBLAS_CORETYPE), so that a
# machine of one kind sees what the others would fail. Skipped where this CPU lacks a kind's
# instructions. Each run is a pytest subprocess: the kind must be set before meshmuon and torch load.
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
KIND_SH = HERE.parent / "support" / "cpu_kind.sh"
SUITES = ["test_bf16_products.py", "test_options_surface.py", "test_bench.py"]


@pytest.mark.parametrize("kind", ["avx2", "avx512", "skylakex"])
def test_cpu_dependent_suites_pass_as_another_cpu_kind(kind):
    env = dict(os.environ)
    env.pop("MESHMUON_BF16_PRODUCTS", None)  # the kind's own choice
    proc = subprocess.run(["bash", str(KIND_SH), kind, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *SUITES], cwd=HERE, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode == 77:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, f"as a {kind} CPU:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    # the run really was another kind: avx2 / avx512 without oneDNN's native bf16 products, skylakex
    # on OpenBLAS's SkylakeX core (its bf16 products are whatever this CPU has)
    probe = subprocess.run(["bash", str(KIND_SH), kind, sys.executable, "-c",
                            "import meshmuon; i = meshmuon.cpu_info(); b = meshmuon.blas_info(); "
                            "print(i['bf16_products'], i['auto_matmul_dtype'], b['corename'])"],
                           cwd="/", env=env, capture_output=True, text=True, check=True)
    products, auto, core = probe.stdout.split()
    if kind == "skylakex":
        assert core.lower() == "skylakex", probe.stdout
    else:
        assert (products, auto) == ("widened", "fp32"), probe.stdout
