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
    api.destroy = reinterpret_cast<decltype(api.destroy)>(dlsym(h, "cublasDestroy_v2"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(dlsym(h, "cublasSetStream_v2"));
    api.set_math_mode = reinterpret_cast<decltype(api.set_math_mode)>(dlsym(h, "cublasSetMathMode"));
    api.sgemm = reinterpret_cast<decltype(api.sgemm)>(dlsym(h, "cublasSgemm_v2"));
    api.gemm_ex = reinterpret_cast<decltype(api.gemm_ex)>(dlsym(h, "cublasGemmEx"));
    if (!api.create || !api.destroy || !api.set_stream || !api.set_math_mode || !api.sgemm || !api.gemm_ex) {
      tried += concat(tried.empty() ? "" : ", ", name, " (missing cublasCreate_v2/Destroy_v2/SetStream_v2/SetMathMode/Sgemm_v2/GemmEx)");
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

cublasHandle_t make_blas_handle(const char* what) {
  cublasHandle_t h = nullptr;
  check_blas(cublas().create(&h), what);
  const cublasStatus_t s = cublas().set_math_mode(h, CUBLAS_DEFAULT_MATH);
  if (s != CUBLAS_STATUS_SUCCESS) {
    (void)cublas().destroy(h);
    check_blas(s, what);
  }
  return h;
}

void gemm(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb,
          float* C, int ldc, bool bf16, float alpha, float beta, const char* what) {
  const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  check_blas(cublas().gemm_ex(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, t,
                              lda, B, t, ldb, &beta, C, CUDA_R_32F, ldc,
                              bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
             what);
}

}  // namespace dmuon::detail
