"""Shared by the multi-rank tests. Test side: `launch_mpirun` runs a case script under mpirun and
returns its stdout (asserting exit code 0 and no nanobind leak report at exit). Rank side (inside a case script): `run_cases` runs the
named cases in order, each followed by a barrier and rank 0 printing "CASE <name> OK" (what the
tests look for), and `guarded` ends the whole job with a non-zero code on any exception, so a
failing rank never leaves the others waiting."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

MPIRUN = shutil.which("mpirun")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_mpirun(script: Path, ranks: int, args: list[str], cwd: Path, timeout: int = 240) -> str:
    """`mpirun -np ranks python script args` (oversubscribed, unbound, one BLAS thread per rank, a
    free MASTER_PORT for torch's process group); stdout, after asserting the job succeeded."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()),
               PYTHONWARNINGS="ignore")
    env.pop("MESHMUON_COMM", None)  # the scripts choose their communicator themselves
    cmd = [MPIRUN, "-np", str(ranks), "--oversubscribe", "--bind-to", "none", sys.executable,
           str(script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(cwd))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mpirun -np {ranks} {script.name} {args} failed:\n{out[-6000:]}"
    # every multi-rank run ends cleanly: nothing native outlives the interpreter (nanobind's report)
    leaks = [line for line in proc.stderr.splitlines() if "leaked" in line]
    assert not leaks, f"mpirun -np {ranks} {script.name}: nanobind leak report:\n" + "\n".join(leaks)
    return proc.stdout


def say(msg: str) -> None:
    """Prints on rank 0 only (flushed: the tests read the job's stdout)."""
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(msg, flush=True)


def run_cases(cases: dict[str, Callable[[], None]], names: str) -> None:
    """Runs the comma-separated `names` of `cases` in order, then ends torch's process group."""
    import torch.distributed as dist
    for name in names.split(","):
        if name not in cases:
            raise ValueError(f"unknown case {name!r}; the cases are {sorted(cases)}")
        cases[name]()
        dist.barrier()
        say(f"CASE {name} OK")
    dist.destroy_process_group()


def expect_same_error(fn: Callable[[], object], kind: type, *needles: str) -> str:
    """fn() must raise `kind` whose message contains every needle, and every rank must get the very
    same message (collective: all ranks call it). Returns the message."""
    import torch.distributed as dist
    try:
        fn()
    except kind as e:
        msg = str(e)
    else:
        raise AssertionError(f"no {kind.__name__} raised (expected {needles})")
    for needle in needles:
        assert needle in msg, (needle, msg)
    msgs = [None] * dist.get_world_size()
    dist.all_gather_object(msgs, msg)
    assert all(m == msg for m in msgs), msgs  # the same error on every rank
    return msg


def guarded(main: Callable[[], None]) -> None:
    """Runs main(); on any exception prints it and aborts the whole job (meshmuon.abort_all)."""
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        import meshmuon
        meshmuon.abort_all(1)
