#!/usr/bin/env bash
# `meshmuon bench calibrate` then `bench step --predict --machine FILE.json` at np 2 on a tiny model:
# checks the structure only (a profile with a comm fit for 2 ranks; every strategy measured and
# predicted, the ratio present, bytes as the plan says), never a timing. A missing profile fails
# with an error naming it. Usage: bench_predict_check.sh MPIEXEC MESHMUON_CLI WORKDIR
set -euo pipefail
mpiexec=$1 cli=$2 dir=$3
mkdir -p "$dir"
rm -f "$dir/profile.json"
cat > "$dir/tiny.json" <<'JSON'
{"model": "tiny", "params": [
 {"name": "w1", "shape": [64, 32], "role": "muon"}, {"name": "w2", "shape": [32, 96], "role": "muon"},
 {"name": "emb", "shape": [50, 16], "role": "adamw"}]}
JSON
run() { "$mpiexec" -np 2 --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS "$cli" "$@"; }
run bench calibrate --out "$dir/profile.json" --no-grid --repeats 1 --comm-mib 1 --name tiny-fit
run bench step --model-file "$dir/tiny.json" --parallel dp_shard=2 --steps 1 --compare --predict --json \
  --no-reference --machine "$dir/profile.json" > "$dir/step.json"
python3 - "$dir/profile.json" "$dir/step.json" <<'PY'
import json, math, sys
prof = json.load(open(sys.argv[1]))
assert prof["name"] == "tiny-fit", prof["name"]
assert [f["ranks"] for f in prof["comm_fits"]] == [2], prof["comm_fits"]
assert prof["comm_fits"][0]["bandwidth_Bps"] > 0 and prof["memory_Bps"] > 0, prof
out = json.load(open(sys.argv[2]))
assert out["machine"] == "tiny-fit" and out["world_size"] == 2, out
names = [r["strategy"] for r in out["results"]]
assert names == ["auto", "owner_a2a", "allgather", "agrs"], names
for r in out["results"]:
    p = r["predicted"]
    for k in ("step_seconds", "compute_seconds", "bandwidth_seconds", "latency_seconds", "pipeline_seconds",
              "elementwise_seconds", "time_sharing"):
        assert math.isfinite(p[k]) and p[k] >= 0, (r["strategy"], k, p[k])
    assert p["step_seconds"] > 0 and p["compute_seconds"] > 0, r
    assert r["predicted_over_measured"] > 0 and math.isfinite(r["predicted_over_measured"]), r
    assert r["bytes_match_plan"] is True, r
    # the same-run rate: a positive scale, and the same-run prediction differs from the profile's
    # by its compute term only (compute / scale)
    assert r["ns_rate_standalone"] > 0 and r["ns_rate_scale"] > 0 and math.isfinite(r["ns_rate_scale"]), r
    q = r["predicted_same_run"]
    assert math.isclose(q["compute_seconds"], p["compute_seconds"] / r["ns_rate_scale"], rel_tol=1e-9), (q, p)
    assert math.isclose(r["predicted_same_run_over_measured"] * r["step_seconds"], q["step_seconds"], rel_tol=1e-9), r
assert out["auto_over_fastest"] >= 1, out["auto_over_fastest"]
print("bench predict structure ok:", names)
PY
if run bench step --model-file "$dir/tiny.json" --parallel dp_shard=2 --steps 1 --predict \
     --machine "$dir/missing.json" > "$dir/missing.log" 2>&1; then
  echo "a missing profile was accepted"; exit 1
fi
grep -q "cannot read machine profile '$dir/missing.json'" "$dir/missing.log" || { cat "$dir/missing.log"; exit 1; }
echo "missing profile refused"
