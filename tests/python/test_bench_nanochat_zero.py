# bench/nanochat_zero.py under torchrun (2 ranks, gloo) for three steps: it reports its fields, and
# meshmuon.torch.Muon(**from_nanochat(groups), zero=True, reduce_grads="mean") trains the nanochat-shaped
# model like the bench's nanochat-style ZeRO-2 reference: parameters equal to 1e-3 (measured 1.2e-4:
# lr·wd·|p| where the cautious mask flips on a product that rounds differently, the two reduce the
# gradients in different orders; elsewhere 1e-7). Negative control: --control gives the reference
# heavy-ball momentum, and the parameters then differ by > 1e-2 (measured 0.18). No timing asserted.
# Run: PYTHONPATH=build/python-stage python3 -m pytest tests/python/test_bench_nanochat_zero.py -q
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "nanochat_zero.py")


def bench(*extra):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", BENCH, "--steps", "3", "--warmup", "0", *extra],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{"):])


@pytest.mark.parametrize("control", [False, True])
def test_nanochat_zero_bench_matches_its_reference(control):
    result = bench(*(["--control"] if control else []))
    assert result["world"] == 2 and result["steps"] == 3
    assert result["meshmuon_step_median_s"] > 0 and result["nanochat_zero2_step_median_s"] > 0
    assert result["meshmuon_phases_last_step"]["engine"] == "zero"
    assert result["meshmuon_phases_last_step"]["bytes_sent"] > 0
    assert result["meshmuon_gram_step_median_s"] > 0  # meshmuon's second run: Gram Newton-Schulz
    assert result["meshmuon_gram_phases_last_step"]["engine"] == "zero"
    for key in ("param_max_abs_diff", "param_max_abs_diff_gram"):
        if control:
            assert result[key] > 1e-2, key
        else:
            assert result[key] < 1e-3, key
