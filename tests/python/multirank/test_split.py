"""Split orthogonalization (num_heads / split_sizes) bitwise against the single-process run under
mpirun (split_cases.py has the cases): FSDP over 3 ranks (uneven shards, every strategy), HSDP 2x2
with NorMuon, TP 2 x FSDP 2 with NorMuon.
Run: python -m pytest tests/python/multirank/test_split.py -q"""
from __future__ import annotations

from pathlib import Path

import pytest
from harness import MPIRUN, launch_mpirun

SCRIPT = Path(__file__).with_name("split_cases.py")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed")


def launch(ranks: int, cases: list[str], cwd: Path) -> str:
    return launch_mpirun(SCRIPT, ranks, ["--cases", ",".join(cases)], cwd)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("split")
    return {3: launch(3, ["fsdp3"], cwd), 4: launch(4, ["hsdp", "tp"], cwd)}


@pytest.mark.parametrize("ranks,case", [(3, "fsdp3"), (4, "hsdp"), (4, "tp")])
def test_case(runs, ranks, case):
    assert f"CASE {case} OK" in runs[ranks].splitlines(), runs[ranks][-3000:]


def test_failure_is_reported(tmp_path):
    # negative control: an unknown case makes the job fail with a non-zero exit code
    with pytest.raises(AssertionError, match="failed"):
        launch(2, ["no_such_case"], tmp_path)
