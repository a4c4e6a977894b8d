#!/usr/bin/env bash
# Builds dmuon with the cuda backend on a GPU machine that has no package registry, runs the CUDA
# tests and prints a summary table. Expected there: CUDA 13 nvcc (/usr/local/cuda or PATH), PyTorch
# cu13 with the PyPI wheels nvidia-cublas and nvidia-nccl-cu13, cmake, ninja, nanobind,
# scikit-build-core; NOT expected: OpenBLAS, LAPACKE, Open MPI, GoogleTest, fmt, spdlog, ... as Debian
# packages. Those come as .debs in shared/debs/, fetched beforehand on a machine with a Debian
# bookworm registry by scripts/fetch_gpu_debs.sh, and are unpacked here (dpkg-deb -x, no root, no
# install) into a prefix that CMake, pkg-config and the loader are pointed at.
#
# Then the GPU benchmarks (bench ns and bench step --device cuda), and the Python package built with
# CUDA: tests/python/test_device.py, test_bench.py, test_nccl.py and compare-torch --device cuda.
#
# Usage: bash scripts/gpu_check.sh            (from the repository root)
#   Through the device tool: run `GPU_CHECK_MPI=ON bash scripts/gpu_check.sh` as one command with the
#   full 600 s limit; shared/debs travels with the working tree (about 47 MiB of its 64 MiB), and
#   the summary and the logs come back through $OUT. Rehearse it on a machine without a GPU first
#   (scripts/rehearse_gpu_check.sh): only the rows that need the device may fail there.
# Environment:
#   DEBS=shared/debs      the .deb folder           PREFIX=/tmp/dmuon-gpu-prefix  where they unpack
#   BUILD=build-gpu       the build folder          JOBS=$(nproc)
#   GPU_CHECK_MPI=OFF     ON: also build the mpi communicator from the unpacked Open MPI (and its tests)
#   CUDA_ARCH=90          CMAKE_CUDA_ARCHITECTURES (90: H100 / H200)
#   OUT                   when set (the device tool's output folder): the summary and a .tgz of the
#                         logs are copied there
# Exit status: 0 when the build and every CUDA test pass (a skipped CUDA test counts as a failure
# here: this script exists to run them on a device).
set -uo pipefail

DEBS=${DEBS:-shared/debs}
PREFIX=${PREFIX:-/tmp/dmuon-gpu-prefix}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
GPU_CHECK_MPI=${GPU_CHECK_MPI:-OFF}
CUDA_ARCH=${CUDA_ARCH:-90}
PY=${PYTHON:-python3}
LOGDIR=${LOGDIR:-$BUILD/gpu_check_logs}

declare -a ROWS=()
row() { ROWS+=("$(printf '%-34s %-8s %s' "$1" "$2" "${3:-}")"); }
summary() {
  {
    echo
    echo "==== dmuon gpu_check summary ===="
    printf '%-34s %-8s %s\n' "step" "result" "detail"
    for r in "${ROWS[@]}"; do echo "$r"; done
  } | tee "$LOGDIR/summary.txt"
  # On the device tool's machine: two files back through $OUT (it returns at most 8).
  if [[ -n "${OUT:-}" && -d "$OUT" ]]; then
    cp "$LOGDIR/summary.txt" "$OUT/gpu_check_summary.txt"
    tar -czf "$OUT/gpu_check_logs.tgz" -C "$(dirname "$LOGDIR")" "$(basename "$LOGDIR")" 2>/dev/null || true
  fi
}
fail() {
  row "$1" FAIL "${2:-}"
  summary
  exit 1
}

[[ -f CMakeLists.txt && -d src/backend ]] || { echo "gpu_check: run from the dmuon repository root" >&2; exit 2; }
mkdir -p "$LOGDIR"

# ---- 1. the machine ----
NVCC=$(command -v nvcc || true)
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
[[ -n "$NVCC" ]] || fail "nvcc" "not found (PATH, /usr/local/cuda/bin)"
row "nvcc" ok "$("$NVCC" --version | tail -1)"
if command -v nvidia-smi >/dev/null 2>&1; then
  row "gpu" ok "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
else
  row "gpu" "?" "nvidia-smi not found"
fi
CUBLAS_INC=$("$PY" - <<'EOF' 2>/dev/null
import os, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for sub in ("nvidia/cu13/include", "nvidia/cublas/include"):
        if os.path.exists(os.path.join(d, sub, "cublas_api.h")):
            print(os.path.join(d, sub)); sys.exit(0)
EOF
)
[[ -n "$CUBLAS_INC" ]] || fail "cuBLAS headers" "no nvidia-cublas wheel with headers found by $PY"
row "cuBLAS headers" ok "$CUBLAS_INC"
CUBLAS_LIB=$(cd "$CUBLAS_INC/../lib" 2>/dev/null && pwd)

# ---- 2. the Debian packages, unpacked into a prefix ----
shopt -s nullglob
debs=("$DEBS"/*.deb)
((${#debs[@]})) || fail "debs" "none in $DEBS: run scripts/fetch_gpu_debs.sh on a machine with a registry, copy $DEBS here"
mkdir -p "$PREFIX"
for d in "${debs[@]}"; do dpkg-deb -x "$d" "$PREFIX" || fail "unpack" "$d"; done
LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
# Debian wires BLAS / LAPACK through update-alternatives (links made at install time): make them here.
for lib in libblas.so.3 libblas.so liblapack.so.3 liblapack.so; do
  [[ -e "$LIBDIR/$lib" ]] && continue
  for cand in "$LIBDIR/openblas-pthread/$lib" "$LIBDIR/blas/$lib" "$LIBDIR/lapack/$lib"; do
    [[ -e "$cand" ]] && { ln -sf "$cand" "$LIBDIR/$lib"; break; }
  done
done
for lib in libopenblas.so.0 libopenblas.so; do
  [[ -e "$LIBDIR/$lib" || ! -e "$LIBDIR/openblas-pthread/$lib" ]] || ln -sf "$LIBDIR/openblas-pthread/$lib" "$LIBDIR/$lib"
done
# ... and their pkg-config files (lapacke.pc requires lapack; the emulation's tests need openblas).
for pc in blas lapack openblas; do
  src="$LIBDIR/openblas-pthread/pkgconfig/$pc-openblas.pc"
  [[ $pc == openblas ]] && src="$LIBDIR/openblas-pthread/pkgconfig/openblas.pc"
  [[ -e "$LIBDIR/pkgconfig/$pc.pc" || ! -e "$src" ]] || { mkdir -p "$LIBDIR/pkgconfig"; ln -sf "$src" "$LIBDIR/pkgconfig/$pc.pc"; }
done
# Open MPI's commands are alternatives too (mpicc -> mpicc.openmpi, made at install time).
for tool in mpicc mpicxx mpirun mpiexec; do
  [[ -e "$PREFIX/usr/bin/$tool" || ! -e "$PREFIX/usr/bin/$tool.openmpi" ]] || ln -sf "$tool.openmpi" "$PREFIX/usr/bin/$tool"
done
# pkg-config files name prefix=/usr: point them at the prefix.
for pc in "$LIBDIR"/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc "$LIBDIR"/openblas-pthread/pkgconfig/*.pc; do
  sed -i "s|^prefix=/usr\$|prefix=$PREFIX/usr|; s|=/usr/|=$PREFIX/usr/|g" "$pc"
done
row "debs unpacked" ok "${#debs[@]} packages into $PREFIX"

export PKG_CONFIG_PATH="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$LIBDIR:$LIBDIR/openblas-pthread${CUBLAS_LIB:+:$CUBLAS_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export OPAL_PREFIX="$PREFIX/usr"   # a relocated Open MPI finds its components here
# PMIx (Open MPI's process manager interface) does not relocate: point it at its components
export PMIX_MCA_mca_base_component_path="$LIBDIR/pmix2/lib/pmix"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# ---- 3. configure and build ----
MPI_ARGS=(-DDMUON_WITH_MPI=OFF)
if [[ "$GPU_CHECK_MPI" == ON ]]; then
  MPI_ARGS=(-DDMUON_WITH_MPI=ON -DMPI_C_COMPILER="$PREFIX/usr/bin/mpicc" -DMPIEXEC_EXECUTABLE="$PREFIX/usr/bin/mpiexec"
            -DMPI_C_HEADER_DIR="$LIBDIR/openmpi/include" -DMPI_C_LIB_NAMES=mpi
            -DMPI_mpi_LIBRARY="$LIBDIR/openmpi/lib/libmpi.so")
fi
GEN=Ninja
command -v ninja >/dev/null 2>&1 || GEN="Unix Makefiles"
t0=$(date +%s)
cmake -S . -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DDMUON_WITH_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DDMUON_CUBLAS_INCLUDE_DIR="$CUBLAS_INC" \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DDMUON_BUILD_BENCH=OFF "${MPI_ARGS[@]}" >"$LOGDIR/configure.log" 2>&1 ||
  fail "configure (cuda ON)" "see $LOGDIR/configure.log: $(grep -m1 -A2 'CMake Error' "$LOGDIR/configure.log" | tr '\n' ' ')"
row "configure (cuda ON)" ok "sm_$CUDA_ARCH, mpi $GPU_CHECK_MPI, $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
cmake --build "$BUILD" -j "$JOBS" >"$LOGDIR/build.log" 2>&1 ||
  fail "build" "see $LOGDIR/build.log: $(grep -m1 -E 'error' "$LOGDIR/build.log")"
row "build" ok "$(( $(date +%s) - t0 )) s"

# ---- 4. the CUDA tests (each test binary run directly, so skips are visible) ----
status=0
out=$("$BUILD/bin/cuda_backend_test" 2>&1)
echo "$out" >"$LOGDIR/cuda_backend_test.log"
passed=$(echo "$out" | grep -c '^\[       OK \]')
failed=$(echo "$out" | grep -c '^\[  FAILED  \] CudaBackend\.')
skipped=$(echo "$out" | grep -c '^\[  SKIPPED \] CudaBackend\.')
if ((failed == 0 && skipped <= 1 && passed > 0)); then  # NoDeviceGivesAClearError skips on a GPU machine
  row "cuda_backend_test" ok "$passed passed, $skipped skipped (the no-device check)"
else
  row "cuda_backend_test" FAIL "$passed passed, $failed failed, $skipped skipped; $LOGDIR/cuda_backend_test.log"
  status=1
fi
# The nccl communicator: every operation at world size 1 and a timeout (NcclDevice.*), plus the
# loader and error checks (NcclComm.UnavailableGivesAClearError skips on a GPU machine).
if [[ -x "$BUILD/bin/nccl_comm_test" ]]; then
  out=$("$BUILD/bin/nccl_comm_test" --gtest_color=no 2>&1)
  echo "$out" >"$LOGDIR/nccl_comm_test.log"
  passed=$(echo "$out" | grep -c '^\[       OK \]')
  failed=$(echo "$out" | grep -c '^\[  FAILED  \] Nccl')
  dev_skipped=$(echo "$out" | grep -c '^\[  SKIPPED \] NcclDevice\.')
  if ((failed == 0 && dev_skipped == 0 && passed > 0)); then
    row "nccl_comm_test" ok "$passed passed ($(echo "$out" | grep -c '^\[  SKIPPED \] Nccl') skipped: the no-device check)"
  else
    row "nccl_comm_test" FAIL "$passed passed, $failed failed, $dev_skipped device cases skipped; $LOGDIR/nccl_comm_test.log"
    status=1
  fi
else
  row "nccl_comm_test" FAIL "not built: the configure summary says why the nccl communicator is off ($LOGDIR/configure.log)"
  status=1
fi
# The mpi communicator staging device buffers through pinned memory, 2 ranks on this one GPU.
if [[ "$GPU_CHECK_MPI" == ON && -x "$BUILD/bin/comm_staging_test" ]]; then
  MPIRUN=$PREFIX/usr/bin/mpirun
  [[ -x "$MPIRUN" ]] || MPIRUN=mpirun
  out=$("$MPIRUN" -n 2 --oversubscribe --bind-to none "$BUILD/bin/comm_staging_test" --gtest_color=no 2>&1)
  rc=$?
  echo "$out" >"$LOGDIR/comm_staging_test.log"
  if ((rc == 0)) && ! echo "$out" | grep -q '^\[  SKIPPED \] CudaStaging'; then
    row "comm_staging_test (np 2, 1 GPU)" ok "$(echo "$out" | grep -m1 -E 'PASSED')"
  else
    row "comm_staging_test (np 2, 1 GPU)" FAIL "rc $rc (a CudaStaging skip counts as a failure); $LOGDIR/comm_staging_test.log"
    status=1
  fi
else
  row "comm_staging_test" skip "GPU_CHECK_MPI=ON builds the mpi communicator and runs it"
fi
if ctest --test-dir "$BUILD" --timeout 600 -E 'install_consumer' >"$LOGDIR/ctest.log" 2>&1; then
  row "ctest (all built tests)" ok "$(grep -E 'tests passed' "$LOGDIR/ctest.log")"
else
  row "ctest (all built tests)" FAIL "$(grep -E 'tests passed' "$LOGDIR/ctest.log"); $LOGDIR/ctest.log"
  status=1
fi

# ---- 5. the orthogonalization benchmark (the cpu backend: a reference point, not a GPU figure) ----
if [[ -x "$BUILD/bin/dmuon" ]] && "$BUILD/bin/dmuon" bench ns --help >/dev/null 2>&1; then
  if "$BUILD/bin/dmuon" bench ns --shape 1024x4096 --schedule polar_express --steps 5 >"$LOGDIR/bench_ns.log" 2>&1; then
    row "dmuon bench ns (cpu backend)" ok "$(grep -m1 -E 'ms|GFLOP' "$LOGDIR/bench_ns.log" | tr -s ' ' | cut -c1-90)"
  else
    row "dmuon bench ns (cpu backend)" FAIL "$LOGDIR/bench_ns.log"
  fi
else
  row "dmuon bench ns" skip "not built"
fi

# ---- 6. the GPU orthogonalization benchmark: the cuda backend vs cuBLAS GEMMs of the same dtype ----
# Issue 12's target: >= 0.7 of the cuBLAS bf16 GEMM rate at 4096x4096 and 2048x8192, 5 Polar Express
# steps. The figures are in the log (and the summary row): TFLOP/s done, cuBLAS TFLOP/s, the ratio.
if [[ -x "$BUILD/bin/dmuon" ]]; then
  for shape in 4096x4096 2048x8192; do
    log="$LOGDIR/bench_ns_cuda_$shape.log"
    if "$BUILD/bin/dmuon" bench ns --device cuda --shape "$shape" --schedule polar_express --steps 5 \
         --matmul-dtype both --repeats 10 --warmup 2 >"$log" 2>&1; then
      row "bench ns cuda $shape" ok "$(awk '$1=="bf16"{printf "bf16 %s TFLOP/s, cuBLAS %s, %s", $4, $5, $6} $1=="fp32"{printf "; fp32 %s TFLOP/s, %s ", $4, $6}' "$log")"
    else
      row "bench ns cuda $shape" FAIL "$log"
      status=1
    fi
  done
  # Small matrices batched (GPT-2 small's MLP shape, 12 layers): one call with batched products
  # against one matrix at a time, same run, and whether every copy is bitwise the matrix alone.
  log="$LOGDIR/bench_ns_cuda_batch.log"
  if "$BUILD/bin/dmuon" bench ns --device cuda --shape 768x3072 --schedule polar_express --steps 5 \
       --matmul-dtype bf16 --batch 12 --repeats 10 --warmup 2 >"$log" 2>&1 && grep -q "bitwise equal: yes" "$log"; then
    row "bench ns cuda 768x3072 x12" ok "$(grep -m1 'batch 12' "$log" | tr -s ' ' | cut -c1-110)"
  else
    row "bench ns cuda 768x3072 x12" FAIL "$log"
    status=1
  fi
fi

# ---- 7. the optimizer step on the GPU: dmuon bench step --device cuda ----
# One rank (the single communicator copying device buffers), and under GPU_CHECK_MPI=ON two ranks
# sharing this GPU through the mpi communicator's staging: auto vs every baseline, bytes == plan.
if [[ -x "$BUILD/bin/dmuon" ]]; then
  log="$LOGDIR/bench_step_cuda.log"
  if "$BUILD/bin/dmuon" bench step --model gpt2-124m --backend single --device cuda --steps 3 >"$log" 2>&1; then
    row "bench step cuda (1 rank)" ok "$(awk '$1=="auto"{printf "auto %s s/step", $2}' "$log")"
  else
    row "bench step cuda (1 rank)" FAIL "$log"
    status=1
  fi
  if [[ "$GPU_CHECK_MPI" == ON ]]; then
    log="$LOGDIR/bench_step_cuda_np2.log"
    if "${MPIRUN:-$PREFIX/usr/bin/mpirun}" -n 2 --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x OPAL_PREFIX -x PMIX_MCA_mca_base_component_path \
         "$BUILD/bin/dmuon" bench step --model gpt2-124m --parallel dp_shard=2 --device cuda --compare --steps 3 \
         >"$log" 2>&1; then
      row "bench step cuda (np 2, one GPU)" ok "$(awk '$1=="auto"||$1=="allgather"{printf "%s %s s ", $1, $2}' "$log")"
    else
      row "bench step cuda (np 2, one GPU)" FAIL "$log"
      status=1
    fi
  fi
fi

# ---- 8. the Python package on the GPU: dmuon.torch.Muon on CUDA tensors ----
# pip builds the package with the same environment (the unpacked prefix, the cuBLAS / NCCL wheels);
# the device tests must run (a skip counts as a failure here), then compare-torch on GPT-2 small.
log="$LOGDIR/pip_install.log"
if "$PY" -m pip install --no-build-isolation --no-deps -v . >"$log" 2>&1; then
  row "pip install (cuda)" ok "$(grep -m1 -o 'cuda backend[^)]*)' "$log" || echo "see $log")"
  log="$LOGDIR/pytest_cuda.log"
  (cd /tmp && "$PY" -m pytest -q -rs "$OLDPWD/tests/python/test_device.py" "$OLDPWD/tests/python/test_bench.py" \
     "$OLDPWD/tests/python/test_nccl.py") >"$log" 2>&1
  rc=$?
  skipped=$(grep -c '^SKIPPED' "$log")
  if ((rc == 0 && skipped <= 1)); then  # the no-device check skips on a GPU machine
    row "pytest (cuda)" ok "$(tail -1 "$log")"
  else
    row "pytest (cuda)" FAIL "rc $rc, $skipped skipped: $log"
    status=1
  fi
  log="$LOGDIR/compare_torch_cuda.log"
  if (cd /tmp && "$PY" -m dmuon.bench compare-torch --device cuda --repeat 5) >"$log" 2>&1; then
    row "compare-torch cuda (GPT-2 small)" ok "$(grep -m1 speedup "$log" | tr -s ' ')"
  else
    row "compare-torch cuda (GPT-2 small)" FAIL "$log"
    status=1
  fi
else
  row "pip install (cuda)" FAIL "$log"
  status=1
fi

summary
exit $status
