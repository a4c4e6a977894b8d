# pytest setup for the Python package tests: they exercise the INSTALLED `meshmuon` (pip install .),
# never the source folder python/meshmuon. Run: make test, or `python -m pytest tests/python -q`.
import os

import pytest

import meshmuon

_SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "python", "meshmuon")
if os.path.realpath(os.path.dirname(meshmuon.__file__)) == os.path.realpath(_SOURCE):
    raise RuntimeError("tests/python imported meshmuon from the source tree, which has no _core; "
                       "pip install . and run pytest outside python/")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
