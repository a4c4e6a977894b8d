"""bf16 parameters under owner placement at 2 and 3 ranks (owner_bf16_cases.py under torchrun).
Run: python -m pytest tests/python/multirank/test_owner_bf16.py -q"""
from __future__ import annotations

from pathlib import Path

import pytest
from test_torchrun import leaked, ok, torchrun

HERE = Path(__file__).parent
CASES = HERE / "owner_bf16_cases.py"

pytest.importorskip("torch.distributed.run")


@pytest.mark.parametrize("ranks", [2, 3])
def test_bf16_owned_matrices_step_through_masters(ranks):
    proc = torchrun(ranks, CASES, [], HERE, timeout=240)
    assert "CASE bf16_owned OK" in ok(proc, f"torchrun -np {ranks} owner_bf16_cases.py")
    assert not leaked(proc)
