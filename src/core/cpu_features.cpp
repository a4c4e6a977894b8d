// OPENBLAS_CORETYPE selection: set at library load so the user never has to (REFERENCE.md section 3).
#include "core/cpu_features.h"

#include <unistd.h>

#include <cstdlib>

namespace dmuon::detail {

std::string recommended_openblas_coretype() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
#endif
  return "";
}

bool prepare_blas_environment() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return false;
  const std::string core = recommended_openblas_coretype();
  if (core.empty()) return false;
  return setenv("OPENBLAS_CORETYPE", core.c_str(), 0) == 0;
}

void reexec_with_blas_environment(char** argv) {
  if (std::getenv("DMUON_BLAS_REEXEC") != nullptr) return;  // already re-executed once
  if (!prepare_blas_environment()) return;
  setenv("DMUON_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  // execv failed: go on with the BLAS as loaded (slower, still correct).
}

namespace {
// Runs when libdmuon loads, before any dmuon code can dlopen the BLAS.
__attribute__((constructor)) void dmuon_prepare_blas_on_load() { prepare_blas_environment(); }
}  // namespace

}  // namespace dmuon::detail
