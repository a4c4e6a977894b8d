// The emulated cuBLAS (tests/cuda_emu, README.md there): the entry points dmuon's loader takes
// (src/backend/cuda/cublas_loader.h), exported under cuBLAS's names from this library, which the
// emulated tests name in DMUON_CUBLAS_LIBRARY. Products run through OpenBLAS on the host; bf16
// operands are widened exactly to fp32 first (so the products are exact, the accumulation fp32).
//
// What it checks, as cuBLAS and the GPU would: the handle, the dimensions and leading dimensions
// (CUBLAS_STATUS_INVALID_VALUE, cuBLAS's rules), the data types (NOT_SUPPORTED), and that every
// element each operand spans lies inside one live device (or pinned) allocation: a host pointer or a
// leading dimension that runs past the buffer is EXECUTION_FAILED with the operand named on stderr.
#include <cblas.h>
#include <cublas_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bits.h"
#include "device_memory.h"
#include "streams.h"

struct cublasContext {
  int magic = 0xB1A5;
  void* workspace = nullptr;  // device memory, as a real handle's: a leaked handle shows in cudaMemGetInfo
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

using namespace dmuon::cuda_emu;

bool handle_ok(cublasHandle_t h) { return h != nullptr && h->magic == 0xB1A5; }

// Column-major rows × cols at p with leading dimension ld, `elem` bytes each: its span in bytes.
size_t span(int rows, int cols, int ld, size_t elem) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows)) * elem;
}

bool operand_ok(const void* p, int rows, int cols, int ld, size_t elem, const char* gemm, const char* name) {
  const size_t bytes = span(rows, cols, ld, elem);
  if (bytes == 0) return true;
  const std::string what = std::string(gemm) + " operand " + name;
  if (reinterpret_cast<uintptr_t>(p) % elem != 0) return fail_access(what + ": misaligned for its element size");
  return expect_device(p, bytes, what.c_str());
}


// Column-major rows × cols (ld) of fp32 or bf16 into a dense fp32 copy (ld = rows).
std::vector<float> widen(const void* p, cudaDataType t, int rows, int cols, int ld) {
  std::vector<float> out(static_cast<size_t>(rows) * static_cast<size_t>(cols));
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) {
      const size_t i = static_cast<size_t>(c) * static_cast<size_t>(ld) + static_cast<size_t>(r);
      out[static_cast<size_t>(c) * static_cast<size_t>(rows) + static_cast<size_t>(r)] =
          t == CUDA_R_16BF ? bf16_to_float(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
    }
  return out;
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
    if (beta_v == 0.0f)  // cuBLAS: C is not read when beta is 0 (it may hold NaN)
      for (int c = 0; c < n; ++c) std::fill_n(C + static_cast<size_t>(c) * static_cast<size_t>(ldc), m, 0.0f);
    if (k == 0 || alpha_v == 0.0f) {
      if (beta_v != 0.0f)
        for (int c = 0; c < n; ++c)
          for (int r = 0; r < m; ++r) C[static_cast<size_t>(c) * static_cast<size_t>(ldc) + static_cast<size_t>(r)] *= beta_v;
      return true;
    }
    const std::vector<float> a = widen(A, at, a_rows, a_cols, lda), b = widen(B, bt, b_rows, b_cols, ldb);
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                m, n, k, alpha_v, a.data(), std::max(1, a_rows), b.data(), std::max(1, b_rows), beta_v, C, ldc);
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
