"""Owner placement's misuses under torchrun (owner_edge_cases.py, 4 ranks on gloo): own() after
fully_shard, a list for mesh, an owned matrix also handed to fully_shard (first forward, and Muon()
built first). Each case runs in a job of its own with a deadline: a rank that hangs (a mismatched
collective) fails its test instead of hanging the suite, and the whole job is killed.
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


@pytest.mark.parametrize("case", ["after_fully_shard", "mesh_list", "also_sharded_forward",
                                  "also_sharded_sequential", "also_sharded_optimizer"])
def test_misuse_raises_on_every_rank(case):
    rc, out, err = torchrun_job(RANKS, case)
    assert rc == 0 and f"CASE {case} OK" in out.splitlines(), f"{case} ({rc}):\n{(out + err)[-6000:]}"
    assert not leaked(subprocess.CompletedProcess([], rc, out, err)), err[-3000:]
