#!/usr/bin/env bash
# Bitwise resume at a different rank count and mesh (examples/train_cpp, CTest train_cpp_resume).
#   A : 6 steps at np 2, uninterrupted
#   B3: 3 steps at np 2 + checkpoint, resumed at np 3 (dp_shard=3) to step 6
#   B4: the same checkpoint resumed at np 4 as HSDP (dp_replicate=2,dp_shard=2) to step 6
#   A == B3 == B4 (and == an uninterrupted np 3 run), with the default --deterministic.
#   Negative control: --no-deterministic at np 2 and np 3 must differ (plain fp32 sums group the
#   micro-batches differently over ranks, so the rounding differs).
# Usage: resume_test.sh <train_cpp> <mpirun> <work dir>
set -euo pipefail
BIN=$1
MPIRUN=${2:-mpirun}
WORK=${3:-/tmp/train_cpp_resume_test}
rm -rf "$WORK"
mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
MODEL=(--context 4 --dim 8 --hidden 32 --batch 16 --micro-batches 12 --eval-batches 0 --log-every 1 --seed 7)

run() {  # run <name> <np> <args...>: prints the checksum; the full output goes to $WORK/<name>.log
  local name=$1 np=$2; shift 2
  local log="$WORK/$name.log"
  echo "== mpirun -np $np train_cpp ${MODEL[*]} $*" >"$log"
  if ! "$MPIRUN" -np "$np" --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS -x OMPI_ALLOW_RUN_AS_ROOT \
      -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "$BIN" "${MODEL[@]}" "$@" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "FAIL: run $name exited non-zero" >&2
    exit 1
  fi
  local sum
  sum=$(grep -o 'checksum fnv1a64 [0-9a-f]*' "$log" | awk '{print $3}')
  [[ -n $sum ]] || { cat "$log" >&2; echo "FAIL: no checksum in run $name" >&2; exit 1; }
  echo "$sum"
}

A=$(run 1-np2 2 --steps 6)
A3=$(run 2-np3 3 --steps 6)
run 3-np2-ckpt3 2 --steps 3 --ckpt-dir "$WORK/ckpt" --ckpt-every 3 >/dev/null
cp -r "$WORK/ckpt" "$WORK/ckpt-hsdp"
B3=$(run 4-resume-np3 3 --steps 6 --ckpt-dir "$WORK/ckpt" --resume)
B4=$(run 5-resume-np4-hsdp 4 --steps 6 --ckpt-dir "$WORK/ckpt-hsdp" --resume --mesh dp_replicate=2,dp_shard=2)
N2=$(run 6-nodet-np2 2 --steps 6 --no-deterministic)
N3=$(run 7-nodet-np3 3 --steps 6 --no-deterministic)

cat "$WORK"/[1-7]-*.log | grep -E '^==|^step|resumed|checkpoint:|checksum' || true
echo
echo "A  (np 2, 6 steps, uninterrupted)              $A"
echo "A3 (np 3, 6 steps, uninterrupted)              $A3"
echo "B3 (np 2 -> ckpt @3 -> np 3 dp_shard=3)        $B3"
echo "B4 (np 2 -> ckpt @3 -> np 4 dp_replicate=2,dp_shard=2) $B4"
echo "N2 / N3 (--no-deterministic, np 2 / np 3)      $N2 / $N3"
fail=0
[[ $A == "$A3" ]] || { echo "FAIL: np 3 differs from np 2"; fail=1; }
[[ $A == "$B3" ]] || { echo "FAIL: resume at np 3 differs from the uninterrupted run"; fail=1; }
[[ $A == "$B4" ]] || { echo "FAIL: resume at np 4 (HSDP) differs from the uninterrupted run"; fail=1; }
[[ $N2 != "$N3" ]] || { echo "FAIL: negative control: --no-deterministic gave the same bits at np 2 and np 3"; fail=1; }
[[ $fail == 0 ]] && echo "PASS: bitwise resume across rank counts and meshes; the control without --deterministic differs"
exit $fail
