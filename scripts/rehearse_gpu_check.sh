#!/usr/bin/env bash
# Rehearses scripts/gpu_check.sh on a machine WITHOUT a GPU: runs it in a private mount namespace
# where the Debian dev packages a GPU machine of this project lacks (OpenBLAS, LAPACKE, Open MPI,
# PMIx, GoogleTest, fmt, spdlog, nlohmann-json, CLI11, oneDNN, zlib headers, Google Benchmark) are
# hidden, so the build must come from shared/debs/ alone, as it will there. Needs root (unshare -m)
# and the .debs (scripts/fetch_gpu_debs.sh). Nothing is changed outside the namespace but the
# build folder and the prefix.
#
# Expected without a GPU: "versions", "debs and wheels", "configure" and "build" ok; every row
# that needs the device FAIL (fast: no device). A failure before that is a gpu_check.sh bug that
# would cost a GPU session its time. The summary's seconds column times each stage here; the stage
# limits are scaled (LIMIT_SCALE=6, BUDGET=3600) since this machine builds on 2 cores, not 16.
#
# Usage: bash scripts/rehearse_gpu_check.sh     (from the repository root; the environment of
#        gpu_check.sh applies, e.g. JOBS=2 BUILD=/tmp/gpu-rehearsal)
set -euo pipefail
[[ $(id -u) == 0 ]] || { echo "rehearse_gpu_check: needs root (a mount namespace)" >&2; exit 2; }
[[ -f scripts/gpu_check.sh ]] || { echo "rehearse_gpu_check: run from the meshmuon repository root" >&2; exit 2; }
export BUILD=${BUILD:-/tmp/gpu-rehearsal} PREFIX=${PREFIX:-/tmp/gpu-rehearsal-prefix}
export LIMIT_SCALE=${LIMIT_SCALE:-6} BUDGET=${BUDGET:-3600}
exec unshare -m bash -c '
  set -e
  empty=$(mktemp)
  A=/usr/lib/x86_64-linux-gnu
  for d in $A/openmpi $A/pmix2 /etc/openmpi $A/openblas-pthread $A/cmake $A/pkgconfig /usr/share/pkgconfig \
           /usr/include/gtest /usr/include/gmock /usr/include/fmt /usr/include/spdlog /usr/include/nlohmann \
           /usr/include/CLI /usr/include/oneapi /usr/include/benchmark /usr/src/googletest /usr/share/cmake \
           /usr/include/x86_64-linux-gnu/openblas-pthread; do
    if [[ -d $d ]]; then mount -t tmpfs none "$d"; fi
  done
  for f in /usr/include/dnnl*.h /usr/include/dnnl*.hpp /usr/include/lapack*.h /usr/include/zlib.h /usr/include/zconf.h \
           /usr/include/x86_64-linux-gnu/cblas*.h /usr/include/x86_64-linux-gnu/f77blas.h /usr/bin/mpirun \
           /usr/bin/mpiexec /usr/bin/mpicc; do
    if [[ -e $f ]]; then mount --bind "$empty" "$f"; fi
  done
  exec bash scripts/gpu_check.sh
'
