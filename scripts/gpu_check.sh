#!/usr/bin/env bash
# meshmuon's GPU check: ONE command on a GPU machine (no package registry, ~15 minutes of machine time
# in all) that gives every answer within ~6 minutes, writing each result where it comes back as
# soon as it exists. Stages, in order of value, each with its own time limit; a stage that fails or
# runs out does not stop the later ones:
#   versions -> debs -> configure -> build (the GPU-relevant targets and the Python extension, one
#   build) -> the conformance suite on cuda (every kernel-interface method vs the cpu backend,
#   tests/conformance) -> the cuda backend's own cases (cuda_backend_test) -> bench ns --device cuda (4096², 2048×8192, a batch)
#   -> engines on cuda (LocalOptimizer / Optimizer GPU cases) -> meshmuon.torch on CUDA tensors +
#   compare-torch --device cuda -> nccl at world size 1 -> two ranks sharing the GPU through MPI
#   staging (bitwise vs one rank, bytes == plan; bench step np 1 and 2) -> ShardedParams /
#   checkpoint GPU cases.
# Only GPU tests run there: the CPU suite runs in CI. A skipped GPU test counts as a failure here.
#
# What it needs there: CUDA 13 nvcc, PyTorch (2.11 cu130 on this project's machines) with the PyPI
# wheels nvidia-cublas and nvidia-nccl-cu13, cmake, ninja, a C++20 compiler. What travels with the
# tree, fetched beforehand where a registry is (scripts/fetch_gpu_debs.sh): shared/debs/ (OpenBLAS,
# LAPACKE, GoogleTest, Open MPI, fmt, spdlog, nlohmann-json, CLI11, unpacked with dpkg-deb -x into a
# prefix, no install) and shared/wheels/ (the exact nanobind the build was tested with).
#
# Usage: bash scripts/gpu_check.sh          (from the repository root)
#   Through the device tool: `bash scripts/gpu_check.sh` as one command, timeout_s 600. The results
#   come back through $OUT: gpu_check_summary.txt (one row per result, rewritten after each row)
#   and gpu_check_logs.tgz (every log so far, rewritten after each stage). Rehearse it on a machine
#   without a GPU first (scripts/rehearse_gpu_check.sh): only the rows that need the device fail.
# Environment:
#   BUDGET=540            seconds for the whole check (stages get what is left of it, minus a margin)
#   DEBS=shared/debs WHEELS=shared/wheels PREFIX=/tmp/meshmuon-gpu-prefix BUILD=build-gpu JOBS=$(nproc)
#   GPU_CHECK_MPI=ON      OFF: no mpi communicator (skips the two-rank stage)
#   CUDA_ARCH=90          CMAKE_CUDA_ARCHITECTURES (90: H100 / H200)
#   LIMIT_SCALE=1         multiplies every stage's time limit (the rehearsal on 2 cores uses more)
# Exit status: 0 when every stage passed.
set -uo pipefail

BUDGET=${BUDGET:-540}
DEBS=${DEBS:-shared/debs}
WHEELS=${WHEELS:-shared/wheels}
PREFIX=${PREFIX:-/tmp/meshmuon-gpu-prefix}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
GPU_CHECK_MPI=${GPU_CHECK_MPI:-ON}
LIMIT_SCALE=${LIMIT_SCALE:-1}
CUDA_ARCH=${CUDA_ARCH:-90}
PY=${PYTHON:-python3}
LOGDIR=${LOGDIR:-$BUILD/gpu_check_logs}
START=$(date +%s)
status=0

[[ -f CMakeLists.txt && -d src/backend ]] || { echo "gpu_check: run from the meshmuon repository root" >&2; exit 2; }
mkdir -p "$LOGDIR"
ROOT=$(pwd)
SUMMARY="$LOGDIR/summary.txt"
printf '%-36s %-7s %6s  %s\n' "stage" "result" "secs" "detail" >"$SUMMARY"

# ---- results: every row is written at once; the logs after every stage ----
publish_logs() {
  [[ -n "${OUT:-}" && -d "$OUT" ]] || return 0
  tar -czf "$OUT/.gpu_check_logs.tgz" -C "$(dirname "$LOGDIR")" "$(basename "$LOGDIR")" 2>/dev/null &&
    mv -f "$OUT/.gpu_check_logs.tgz" "$OUT/gpu_check_logs.tgz"
}
row() {  # row NAME RESULT SECONDS DETAIL
  local line
  line=$(printf '%-36s %-7s %6s  %s' "$1" "$2" "$3" "${4:-}")
  echo "$line" | tee -a "$SUMMARY"
  [[ $2 == ok || $2 == skip ]] || status=1
  if [[ -n "${OUT:-}" && -d "$OUT" ]]; then cp "$SUMMARY" "$OUT/.gpu_check_summary.txt" && mv -f "$OUT/.gpu_check_summary.txt" "$OUT/gpu_check_summary.txt"; fi
}
left() { echo $((BUDGET - ($(date +%s) - START))); }

# run NAME LIMIT CMD...: the command under `timeout` (at most LIMIT s and what the budget leaves,
# minus 15 s for the rest), its output in $LOGDIR/NAME.log. Sets RC (124: out of time) and SECS.
run() {
  local name=$1 limit=$(( $2 * LIMIT_SCALE ))
  shift 2
  local cap=$(( $(left) - 15 ))
  (( cap < limit )) && limit=$cap
  LOG="$LOGDIR/$(echo "$name" | tr -c "A-Za-z0-9._\n-" "_").log"
  if (( limit < 5 )); then
    echo "no time left in the budget ($BUDGET s)" >"$LOG"
    RC=124 SECS=0
    return
  fi
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$LOG" 2>&1
  RC=$?
  SECS=$(( $(date +%s) - t0 ))
  (( RC == 124 || RC == 137 )) && { RC=124; echo "[gpu_check] stopped at its limit of $limit s" >>"$LOG"; }
}
verdict() {  # verdict NAME DETAIL-IF-OK: a row from RC (0 ok, 124 TIMEOUT, else FAIL)
  if (( RC == 0 )); then row "$1" ok "$SECS" "$2"
  elif (( RC == 124 )); then row "$1" TIMEOUT "$SECS" "$(basename "$LOG")"
  else row "$1" FAIL "$SECS" "rc $RC: $(grep -m1 -E 'FAILED|Error|error|SKIPPED' "$LOG" | cut -c1-100) ($(basename "$LOG"))"
  fi
}
# gtest NAME LIMIT BINARY FILTER: a GoogleTest binary's cases; a skipped case is a failure here.
gtest() {
  local name=$1 limit=$2 bin=$3 filter=$4
  if [[ ! -x "$bin" ]]; then row "$name" FAIL 0 "not built: $bin"; return; fi
  run "$name" "$limit" "$bin" --gtest_filter="$filter" --gtest_color=no
  local passed skipped
  passed=$(grep -c '^\[       OK \]' "$LOG")
  skipped=$(grep -c '^\[  SKIPPED \]' "$LOG")
  if (( RC == 0 && skipped > 0 )); then RC=3; echo "[gpu_check] $skipped skipped: a GPU case must run here" >>"$LOG"; fi
  verdict "$name" "$passed passed"
}

# ---- 1. the machine and every version the build and the tests meet ----
{
  echo "date        $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  NVCC=$(command -v nvcc || true)
  [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
  echo "nvcc        ${NVCC:-missing} $([[ -n "$NVCC" ]] && "$NVCC" --version | tail -1)"
  echo "c++         $(c++ --version | head -1)"
  echo "cmake       $(cmake --version | head -1)"
  echo "ninja       $(ninja --version 2>/dev/null || echo missing)"
  echo "cpu         $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  "$PY" - <<'EOF'
import importlib, sys
print(f"python      {sys.version.split()[0]} ({sys.executable})")
for name in ("torch", "numpy", "pytest", "nanobind", "scikit_build_core", "matplotlib", "mpi4py"):
    try:
        m = importlib.import_module(name)
        extra = f" cuda {m.version.cuda}, gpus {m.cuda.device_count()}" if name == "torch" else ""
        print(f"{name:<11} {getattr(m, '__version__', '?')}{extra}")
    except Exception as e:
        print(f"{name:<11} missing ({type(e).__name__})")
EOF
  ls "$WHEELS" 2>/dev/null | sed 's/^/carried     /'
} >"$LOGDIR/versions.log" 2>&1
cat "$LOGDIR/versions.log"
NVCC=$(command -v nvcc || true)
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
row "versions" "$([[ -n "$NVCC" ]] && echo ok || echo FAIL)" 0 \
  "$(grep -E '^(torch|python|nvcc) ' "$LOGDIR/versions.log" | tr -s ' ' | cut -c1-60 | paste -sd';')"

# ---- 2. what travelled: the Debian packages into a prefix, the wheels onto PYTHONPATH ----
t0=$(date +%s)
shopt -s nullglob
debs=("$DEBS"/*.deb)
mkdir -p "$PREFIX"
for d in "${debs[@]}"; do dpkg-deb -x "$d" "$PREFIX" || echo "unpack failed: $d" >>"$LOGDIR/debs.log"; done
LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
# Debian wires BLAS / LAPACK and Open MPI's commands through update-alternatives (links made at
# install time): make them here; point the pkg-config files (prefix=/usr) at the prefix.
for lib in libblas.so.3 libblas.so liblapack.so.3 liblapack.so; do
  [[ -e "$LIBDIR/$lib" ]] && continue
  for cand in "$LIBDIR/openblas-pthread/$lib" "$LIBDIR/blas/$lib" "$LIBDIR/lapack/$lib"; do
    [[ -e "$cand" ]] && { ln -sf "$cand" "$LIBDIR/$lib"; break; }
  done
done
for lib in libopenblas.so.0 libopenblas.so; do
  [[ -e "$LIBDIR/$lib" || ! -e "$LIBDIR/openblas-pthread/$lib" ]] || ln -sf "$LIBDIR/openblas-pthread/$lib" "$LIBDIR/$lib"
done
for pc in blas lapack openblas; do
  src="$LIBDIR/openblas-pthread/pkgconfig/$pc-openblas.pc"
  [[ $pc == openblas ]] && src="$LIBDIR/openblas-pthread/pkgconfig/openblas.pc"
  [[ -e "$LIBDIR/pkgconfig/$pc.pc" || ! -e "$src" ]] || { mkdir -p "$LIBDIR/pkgconfig"; ln -sf "$src" "$LIBDIR/pkgconfig/$pc.pc"; }
done
for tool in mpicc mpicxx mpirun mpiexec; do
  [[ -e "$PREFIX/usr/bin/$tool" || ! -e "$PREFIX/usr/bin/$tool.openmpi" ]] || ln -sf "$tool.openmpi" "$PREFIX/usr/bin/$tool"
done
for pc in "$LIBDIR"/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc "$LIBDIR"/openblas-pthread/pkgconfig/*.pc; do
  sed -i "s|^prefix=/usr\$|prefix=$PREFIX/usr|; s|=/usr/|=$PREFIX/usr/|g" "$pc"
done
PYSITE="$PREFIX/py"
wheels=("$WHEELS"/*.whl)
if ((${#wheels[@]})); then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$PYSITE" "${wheels[@]}" >>"$LOGDIR/debs.log" 2>&1 ||
    echo "wheel install failed" >>"$LOGDIR/debs.log"
fi
export PYTHONPATH="$(cd "$BUILD" && pwd)/python-stage:$PYSITE${PYTHONPATH:+:$PYTHONPATH}"  # the build stages the package there
CUBLAS_INC=$("$PY" - <<'EOF' 2>/dev/null
import os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for sub in ("nvidia/cu13/include", "nvidia/cublas/include"):
        if os.path.exists(os.path.join(d, sub, "cublas_api.h")):
            print(os.path.join(d, sub)); sys.exit(0)
EOF
)
CUBLAS_LIB=$(cd "$CUBLAS_INC/../lib" 2>/dev/null && pwd)
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$LIBDIR:$LIBDIR/openblas-pthread${CUBLAS_LIB:+:$CUBLAS_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export OPAL_PREFIX="$PREFIX/usr"   # a relocated Open MPI finds its components here
export PMIX_MCA_mca_base_component_path="$LIBDIR/pmix2/lib/pmix"  # PMIx does not relocate by itself
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
detail="${#debs[@]} debs, ${#wheels[@]} wheels; cuBLAS headers ${CUBLAS_INC:-MISSING}"
if ((${#debs[@]} == 0)) || [[ -z "$CUBLAS_INC" ]] || grep -q failed "$LOGDIR/debs.log" 2>/dev/null; then
  row "debs and wheels" FAIL "$(( $(date +%s) - t0 ))" "$detail (scripts/fetch_gpu_debs.sh fills $DEBS and $WHEELS)"
else
  row "debs and wheels" ok "$(( $(date +%s) - t0 ))" "$detail"
fi
publish_logs

# ---- 3. one build: the GPU-relevant targets, the CLI and the Python extension ----
MPI_ARGS=(-DMESHMUON_WITH_MPI=OFF)
if [[ "$GPU_CHECK_MPI" == ON ]]; then
  MPI_ARGS=(-DMESHMUON_WITH_MPI=ON -DMPI_C_COMPILER="$PREFIX/usr/bin/mpicc" -DMPIEXEC_EXECUTABLE="$PREFIX/usr/bin/mpiexec"
            -DMPI_C_HEADER_DIR="$LIBDIR/openmpi/include" -DMPI_C_LIB_NAMES=mpi
            -DMPI_mpi_LIBRARY="$LIBDIR/openmpi/lib/libmpi.so")
fi
GEN=Ninja
command -v ninja >/dev/null 2>&1 || GEN="Unix Makefiles"
run configure 90 cmake -S . -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DMESHMUON_WITH_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="${NVCC:-nvcc}" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DMESHMUON_CUBLAS_INCLUDE_DIR="$CUBLAS_INC" \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DMESHMUON_BUILD_BENCH=OFF -DMESHMUON_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PY")" \
  -DMESHMUON_BUILD_EXAMPLES=OFF "${MPI_ARGS[@]}"
verdict configure "sm_$CUDA_ARCH, mpi $GPU_CHECK_MPI, $(grep -m1 -o 'nccl communicator[^(]*' "$LOG" | tr -s ' ')"
TARGETS=(meshmuon_cli _core conformance_test cuda_backend_test device_engine_test sharded_params_device_test checkpoint_device_test nccl_comm_test)
[[ "$GPU_CHECK_MPI" == ON ]] && TARGETS+=(comm_staging_test cuda_engine_test)
run build 300 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"
verdict build "${#TARGETS[@]} targets"
publish_logs
BIN="$BUILD/bin"

# ---- 4. first, the conformance suite on this GPU: every kernel-interface method bitwise vs the cpu
# backend (Newton–Schulz within its stated bound and the SVD oracle; tests/conformance/backends.cpp) ----
gtest "conformance (cuda)" 90 "$BIN/conformance_test" '*/cuda'
publish_logs

# ---- 4b. the cuda backend's own cases: streams, events, copies, upload ring, offload, probe, faults ----
run cuda_backend_test 90 "$BIN/cuda_backend_test" --gtest_color=no
passed=$(grep -c '^\[       OK \]' "$LOG"); skipped=$(grep -c '^\[  SKIPPED \] CudaBackend\.' "$LOG")
(( RC == 0 && skipped > 1 )) && RC=3  # one skip is the no-device check, which skips on a GPU machine
verdict cuda_backend_test "$passed passed, $skipped skipped (the no-device check)"
publish_logs

# ---- 5. the headline rate: the cuda backend's NS vs cuBLAS GEMMs of the same dtype, same run ----
for shape in 4096x4096 2048x8192; do
  run "bench_ns_cuda_$shape" 45 "$BIN/meshmuon" bench ns --device cuda --shape "$shape" --schedule polar_express --steps 5 \
    --matmul-dtype both --repeats 10 --warmup 2
  verdict "bench ns cuda $shape" "$(awk '$1=="bf16"{printf "bf16 %s TFLOP/s, cuBLAS %s, %s", $4, $5, $6} $1=="fp32"{printf "; fp32 %s, %s", $4, $6}' "$LOG")"
done
run bench_ns_cuda_batch 45 "$BIN/meshmuon" bench ns --device cuda --shape 768x3072 --schedule polar_express --steps 5 \
  --matmul-dtype bf16 --batch 12 --repeats 10 --warmup 2
(( RC == 0 )) && ! grep -q "bitwise equal: yes" "$LOG" && RC=3
verdict "bench ns cuda 768x3072 x12" "$(grep -m1 'batch 12' "$LOG" | tr -s ' ' | cut -c1-100)"
publish_logs

# ---- 6. the engines on cuda: LocalOptimizer and Optimizer (one process) ----
gtest "engines on cuda" 90 "$BIN/device_engine_test" 'Cuda*'
publish_logs

# ---- 7. meshmuon.torch on CUDA tensors (the package staged by the same build) and compare-torch ----
run pytest_cuda 150 bash -c "cd /tmp && '$PY' -m pytest -q -rs -p no:cacheprovider '$ROOT/tests/python/test_device.py' \
  '$ROOT/tests/python/test_bench.py' '$ROOT/tests/python/test_nccl.py'"
skipped=$(grep -c '^SKIPPED' "$LOG")
(( RC == 0 && skipped > 1 )) && RC=3  # the no-device check skips on a GPU machine
verdict "pytest (cuda)" "$(tail -1 "$LOG" | cut -c1-80)"
run compare_torch_cuda 90 bash -c "cd /tmp && '$PY' -m meshmuon.bench compare-torch --device cuda --repeat 3"
verdict "compare-torch cuda (GPT-2 small)" "$(grep -E 'torch.optim.Muon|bf16 ' "$LOG" | tr -s ' ' | cut -c1-120 | paste -sd'|')"
publish_logs

# ---- 8. nccl at world size 1: every operation and a timeout ----
gtest "nccl (world size 1)" 60 "$BIN/nccl_comm_test" 'NcclDevice.*'
publish_logs

# ---- 9. two ranks sharing this GPU through the mpi communicator's staging ----
if [[ "$GPU_CHECK_MPI" == ON ]]; then
  MPIRUN=$PREFIX/usr/bin/mpirun
  [[ -x "$MPIRUN" ]] || MPIRUN=mpirun
  MPIX=(-x LD_LIBRARY_PATH -x OPAL_PREFIX -x PMIX_MCA_mca_base_component_path -x PYTHONPATH)
  run staging_np2 60 "$MPIRUN" -n 2 --oversubscribe --bind-to none "${MPIX[@]}" "$BIN/comm_staging_test" \
    --gtest_filter='CudaStaging.*' --gtest_color=no
  (( RC == 0 )) && grep -q '^\[  SKIPPED \]' "$LOG" && RC=3
  verdict "staging np 2 (one GPU)" "$(grep -m1 PASSED "$LOG")"
  run engine_np2 90 "$MPIRUN" -n 2 --oversubscribe --bind-to none "${MPIX[@]}" "$BIN/cuda_engine_test" --gtest_color=no
  (( RC == 0 )) && grep -q '^\[  SKIPPED \]' "$LOG" && RC=3
  verdict "engine np 2 bitwise vs np 1 (one GPU)" "$(grep -m1 PASSED "$LOG")"
  run bench_step_np1 45 "$BIN/meshmuon" bench step --model gpt2-124m --backend single --device cuda --steps 3
  verdict "bench step cuda (1 rank)" "$(awk '$1=="auto"{printf "auto %s s/step", $2}' "$LOG")"
  run bench_step_np2 60 "$MPIRUN" -n 2 --oversubscribe --bind-to none "${MPIX[@]}" "$BIN/meshmuon" bench step \
    --model gpt2-124m --parallel dp_shard=2 --device cuda --compare --steps 3
  verdict "bench step cuda (np 2, one GPU)" "$(awk '$1=="auto"||$1=="allgather"{printf "%s %s s ", $1, $2}' "$LOG")"
else
  row "two ranks on one GPU" skip 0 "GPU_CHECK_MPI=OFF"
fi
publish_logs

# ---- 10. ShardedParams and checkpoints of device memory ----
gtest "sharded params on cuda" 45 "$BIN/sharded_params_device_test" 'Cuda*'
gtest "checkpoints of cuda memory" 45 "$BIN/checkpoint_device_test" 'Cuda*'

row "total" "$([[ $status == 0 ]] && echo ok || echo FAIL)" "$(( $(date +%s) - START ))" "budget $BUDGET s"
publish_logs
exit $status
