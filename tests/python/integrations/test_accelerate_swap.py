"""meshmuon.torch.Muon survives Accelerate's FSDP2 parameter swap (swap_cases.py, torchrun, 2 CPU
ranks, gloo): built on the plain model, its param_groups rewritten in place with the sharded
DTensors, it notices at the next step / state_dict / load_state_dict and rebuilds its engine; steps are bitwise
those of Muon built on the FSDP2 model, state carries over by position, and parameters of other
shapes raise the same error on every rank. Needs no accelerate (the swap is reproduced).
Run: python -m pytest tests/python/integrations/test_accelerate_swap.py -q   (about 30 s)."""
from __future__ import annotations

import pytest
from launch import HERE, ok, torchrun

pytest.importorskip("torch.distributed.run")
CASES = ["fresh", "resume", "carried", "mismatch"]


def test_swap_cases(tmp_path):
    proc = torchrun(2, HERE / "swap_cases.py", ["--cases", ",".join(CASES)], tmp_path)
    ok(proc, "torchrun --nproc-per-node 2 swap_cases.py", CASES)
