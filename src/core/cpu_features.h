// CPU feature checks that decide which OpenBLAS core type dmuon asks for (REFERENCE.md section 3).
#pragma once

#include <string>

#include "dmuon/export.h"

namespace dmuon::detail {

// "SkylakeX" on CPUs with AVX-512 F/DQ/BW/VL (Debian's OpenBLAS 0.3.21 falls back to generic kernels
// on AVX-512 models newer than it knows); "" when OpenBLAS's own detection is trusted.
DMUON_API std::string recommended_openblas_coretype();

// Sets OPENBLAS_CORETYPE to the recommendation unless the user set it. Must run before OpenBLAS
// loads; libdmuon calls it from a load-time constructor. Returns true when it set the variable.
DMUON_API bool prepare_blas_environment();

// For executables that link OpenBLAS directly (tests linking LAPACKE): if OPENBLAS_CORETYPE is
// missing, sets it and re-executes /proc/self/exe with the same argv, so the BLAS loaded at start-up
// picks the right core. Returns only when no re-exec was needed (or it failed).
DMUON_API void reexec_with_blas_environment(char** argv);

}  // namespace dmuon::detail
