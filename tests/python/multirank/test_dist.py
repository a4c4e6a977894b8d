"""meshmuon.torch.Muon on DTensors under mpirun: FSDP2 at 2 and 4 ranks (uneven and empty shards, an
expert stack), HSDP 2x2 with NorMuon, TP + FSDP (_StridedShard), torchtitan-style experts on a
second mesh, plain tensors at 2 ranks (the distributed engine, replicated), bad input, and DCP save
at 4 ranks -> load at 2 (FSDP) and at 4 (HSDP) -> continue; all BITWISE against the single-process
meshmuon run (dist_cases.py has the cases).
Run: python -m pytest tests/python/multirank -q   (three mpirun launches, about 40 s on 2 cores)."""
from __future__ import annotations

from pathlib import Path

import pytest
from harness import MPIRUN, launch_mpirun

SCRIPT = Path(__file__).with_name("dist_cases.py")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed")


def launch(ranks: int, cases: list[str], ckpt: Path) -> str:
    return launch_mpirun(SCRIPT, ranks, ["--cases", ",".join(cases), "--ckpt", str(ckpt)], ckpt.parent)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("dcp") / "ckpt"
    four = launch(4, ["fsdp", "hsdp", "tp", "ep", "bad_input", "dcp_save", "dcp_load_hsdp"], ckpt)
    two = launch(2, ["fsdp", "dcp_load_fsdp", "bad_input", "plain"], ckpt)
    three = launch(3, ["agreement"], ckpt)
    return {4: four, 2: two, 3: three}


@pytest.mark.parametrize("ranks,case", [
    (4, "fsdp"), (4, "hsdp"), (4, "tp"), (4, "ep"), (4, "bad_input"), (4, "dcp_save"),
    (4, "dcp_load_hsdp"), (2, "fsdp"), (2, "dcp_load_fsdp"), (2, "bad_input"), (2, "plain"), (3, "agreement")])
def test_case(runs, ranks, case):
    assert f"CASE {case} OK" in runs[ranks].splitlines(), runs[ranks][-3000:]


def test_failure_is_reported(tmp_path):
    # negative control: an unknown case makes the job fail with a non-zero exit code
    with pytest.raises(AssertionError, match="failed"):
        launch(2, ["no_such_case"], tmp_path / "ckpt")
