# pytest setup for the Python package tests: they exercise the INSTALLED `dmuon` (pip install .),
# never the source folder python/dmuon. Run: make test, or `python -m pytest tests/python -q`.
import os

import pytest

# Some machines force an OpenBLAS core in their environment (OPENBLAS_CORETYPE=Haswell here). The
# tests exercise dmuon's own choice (SkylakeX on AVX-512), under which its fp32 products give the
# same bits on any thread count; with Haswell's kernels they do not (measured), so the thread
# invariance tests would fail for a reason that is the environment's, not dmuon's. Before dmuon
# loads: the library reads the variable when it loads and OpenBLAS when it is first used.
os.environ.pop("OPENBLAS_CORETYPE", None)

import dmuon  # noqa: E402

_SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "python", "dmuon")
if os.path.realpath(os.path.dirname(dmuon.__file__)) == os.path.realpath(_SOURCE):
    raise RuntimeError("tests/python imported dmuon from the source tree, which has no _core; "
                       "pip install . and run pytest outside python/")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
