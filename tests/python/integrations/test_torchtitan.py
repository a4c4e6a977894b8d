"""torchtitan 0.3.0 with optimizer_name="MeshMuon" (meshmuon.integrations.torchtitan.MeshMuonOptimizers;
torchtitan_cases.py, torchrun, gloo): on 2 CPU ranks with FSDP2, torchtitan's container and lr
schedulers step bitwise the one-process meshmuon run; its flat FQN-keyed state saved through DCP
loads at 1 rank (plain tensors) bitwise, and the next step is bitwise the reference's. And
torchtitan's own llama3 debug model parallelized by its own parallelize_llama (FSDP2, then TP 2)
trains 3 steps bitwise the one-process container; importing it needs triton (scripts/setup.sh
installs it into a folder of its own, scripts/requirements-triton.txt; what else it needs on CPU:
torchtitan_cases.py).
Run: python -m pytest tests/python/integrations/test_torchtitan.py -q   (about 30 s + 25 s)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from launch import HERE, ok, torchrun

pytest.importorskip("torchtitan.components.optimizer")


def test_steps_then_reshard(tmp_path):
    args = ["--out", str(tmp_path)]
    proc = torchrun(2, HERE / "torchtitan_cases.py", ["--cases", "steps", *args], tmp_path)
    ok(proc, "torchrun --nproc-per-node 2 torchtitan_cases.py steps", ["steps"])
    proc = torchrun(1, HERE / "torchtitan_cases.py", ["--cases", "reshard", *args], tmp_path)
    ok(proc, "torchrun --nproc-per-node 1 torchtitan_cases.py reshard", ["reshard"])


# torchtitan.models.llama3 imports triton; scripts/setup.sh installs it into a folder of its own
# (scripts/requirements-triton.txt), on these ranks' PYTHONPATH only.
TRITON_SITE = Path(os.environ.get("MESHMUON_TRITON_SITE")
                   or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "meshmuon" / "triton-3.7.1")


def test_llama3_parallelize(tmp_path):
    if not (TRITON_SITE / ".complete").exists():
        pytest.skip(f"torchtitan.models.llama3 imports triton: scripts/setup.sh installs it into {TRITON_SITE}")
    proc = torchrun(2, HERE / "torchtitan_cases.py",
                    ["--cases", "llama3_fsdp,llama3_tp", "--out", str(tmp_path)], tmp_path,
                    PYTHONPATH=str(TRITON_SITE))
    ok(proc, "torchrun --nproc-per-node 2 torchtitan_cases.py llama3_fsdp,llama3_tp",
       ["llama3_fsdp", "llama3_tp"])
