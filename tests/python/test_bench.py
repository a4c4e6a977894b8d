# `python -m meshmuon.bench compare-torch --json` runs and reports its fields (a tiny model here; the
# real figures come from the default GPT-2 small run, see docs/python.md). No timing is asserted.
# --device cuda: the same on the GPU (skipped without one), and a clear exit without one.
import json
import subprocess
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()


def compare_torch(*extra):
    return subprocess.run([sys.executable, "-m", "meshmuon.bench", "compare-torch", "--json",
                           "--layers", "1", "--d", "32", "--repeat", "0", *extra],
                          capture_output=True, text=True, cwd="/")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not CUDA, reason="no CUDA device"))])
def test_compare_torch_json_smoke(device):
    proc = compare_torch("--device", device)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    for key in ("meshmuon_step_seconds", "torch_step_seconds", "speedup", "max_rel_diff",
                "meshmuon_fp32_step_seconds", "meshmuon_bf16_step_seconds", "max_rel_diff_fp32",
                "max_rel_diff_bf16", "torch_bf16_over_fp32_matmul"):
        assert result[key] > 0, key
    assert result["matrices"] == 4 and result["max_rel_diff"] < 0.05
    assert result["max_rel_diff_fp32"] < 0.05 and result["max_rel_diff_bf16"] < 0.05
    assert result["torch_layers_timed"] == 1
    assert result["device"].startswith(device)


def test_compare_torch_refuses_a_device_it_cannot_use():
    proc = compare_torch("--device", "mps")
    assert proc.returncode != 0 and "--device mps: use cpu, cuda or cuda:N" in proc.stderr
    if not CUDA:
        proc = compare_torch("--device", "cuda")
        assert proc.returncode != 0
        assert "--device cuda: no CUDA device" in proc.stderr, proc.stderr


def test_layouts_json_smoke():
    """`python -m meshmuon.bench layouts --json` at 2 ranks on a tiny GPT: every row's fields, the
    Muon rows' predictions from the optimizers' plans, the owner row's matrices all owned and planned
    `local` (no step traffic). Structure only; no timing is asserted."""
    proc = subprocess.run([sys.executable, "-m", "meshmuon.bench", "layouts", "--json", "--ranks", "2",
                           "--layers", "1", "--d", "64", "--vocab", "500", "--seq", "16", "--steps", "2",
                           "--warmup", "1", "--rounds", "1"], capture_output=True, text=True, cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (run,) = report["runs"]
    assert run["world_size"] == 2
    rows = {r["layout"]: r for r in run["rows"]}
    assert list(rows) == ["adamw", "muon_auto", "muon_owner", "muon_placement_auto"]
    for name in rows:
        for key in ("total_seconds", "fwd_bwd_seconds", "opt_seconds"):
            assert rows[name][key] > 0, (name, key)
    assert rows["adamw"]["overhead_over_adamw"] == 0
    muon = rows["muon_auto"]
    assert muon["predicted"]["step_seconds"] > 0 and muon["predicted"]["compute_seconds"] > 0
    assert muon["predicted_over_measured"] == muon["predicted"]["step_seconds"] / muon["opt_seconds"]
    # the block's four matrices (the vocabulary is not 4·d, else fc would count as a head)
    assert sum(muon["strategy_counts"].values()) == 4
    owner = rows["muon_owner"]
    assert owner["owned_matrices"] == 4 and owner["strategy_counts"] == {"local": 4}, owner
    assert owner["predicted_over_measured"] > 0
    assert 0 <= rows["muon_placement_auto"]["owned_matrices"] <= 4
