"""Owner placement for FSDP2 models (meshmuon.torch.own) under torchrun (owner_cases.py): a GPT-like model's
block matrices owned, the rest with fully_shard; BITWISE gradients (the documented reduction of the
ranks' local gradients) and steps (the one-process step) on FSDP 3 ranks (8 matrices: uneven) and
HSDP 2x2 (reshard_after_forward=False, gradient sync off for the first micro-batch), both reductions
(reduce="scatter_gather" at 3, "gather" at 4 and 2 ranks), bf16 forward
(param_dtype with FSDP2's MixedPrecisionPolicy), zero optimizer-step bytes (negative control: FSDP2
alone moves bytes); DCP checkpoints saved at 3 ranks (owner placement and plain FSDP2) and loaded at
2 and 4 ranks into owner placement (FSDP, HSDP) or plain FSDP2, bitwise the uninterrupted run
(negative control: without the load it differs); bad arguments raise on every rank. The FSDP case
also under mpirun (meshmuon.torch.init_distributed's gloo group).
Run: python -m pytest tests/python/multirank/test_owner.py -q"""
from __future__ import annotations

from pathlib import Path

import pytest
from harness import MPIRUN, launch_mpirun
from test_torchrun import leaked, ok, torchrun

HERE = Path(__file__).parent
CASES = HERE / "owner_cases.py"

pytest.importorskip("torch.distributed.run")

LAUNCHES = [  # (ranks, cases): saves first, loads after
    (3, ["train_fsdp", "mixed", "dcp_save_owner", "dcp_save_fsdp"]),
    (4, ["train_hsdp", "dcp_owner_to_owner", "dcp_fsdp_to_owner_hsdp"]),
    (2, ["train_fsdp_gather", "dcp_owner_to_owner", "dcp_owner_to_fsdp", "dcp_fsdp_to_owner", "dcp_negative",
         "bad_input"]),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("owner_dcp")
    out = {}
    for ranks, cases in LAUNCHES:
        proc = torchrun(ranks, CASES, ["--cases", ",".join(cases), "--ckpt", str(ckpt)], HERE, timeout=300)
        out[ranks] = (ok(proc, f"torchrun -np {ranks} owner_cases.py"), leaked(proc))
    return out


@pytest.mark.parametrize("ranks,case", [(r, c) for r, cases in LAUNCHES for c in cases])
def test_case(runs, ranks, case):
    stdout, _ = runs[ranks]
    assert f"CASE {case} OK" in stdout


def test_no_leak_report(runs):
    assert not any(leaks for _, leaks in runs.values())


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
def test_train_under_mpirun(tmp_path):
    assert "CASE train_fsdp OK" in launch_mpirun(CASES, 3, ["--cases", "train_fsdp"], HERE)
