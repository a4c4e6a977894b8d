"""PyTorch Lightning 2.6.6 ModelParallelStrategy (FSDP2 in configure_model) with
meshmuon.integrations.lightning.configure_muon (lightning_cases.py, torchrun, 2 CPU ranks, gloo):
parameters and state bitwise meshmuon.torch.Muon built by hand on the same FSDP2 model fed
Lightning's gradients and lrs; a distributed (DCP) checkpoint resumed bitwise the uninterrupted run.
Run: python -m pytest tests/python/integrations/test_lightning.py -q   (about 40 s)."""
from __future__ import annotations

import pytest
from launch import HERE, ok, torchrun

pytest.importorskip("pytorch_lightning")
CASES = ["fit", "resume"]


def test_lightning_cases(tmp_path):
    proc = torchrun(2, HERE / "lightning_cases.py", ["--cases", ",".join(CASES), "--out", str(tmp_path)],
                    tmp_path, timeout=240)
    ok(proc, "torchrun --nproc-per-node 2 lightning_cases.py", CASES)
