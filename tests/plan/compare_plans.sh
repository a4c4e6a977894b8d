#!/usr/bin/env bash
# Compares the plans of two meshmuon binaries (an old build kept aside and a new one) on a set of
# models and meshes: the full `plan --json` (every entry, the baselines, the fingerprint) must be
# byte-identical. Usage: tests/plan/compare_plans.sh OLD_BIN NEW_BIN [extra plan flags...]
# (a new binary whose default --json is a summary is given --detail, see docs/plan.md).
set -euo pipefail
old=$1 new=$2
shift 2
detail=()
if "$new" plan --help | grep -q -- --detail; then detail=(--detail); fi
olddetail=()
if "$old" plan --help | grep -q -- --detail; then olddetail=(--detail); fi
shapes=(
  "deepseek-v3 dp_shard=8" "deepseek-v3 dp_shard=64,ep=64" "deepseek-v3 dp_replicate=2,dp_shard=64,tp=2,ep=8"
  "deepseek-v3 dp_replicate=8,dp_shard=16,tp=8,ep=64" "deepseek-v3 dp_shard=128,tp=8,ep=64"
  "deepseek-v3 dp_replicate=4,dp_shard=32,ep=8" "deepseek-v3 dp_shard=1024" "deepseek-v3 dp_replicate=8,dp_shard=8,tp=8"
  "qwen3-30b-a3b dp_shard=32,ep=8" "qwen3-30b-a3b dp_replicate=2,dp_shard=16,tp=2,ep=4" "llama3-8b dp_shard=64"
  "llama3-8b dp_replicate=2,dp_shard=8,tp=4" "gpt2-124m dp_shard=3" "nanochat-d20 dp_replicate=3,dp_shard=5"
)
# LARGE=1: also deepseek-v3 on every replicate x tp x ep combination of `bench plan --grid` at 2^14
# ranks and, without replicas, 2^17 (the old build may take minutes)
if [[ "${LARGE:-0}" == 1 ]]; then
  for rep in 1 8; do for tp in 1 8; do for ep in 1 8 64; do for w in 16384 131072; do
    [[ $w == 131072 && $rep == 8 ]] && continue
    shapes+=("deepseek-v3 dp_replicate=$rep,dp_shard=$((w / (rep * tp))),tp=$tp,ep=$ep")
  done; done; done; done
fi
fail=0
for s in "${shapes[@]}"; do
  set -- $s
  for extra in "" "--replica split" "--replica duplicate" "--comm-dtype bf16" "--chunk-mib 16 --window 3"; do
    a=$("$old" plan --model "$1" --parallel "$2" $extra --json "${olddetail[@]}" 2>&1 || true)
    b=$("$new" plan --model "$1" --parallel "$2" $extra --json "${detail[@]}" 2>&1 || true)
    if [[ "$a" == "$b" ]]; then echo "same  $1 $2 $extra"; else echo "DIFF  $1 $2 $extra"; fail=1; fi
  done
done
exit $fail
