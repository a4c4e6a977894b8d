// Test infrastructure: what the emulated cuBLAS and cuBLASLt (tests/cuda_emu, README.md there) share:
// operand extents and their checks, and the product itself on the host (OpenBLAS, bf16 operands
// widened exactly to fp32 first: exact products, fp32 accumulation).
#pragma once

#include <cblas.h>
#include <library_types.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bits.h"
#include "device_memory.h"

namespace meshmuon::cuda_emu {

// Column-major rows × cols with leading dimension ld, `elem` bytes each: its span in bytes.
inline size_t gemm_span(int64_t rows, int64_t cols, int64_t ld, size_t elem) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows)) * elem;
}

// `bytes` at p inside one live device (or pinned) allocation and aligned for `elem`; else an
// emulated illegal access naming the operand.
inline bool gemm_operand_ok(const void* p, size_t bytes, size_t elem, const char* gemm, const char* name) {
  if (bytes == 0) return true;
  const std::string what = std::string(gemm) + " operand " + name;
  if (reinterpret_cast<uintptr_t>(p) % elem != 0) return fail_access(what + ": misaligned for its element size");
  return expect_device(p, bytes, what.c_str());
}

// Column-major rows × cols (ld) of fp32 or bf16 into a dense fp32 copy (ld = rows).
inline std::vector<float> gemm_widen(const void* p, cudaDataType t, int rows, int cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows) * static_cast<size_t>(cols));
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) {
      const size_t i = static_cast<size_t>(c) * static_cast<size_t>(ld) + static_cast<size_t>(r);
      out[static_cast<size_t>(c) * static_cast<size_t>(rows) + static_cast<size_t>(r)] =
          t == CUDA_R_16BF ? bf16_to_float(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
    }
  return out;
}

// C = alpha·op(A)·op(B) + beta·C (column-major, fp32 C), inside a DeviceScope. beta 0: C is not
// read (it may hold NaN), as cuBLAS.
inline void host_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const void* A, cudaDataType at, int64_t lda,
                      const void* B, cudaDataType bt, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (beta == 0.0f)
    for (int c = 0; c < n; ++c) std::fill_n(C + static_cast<size_t>(c) * static_cast<size_t>(ldc), m, 0.0f);
  if (k == 0 || alpha == 0.0f) {
    if (beta != 0.0f)
      for (int c = 0; c < n; ++c)
        for (int r = 0; r < m; ++r) C[static_cast<size_t>(c) * static_cast<size_t>(ldc) + static_cast<size_t>(r)] *= beta;
    return;
  }
  const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  const std::vector<float> a = gemm_widen(A, at, a_rows, a_cols, lda), b = gemm_widen(B, bt, b_rows, b_cols, ldb);
  cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a.data(),
              std::max(1, a_rows), b.data(), std::max(1, b_rows), beta, C, static_cast<int>(ldc));
}

}  // namespace meshmuon::cuda_emu
