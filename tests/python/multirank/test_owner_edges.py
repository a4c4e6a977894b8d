"""Owner placement's misuses under torchrun (owner_edge_cases.py, 4 ranks on gloo): own() after
fully_shard, a list for mesh, an owned matrix also handed to fully_shard (first forward, and Muon()
built first). Each job has a deadline: a rank that hangs (a mismatched collective) fails its
tests instead of hanging the suite, and the whole job is killed.
Run: python -m pytest tests/python/multirank/test_owner_edges.py -q"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_torchrun import _env, leaked

HERE = Path(__file__).parent
CASES = HERE / "owner_edge_cases.py"
RANKS = 4
DEADLINE_S = 150

pytest.importorskip("torch.distributed.run")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def torchrun_job(ranks: int, case: str) -> tuple[int, str, str]:
    """test_torchrun's launch (python -m torch.distributed.run --standalone); a job past its deadline
    is killed, torchrun and every rank: (exit code, stdout, stderr); -9 on timeout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           str(CASES), "--cases", case]
    proc = subprocess.Popen(cmd, env=_env(), cwd=str(HERE), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=DEADLINE_S)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        for pid in [*descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate()
        return -9, out, err + f"\n(killed: no result after {DEADLINE_S} s, a hang)"


# Jobs: the checks that involve no collective share one; each forward case (gloo aborted, or the
# ranks hung, before the checks) has its own.
JOBS = [["after_fully_shard", "mesh_list", "also_sharded_optimizer"], ["also_sharded_forward"],
        ["also_sharded_sequential"]]


@pytest.fixture(scope="module")
def jobs():
    done: dict[str, tuple[int, str, str]] = {}  # each job run once, when a test first needs it
    return lambda job: done[job] if job in done else done.setdefault(job, torchrun_job(RANKS, job))


@pytest.mark.parametrize("job,case", [(",".join(cases), c) for cases in JOBS for c in cases])
def test_misuse_raises_on_every_rank(jobs, job, case):
    rc, out, err = jobs(job)
    assert f"CASE {case} OK" in out.splitlines(), f"{case} (job {job}, exit {rc}):\n{(out + err)[-6000:]}"
    assert rc == 0, f"job {job} exit {rc}:\n{(out + err)[-6000:]}"
    assert not leaked(subprocess.CompletedProcess([], rc, out, err)), err[-3000:]
