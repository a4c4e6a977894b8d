"""Shared by the integration tests (test side): `torchrun` launches a case script on CPU ranks
(gloo, one BLAS thread per rank, no model hub: HF_HUB_OFFLINE=1) and `ok` asserts the job succeeded
and that every named case printed "CASE <name> OK" (multirank/harness.py's run_cases)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
MULTIRANK = HERE.parent / "multirank"  # harness.py: run_cases, guarded, expect_same_error


def env(**extra: str) -> dict:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "MESHMUON_COMM",
              "ACCELERATE_USE_FSDP", "FSDP_VERSION"):
        out.pop(k, None)
    first = [extra.pop("PYTHONPATH")] if "PYTHONPATH" in extra else []  # a case's own folders first
    path = os.pathsep.join(first + [str(HERE), str(MULTIRANK)] + ([out["PYTHONPATH"]] if out.get("PYTHONPATH") else []))
    out.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled", PYTHONPATH=path, **extra)
    return out


def torchrun(ranks: int, script: Path, args: list[str], cwd: Path, timeout: int = 180,
             **extra: str) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc-per-node ranks script args`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(ranks), str(script), *args]
    return subprocess.run(cmd, env=env(**extra), capture_output=True, text=True, timeout=timeout,
                          cwd=str(cwd))


def ok(proc: subprocess.CompletedProcess, what: str, cases: list[str]) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{out[-8000:]}"
    lines = proc.stdout.splitlines()
    for case in cases:
        assert f"CASE {case} OK" in lines, f"{what}: no 'CASE {case} OK'\n{out[-4000:]}"
    return proc.stdout
