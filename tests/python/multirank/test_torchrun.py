"""meshmuon.torch.Muon under torchrun: the engine on the job's torch.distributed process group (the c10d
communicator, meshmuon/torch/_c10d.py), no MPI. The mpirun suite's cases (dist_cases.py) at 4, 2 and 3
ranks, BITWISE against the single-process run as under mpirun, and ZeRO with reduce_grads and bf16
masters at 2 ranks (zero_cases.py); the transport's operations against
their exact meaning (c10d_cases.py transport, 3 ranks); a rank that never steps makes the others
raise meshmuon.MeshmuonError naming the op within MESHMUON_TIMEOUT_S (no hang); MPI and c10d communicators
in one mpirun job give the same bytes and bits; and every run ends without nanobind's leak report
(negative control: without meshmuon's exit hook an optimizer kept alive past exit is reported).
Run: python -m pytest tests/python/multirank/test_torchrun.py -q   (2.5 minutes on 2 loaded cores)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import MPIRUN, launch_mpirun

HERE = Path(__file__).parent
DIST_CASES = HERE / "dist_cases.py"
C10D_CASES = HERE / "c10d_cases.py"
ZERO_CASES = HERE / "zero_cases.py"
ZERO = ["bitwise", "reduce_float", "bf16", "state_dict", "state_dict_kept_at_exit"]

pytest.importorskip("torch.distributed.run")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "MESHMUON_COMM"):
        env.pop(k, None)
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)
    return env


def torchrun(ranks: int, script: Path, args: list[str], cwd: Path, timeout: int = 240,
             **env: str) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone` (a free rendezvous port of its own)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(ranks), str(script), *args]
    return subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=timeout,
                          cwd=str(cwd))


def ok(proc: subprocess.CompletedProcess, what: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{out[-6000:]}"
    return proc.stdout


def leaked(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if "leaked" in line]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("dcp") / "ckpt"
    out = {}
    for ranks, cases in ((4, ["fsdp", "hsdp", "tp", "ep", "bad_input", "dcp_save", "dcp_load_hsdp"]),
                         (2, ["fsdp", "dcp_load_fsdp", "bad_input", "plain"]),
                         (3, ["agreement"])):
        proc = torchrun(ranks, DIST_CASES, ["--cases", ",".join(cases), "--ckpt", str(ckpt)], ckpt.parent)
        out[ranks] = (ok(proc, f"torchrun --nproc-per-node {ranks} {cases}"), proc)
    # ZeRO over plain replicated parameters (zero_cases.py: bitwise vs one process, reduce_grads)
    proc = torchrun(2, ZERO_CASES, ["--cases", ",".join(ZERO), "--ckpt", str(ckpt) + "_zero"],
                    ckpt.parent)
    out["zero"] = (ok(proc, f"torchrun --nproc-per-node 2 zero_cases {ZERO}"), proc)
    return out


@pytest.mark.parametrize("ranks,case", [
    (4, "fsdp"), (4, "hsdp"), (4, "tp"), (4, "ep"), (4, "bad_input"), (4, "dcp_save"),
    (4, "dcp_load_hsdp"), (2, "fsdp"), (2, "dcp_load_fsdp"), (2, "bad_input"), (2, "plain"),
    (3, "agreement")])
def test_case(runs, ranks, case):
    stdout = runs[ranks][0]
    assert "COMM c10d" in stdout.splitlines(), stdout[-2000:]  # the engine ran on c10d, not MPI
    assert f"CASE {case} OK" in stdout.splitlines(), stdout[-3000:]


@pytest.mark.parametrize("case", ZERO)
def test_zero_case(runs, case):
    stdout = runs["zero"][0]
    assert f"CASE {case} OK" in stdout.splitlines(), stdout[-3000:]


def test_runs_end_without_leak_report(runs):
    for ranks, (_, proc) in runs.items():
        assert not leaked(proc), (ranks, leaked(proc)[:5])


def test_transport_operations_and_release_at_exit(tmp_path):
    proc = torchrun(3, C10D_CASES, ["--cases", "transport,hold"], tmp_path)
    stdout = ok(proc, "c10d_cases transport,hold")
    assert "CASE transport OK" in stdout and "CASE hold OK" in stdout, stdout
    # nothing at all: the optimizer's checked options hold a native MachineProfile too
    assert not leaked(proc), proc.stderr[-3000:]


def test_nccl_bootstrap_over_torch_distributed(tmp_path):
    # the device communicator's bootstrap over torch.distributed: every rank raises (no hang)
    proc = torchrun(2, C10D_CASES, ["--cases", "nccl_bootstrap"], tmp_path, timeout=120)
    stdout = ok(proc, "c10d_cases nccl_bootstrap")
    assert "CASE nccl_bootstrap OK" in stdout, stdout + proc.stderr[-3000:]


def test_leak_check_negative_control(tmp_path):
    # without meshmuon's exit hook, the optimizer a daemon thread keeps is reported as leaked: the
    # check above can fail
    proc = torchrun(2, C10D_CASES, ["--cases", "hold"], tmp_path, MESHMUON_TEST_NO_SHUTDOWN="1")
    ok(proc, "c10d_cases hold without the exit hook")
    lines = leaked(proc)
    assert any("meshmuon._core.Optimizer" in line for line in lines), proc.stderr[-3000:]
    assert any("meshmuon._core.Communicator" in line for line in lines), proc.stderr[-3000:]


def test_timeout_raises_on_the_waiting_ranks(tmp_path):
    t0 = time.time()
    proc = torchrun(2, C10D_CASES, ["--cases", "timeout"], tmp_path, timeout=120, MESHMUON_TIMEOUT_S="4")
    took = time.time() - t0
    stdout = ok(proc, "c10d_cases timeout")
    assert "CASE timeout OK rank 0" in stdout, stdout + proc.stderr[-3000:]
    line = next(l for l in stdout.splitlines() if l.startswith("TIMEOUT rank 0"))
    assert "timed out after 4 s" in line and "[c10d] rank 0:" in line, line
    assert took < 90, took  # no hang: the job ends once rank 1 gives up sleeping


@pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed")
def test_same_bytes_and_bits_as_mpi(tmp_path):
    # one mpirun job steps the same model on an MPI and a c10d communicator (no leak report either)
    assert "CASE bytes OK" in launch_mpirun(C10D_CASES, 2, ["--cases", "bytes"], tmp_path)
