// Internal: cuBLAS, loaded at run time (dlopen) so that libmeshmuon links only the static cudart and
// loads on machines without a GPU, a driver or cuBLAS. Search order: $MESHMUON_CUBLAS_LIBRARY,
// libcublas.so.13 on the loader path, the nvidia-cublas wheel found at configure time (only
// cuBLAS 13's soname: another version has another ABI and other algorithms).
#pragma once

#include <cublas_api.h>

#include <functional>
#include <string>

namespace meshmuon::detail {

// Opens the first library of the nvidia-cublas family that loads and that `bind` accepts (it takes
// the entry points from the handle): $`env`, `soname` on the loader path, the wheel's copy found at
// configure time. Throws meshmuon::Error "[cuda] could not load <what>; tried ..." naming each
// candidate's failure (`missing` when bind refused it), the package and `env`. Handles stay open.
void open_cublas_family(const char* env, const char* soname, const char* what, const char* missing,
                        const std::function<bool(void* handle, const char* name)>& bind);

// The entry points meshmuon calls. cublasGemmEx is overloaded in C++ (cudaDataType / cublasComputeType_t):
// the compute-type form is the one held.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  std::string library;  // the name that loaded
};

// Loaded on first use; throws meshmuon::Error naming what was tried and the package to install.
const Cublas& cublas();

// Throws meshmuon::Error "[cuda] <what>: cuBLAS status N" unless `s` is CUBLAS_STATUS_SUCCESS.
void check_blas(cublasStatus_t s, const char* what);

// A handle as meshmuon uses it: CUBLAS_DEFAULT_MATH, so that bf16 products may run on tensor cores; the
// fp32 products ask for true fp32 per call instead (gemm's CUBLAS_COMPUTE_32F_PEDANTIC: no TF32,
// whatever NVIDIA_TF32_OVERRIDE says).
cublasHandle_t make_blas_handle(const char* what);

// Column-major C (m×n, fp32) = alpha·op(A)·op(B) + beta·C through cublasGemmEx: A and B fp32 (true
// fp32 products) or bf16 (fp32 accumulation). The one GEMM call of the backend and the bench's
// baseline, so that both run the same configuration.
void gemm(cublasHandle_t h, bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb,
          float* C, int ldc, bool bf16, float alpha, float beta, const char* what);

}  // namespace meshmuon::detail
