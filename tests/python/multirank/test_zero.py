"""meshmuon.torch.Muon with zero=True (ZeRO over plain replicated parameters), reduce_grads, bf16
parameters with fp32 masters (plain, and FSDP2 DTensor shards with a DCP round trip) and FSDP2's
MixedPrecisionPolicy, under mpirun at 2, 3 (uneven shards) and 4 ranks, and a DCP checkpoint of
ZeRO state saved at 4 ranks and loaded at 2; all BITWISE against the single-process meshmuon run given
the same reduced gradients (zero_cases.py has the cases). One-process ZeRO (a one-rank world) runs
here without mpirun.
Run: python -m pytest tests/python/multirank/test_zero.py -q   (four mpirun launches, 52 CPU-seconds;
117-169 s wall measured on 2 cores shared with other builds, load 13-18)"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from harness import MPIRUN, launch_mpirun
import torch
import torch.nn as nn

import meshmuon.torch as dt

SCRIPT = Path(__file__).with_name("zero_cases.py")
needs_mpi = pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed")


def launch(ranks: int, cases: list[str], cwd: Path) -> str:
    return launch_mpirun(SCRIPT, ranks, ["--cases", ",".join(cases),
                                         "--ckpt", str(cwd / f"ckpt_np{ranks}")], cwd)


# 4 ranks first: its DCP checkpoint of ZeRO state is loaded (resharded) at 2 ranks.
CASES = {
    4: ["bitwise", "reduce_float", "state_dict", "fsdp_bf16", "dcp_save"],
    2: ["bitwise", "reduce_int", "reduce_float", "bf16", "state_dict", "bad_options", "fsdp_mp",
        "fsdp_bf16", "dcp_load_from4", "bf16_replicated", "state_dict_kept_at_exit"],
    3: ["bitwise", "reduce_float", "bf16", "add_group"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("zero")
    return {n: launch(n, cases, cwd) for n, cases in CASES.items()}


@needs_mpi
@pytest.mark.parametrize("ranks,case", [(n, c) for n, cases in CASES.items() for c in cases])
def test_case(runs, ranks, case):
    assert f"CASE {case} OK" in runs[ranks].splitlines(), runs[ranks][-3000:]


@needs_mpi
def test_failure_is_reported(tmp_path):
    # negative control: an unknown case makes the job fail with a non-zero exit code
    with pytest.raises(AssertionError, match="failed"):
        launch(2, ["no_such_case"], tmp_path)


def test_zero_on_one_process_is_the_local_run():
    """zero=True in one process (a one-rank world, no mpirun): bitwise the local engine; the state
    is plain full tensors with the fp32 master."""
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("runs in one process")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.LayerNorm(12), nn.Linear(12, 5, bias=False))
    ref = copy.deepcopy(model)
    opt = dt.Muon(dt.param_groups(model), zero=True, reduce_grads="mean", lr=0.02)
    ref_opt = dt.Muon(dt.param_groups(ref), engine="local", lr=0.02)
    assert opt.engine == "zero"
    for step in range(3):
        for p, r in zip(model.parameters(), ref.parameters()):
            p.grad = torch.randn(p.shape)
            r.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.detach().view(torch.int32), r.detach().view(torch.int32))
        assert torch.equal(opt.state[p]["master"], r.detach())
        for key, value in ref_opt.state[r].items():
            assert torch.equal(opt.state[p][key], value), key
