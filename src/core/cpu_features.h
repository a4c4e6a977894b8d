// CPU feature checks that decide which OpenBLAS core type meshmuon asks for (REFERENCE.md section 3).
#pragma once

#include <string>

#include "meshmuon/export.h"

namespace meshmuon::detail {

// "SkylakeX" on CPUs with AVX-512 F/DQ/BW/VL (Debian's OpenBLAS 0.3.21 falls back to generic kernels
// on AVX-512 models newer than it knows); "" when OpenBLAS's own detection is trusted.
MESHMUON_API std::string recommended_openblas_coretype();

// Sets OPENBLAS_CORETYPE to the recommendation unless the user set it. Must run before OpenBLAS
// loads; libmeshmuon calls it from a load-time constructor. Returns true when it set the variable.
MESHMUON_API bool prepare_blas_environment();

// bf16 arithmetic of this CPU's hardware. Which implementation runs bf16 products (oneDNN native,
// meshmuon's widened products) is bf16_products_info() (meshmuon/orthogonalize.h).
struct CpuBf16 {
  bool avx512_bf16 = false;  // CPUID.(7,1):EAX[5] with AVX-512 enabled by the OS
  bool amx_bf16 = false;     // CPUID.(7,0):EDX[22]
  bool native = false;       // avx512_bf16 || amx_bf16
};
MESHMUON_API CpuBf16 cpu_bf16_support();

// The bf16 features of `b` by name, as /proc/cpuinfo spells them: "avx512_bf16", "amx_bf16",
// "avx512_bf16, amx_bf16", or "none" (what `meshmuon info` prints).
MESHMUON_API std::string cpu_bf16_features(const CpuBf16& b);

// The CPU's model name ("model name" of /proc/cpuinfo, else the CPUID brand string, else "unknown").
MESHMUON_API std::string cpu_model_name();

// For executables that link OpenBLAS directly (tests linking LAPACKE): if OPENBLAS_CORETYPE is
// missing, sets it and re-executes /proc/self/exe with the same argv, so the BLAS loaded at start-up
// picks the right core. Returns only when no re-exec was needed (or it failed).
MESHMUON_API void reexec_with_blas_environment(char** argv);

}  // namespace meshmuon::detail
