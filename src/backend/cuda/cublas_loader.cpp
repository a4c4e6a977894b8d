// Internal: cuBLAS, loaded at run time (cublas_loader.h).
#include "backend/cuda/cublas_loader.h"

#include <cstdlib>

#include "core/dl_symbol.h"
#include "core/library_loader.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {
namespace {

Cublas load_cublas() {
  Cublas api;
  open_cublas_family("MESHMUON_CUBLAS_LIBRARY", "libcublas.so.13", "cuBLAS",
                     "missing cublasCreate_v2/Destroy_v2/SetStream_v2/SetMathMode/Sgemm_v2/GemmEx",
                     [&api](void* h, const char* name) {
                       api.library = name;
                       return bind_symbol(h, "cublasCreate_v2", api.create) &&
                              bind_symbol(h, "cublasDestroy_v2", api.destroy) &&
                              bind_symbol(h, "cublasSetStream_v2", api.set_stream) &&
                              bind_symbol(h, "cublasSetMathMode", api.set_math_mode) &&
                              bind_symbol(h, "cublasSgemm_v2", api.sgemm) && bind_symbol(h, "cublasGemmEx", api.gemm_ex);
                     });
  return api;
}

}  // namespace

void open_cublas_family(const char* env, const char* soname, const char* what, const char* missing,
                        const std::function<bool(void*, const char*)>& bind) {
  std::string wheel = MESHMUON_CUBLAS_WHEEL_DIR;
  if (!wheel.empty()) wheel = concat(wheel, "/", soname);
  // Installed from meshmuon's wheel: PyPI's nvidia-cublas beside the package in site-packages.
  const std::string& site = install_location().site_packages;
  const std::string beside = site.empty() ? std::string() : concat(site, "/nvidia/cu13/lib/", soname);
  const char* user = std::getenv(env);
  const char* candidates[] = {user, soname, beside.empty() ? nullptr : beside.c_str(),
                              wheel.empty() ? nullptr : wheel.c_str()};
  const OpenedLibrary lib = open_first_library(candidates, RTLD_NOW | RTLD_LOCAL, [&](void* h, const char* name) {
    return bind(h, name) ? std::string() : std::string(missing);
  });
  if (lib.handle != nullptr) return;
  throw_error(concat("[cuda] could not load ", what, "; tried ", lib.tried(),
                     ". pip install nvidia-cublas (scripts/requirements.txt) or set ", env));
}

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

}  // namespace meshmuon::detail
