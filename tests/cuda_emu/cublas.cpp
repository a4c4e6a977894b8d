// The emulated cuBLAS (tests/cuda_emu, README.md there): the entry points meshmuon's loader takes
// (src/backend/cuda/cublas_loader.h), exported under cuBLAS's names from this library, which the
// emulated tests name in MESHMUON_CUBLAS_LIBRARY. Products run through OpenBLAS on the host; bf16
// operands are widened exactly to fp32 first (so the products are exact, the accumulation fp32).
//
// What it checks, as cuBLAS and the GPU would: the handle, the dimensions and leading dimensions
// (CUBLAS_STATUS_INVALID_VALUE, cuBLAS's rules), the data types (NOT_SUPPORTED), and that every
// element each operand spans lies inside one live device (or pinned) allocation: a host pointer or a
// leading dimension that runs past the buffer is EXECUTION_FAILED with the operand named on stderr.
#include <cublas_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "device_memory.h"
#include "gemm_host.h"
#include "streams.h"

struct cublasContext {
  int magic = 0xB1A5;
  void* workspace = nullptr;  // device memory, as a real handle's: a leaked handle shows in cudaMemGetInfo
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

using namespace meshmuon::cuda_emu;

bool handle_ok(cublasHandle_t h) { return h != nullptr && h->magic == 0xB1A5; }

bool operand_ok(const void* p, int rows, int cols, int ld, size_t elem, const char* gemm, const char* name) {
  return gemm_operand_ok(p, gemm_span(rows, cols, ld, elem), elem, gemm, name);
}

// C = alpha·op(A)·op(B) + beta·C, every operand fp32 (A, B widened when bf16), checked first.
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const float* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt,
                    int ldb, const float* beta, float* C, int ldc, const char* name) {
  if (!handle_ok(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T; };
  if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    std::fprintf(stderr, "[cuda_emu] %s: invalid leading dimension (m %d n %d k %d lda %d ldb %d ldc %d)\n", name, m, n,
                 k, lda, ldb, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const size_t ae = at == CUDA_R_16BF ? 2 : 4, be = bt == CUDA_R_16BF ? 2 : 4;
  if (k > 0 && *alpha != 0.0f &&
      (!operand_ok(A, a_rows, a_cols, lda, ae, name, "A") || !operand_ok(B, b_rows, b_cols, ldb, be, name, "B")))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!operand_ok(C, m, n, ldc, 4, name, "C")) return CUBLAS_STATUS_EXECUTION_FAILED;
  // Queued on the handle's stream (streams.h); the scalars are read now, as cuBLAS reads host ones.
  const float alpha_v = *alpha, beta_v = *beta;
  submit(h->stream, [=] {
    DeviceScope scope;
    host_gemm(ta == CUBLAS_OP_T, tb == CUBLAS_OP_T, m, n, k, alpha_v, A, at, lda, B, bt, ldb, beta_v, C, ldc);
    return true;
  });
  return CUBLAS_STATUS_SUCCESS;
}

bool type_ok(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

}  // namespace

extern "C" {

__attribute__((visibility("default"))) cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasContext;
  count_made(Made::BlasHandle);
  (*h)->workspace = device_alloc(size_t{1} << 20);
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  if (!handle_ok(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  device_free(h->workspace);
  h->magic = 0;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!handle_ok(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  if (!handle_ok(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta,
                                                                     cublasOperation_t tb, int m, int n, int k,
                                                                     const float* alpha, const float* A, int lda,
                                                                     const float* B, int ldb, const float* beta,
                                                                     float* C, int ldc) {
  return gemm(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, ldc, "cublasSgemm");
}

// The compute-type form (cublas_loader.h holds it): fp32 or bf16 A and B, fp32 C, fp32 compute.
__attribute__((visibility("default"))) cublasStatus_t cublasGemmEx(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha, const void* A,
    cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb, const void* beta, void* C, cudaDataType ct,
    int ldc, cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!type_ok(at) || !type_ok(bt) || at != bt || ct != CUDA_R_32F ||
      (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(h, ta, tb, m, n, k, static_cast<const float*>(alpha), A, at, lda, B, bt, ldb,
              static_cast<const float*>(beta), static_cast<float*>(C), ldc, "cublasGemmEx");
}

}  // extern "C"
