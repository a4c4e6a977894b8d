# `python -m dmuon.bench compare-torch --json` runs and reports its fields (a tiny model here; the
# real figures come from the default GPT-2 small run, see docs/python.md). No timing is asserted.
import json
import subprocess
import sys


def test_compare_torch_json_smoke():
    out = subprocess.run([sys.executable, "-m", "dmuon.bench", "compare-torch", "--json",
                          "--layers", "1", "--d", "32", "--repeat", "0"],
                         capture_output=True, text=True, check=True, cwd="/").stdout
    result = json.loads(out)
    for key in ("dmuon_step_seconds", "torch_step_seconds", "speedup", "max_rel_diff"):
        assert result[key] > 0, key
    assert result["matrices"] == 4 and result["max_rel_diff"] < 0.05
