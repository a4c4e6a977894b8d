#!/usr/bin/env bash
# Runs a command as it would run on another kind of x86-64 CPU, as far as this CPU allows:
#   cpu_kind.sh KIND COMMAND [ARGS...]
# Kinds (what meshmuon's machines have had; docs/decisions/033-every-cpu-kind-in-make-test.md):
#   avx2        AVX2 + FMA only (e.g. Zen 3): oneDNN capped at AVX2 (no bf16 matmul at all, as
#               there), OpenBLAS's Zen core, torch's bf16 matmul on its slow path
#   avx512      AVX-512 without bf16 (e.g. the Xeon seen): oneDNN capped at AVX512_CORE (emulated
#               bf16), OpenBLAS's SkylakeX core
#   haswell     OpenBLAS's Haswell core (the other AVX2 core DYNAMIC_ARCH picks)
#   zen         OpenBLAS's Zen core
#   skylakex    OpenBLAS's SkylakeX core, oneDNN uncapped: what an AVX-512 machine whose environment
#               sets no OPENBLAS_CORETYPE runs (meshmuon then picks SkylakeX), run also where the
#               environment sets another core (Haswell on some AVX-512 hosts); on an AMX Xeon,
#               oneDNN's AMX kernels
#   avx512bf16  AVX512-BF16 without AMX (e.g. Zen 4 / Zen 5): oneDNN capped at AVX512_CORE_BF16 (its
#               native bf16 kernels of those CPUs, also on an AMX Xeon), OpenBLAS's SkylakeX core
# A kind needs the instructions it uses: where this CPU lacks them the command is not run and the
# script exits 77 (CTest's SKIP_RETURN_CODE) saying so. The environment is inherited by mpirun's
# ranks and by subprocesses.
set -euo pipefail
kind=${1:?usage: cpu_kind.sh KIND COMMAND [ARGS...]}
shift
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
need() {
  for f in "$@"; do
    if [[ "$flags" != *" $f "* ]]; then
      echo "SKIPPED: this CPU lacks $f, so the CPU kind '$kind' cannot be run here" >&2
      exit 77
    fi
  done
}
case "$kind" in
  avx2) need avx2 fma; export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Zen ;;
  avx512) need avx512f avx512dq avx512bw avx512vl; export ONEDNN_MAX_CPU_ISA=AVX512_CORE OPENBLAS_CORETYPE=SkylakeX ;;
  haswell) need avx2 fma; export OPENBLAS_CORETYPE=Haswell ;;
  zen) need avx2 fma; export OPENBLAS_CORETYPE=Zen ;;
  skylakex) need avx512f avx512dq avx512bw avx512vl; unset ONEDNN_MAX_CPU_ISA; export OPENBLAS_CORETYPE=SkylakeX ;;
  avx512bf16) need avx512f avx512dq avx512bw avx512vl avx512_bf16; export ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 OPENBLAS_CORETYPE=SkylakeX ;;
  *) echo "cpu_kind.sh: unknown kind '$kind' (avx2, avx512, avx512bf16, haswell, zen, skylakex)" >&2; exit 2 ;;
esac
exec "$@"
