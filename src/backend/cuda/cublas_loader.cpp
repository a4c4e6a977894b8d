// Internal: cuBLAS, loaded at run time (cublas_loader.h).
#include "backend/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <cstdlib>

#include "dmuon/error.h"

namespace dmuon::detail {
namespace {

Cublas load_cublas() {
  std::string tried;
  std::string wheel = DMUON_CUBLAS_WHEEL_DIR;
  if (!wheel.empty()) wheel += "/libcublas.so.13";
  const char* user = std::getenv("DMUON_CUBLAS_LIBRARY");
  const char* candidates[] = {user, "libcublas.so.13", wheel.empty() ? nullptr : wheel.c_str(), "libcublas.so"};
  for (const char* name : candidates) {
    if (name == nullptr || *name == '\0') continue;
    void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      tried += concat(tried.empty() ? "" : ", ", name, " (", dlerror(), ")");
      continue;
    }
    Cublas api;
    api.create = reinterpret_cast<decltype(api.create)>(dlsym(h, "cublasCreate_v2"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(dlsym(h, "cublasSetStream_v2"));
    api.set_math_mode = reinterpret_cast<decltype(api.set_math_mode)>(dlsym(h, "cublasSetMathMode"));
    api.sgemm = reinterpret_cast<decltype(api.sgemm)>(dlsym(h, "cublasSgemm_v2"));
    api.gemm_ex = reinterpret_cast<decltype(api.gemm_ex)>(dlsym(h, "cublasGemmEx"));
    if (!api.create || !api.set_stream || !api.set_math_mode || !api.sgemm || !api.gemm_ex) {
      tried += concat(tried.empty() ? "" : ", ", name, " (missing cublasCreate_v2/SetStream_v2/SetMathMode/Sgemm_v2/GemmEx)");
      dlclose(h);
      continue;
    }
    api.library = name;
    return api;
  }
  throw_error(concat("[cuda] could not load cuBLAS; tried ", tried,
                     ". pip install nvidia-cublas (scripts/requirements.txt) or set DMUON_CUBLAS_LIBRARY"));
}

}  // namespace

const Cublas& cublas() {
  static const Cublas api = load_cublas();
  return api;
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_error(concat("[cuda] ", what, ": cuBLAS status ", static_cast<int>(s)));
}

}  // namespace dmuon::detail
