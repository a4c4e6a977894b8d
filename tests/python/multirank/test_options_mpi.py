"""meshmuon.torch.Muon's distributed-engine options under mpirun at 2 ranks (options_cases.py has the
cases): strategy pins per parameter / group / default change opt.plan() and not the bits, chunk_bytes
and window change the chunks, replica split / duplicate on HSDP, machine, bad values raise on every
rank, last_step_stats bytes equal the plan's prediction, profiler ranges and none_grad on DTensors,
offload_state bitwise as without.
Run: python -m pytest tests/python/multirank/test_options_mpi.py -q   (one mpirun launch, ~30 s on
2 cores)."""
from __future__ import annotations

from pathlib import Path

import pytest
from harness import MPIRUN, launch_mpirun

SCRIPT = Path(__file__).with_name("options_cases.py")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed")
CASES = ["pins", "chunks", "replica", "machine", "stats", "offload"]


def launch(ranks: int, cases: list[str], cwd: Path) -> str:
    return launch_mpirun(SCRIPT, ranks, ["--cases", ",".join(cases)], cwd)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return launch(2, CASES, tmp_path_factory.mktemp("options"))


@pytest.mark.parametrize("case", CASES)
def test_case(run, case):
    assert f"CASE {case} OK" in run.splitlines(), run[-3000:]


def test_failure_is_reported(tmp_path):
    # negative control: an unknown case makes the job fail with a non-zero exit code
    with pytest.raises(AssertionError, match="failed"):
        launch(2, ["no_such_case"], tmp_path)
