// The CBLAS entry points dmuon uses, resolved at run time from the loaded BLAS (see dmuon/blas.h).
// All matrices are row-major fp32. Thread-safe after the first call to blas().
#pragma once

namespace dmuon::cpu {

enum BlasOrder : int { kRowMajor = 101 };
enum BlasTranspose : int { kNoTrans = 111, kTrans = 112 };
enum BlasUplo : int { kUpper = 121, kLower = 122 };
enum BlasSide : int { kLeft = 141, kRight = 142 };

struct BlasApi {
  void (*sgemm)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                int lda, const float* b, int ldb, float beta, float* c, int ldc) = nullptr;
  void (*ssyrk)(int order, int uplo, int trans, int n, int k, float alpha, const float* a, int lda,
                float beta, float* c, int ldc) = nullptr;
  // Optional (nullptr when the library lacks it; ssymm_lower then falls back to sgemm).
  void (*ssymm)(int order, int side, int uplo, int m, int n, float alpha, const float* a, int lda,
                const float* b, int ldb, float beta, float* c, int ldc) = nullptr;
  void (*set_num_threads)(int) = nullptr;  // OpenBLAS only
  int (*get_num_threads)() = nullptr;      // OpenBLAS only
  char* (*get_corename)() = nullptr;       // OpenBLAS only
  char* (*get_config)() = nullptr;         // OpenBLAS only
  const char* library = "";
};

// Loads the BLAS on first use; throws dmuon::Error naming the libraries tried when none loads.
const BlasApi& blas();

// Convenience wrappers, row-major: C = alpha * op(A) * op(B) + beta * C.
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc);
// C (n x n, lower triangle written) = alpha * op(A) * op(A)^T + beta * C; op(A) is n x k.
void ssyrk_lower(bool trans, int n, int k, float alpha, const float* a, int lda, float beta, float* c,
                 int ldc);

// C (m x n) = alpha * A * B + beta * C (left) or alpha * B * A + beta * C (right) with A symmetric,
// only its lower triangle read. When the BLAS has no ssymm, A must be full and sgemm is used.
void ssymm_lower(bool left, int m, int n, float alpha, const float* a, int lda, const float* b, int ldb,
                 float beta, float* c, int ldc);

}  // namespace dmuon::cpu
