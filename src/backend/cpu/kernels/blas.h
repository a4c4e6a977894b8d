// The CBLAS entry points meshmuon uses, resolved at run time from the loaded BLAS (see meshmuon/blas.h).
// All matrices are row-major fp32. Thread-safe after the first call to blas(). Kernels call the
// products of products.h, which run these entry points one tile at a time on one thread each.
#pragma once

namespace meshmuon::cpu {

enum BlasOrder : int { kRowMajor = 101 };
enum BlasTranspose : int { kNoTrans = 111, kTrans = 112 };
enum BlasUplo : int { kUpper = 121, kLower = 122 };
enum BlasSide : int { kLeft = 141, kRight = 142 };

struct BlasApi {
  void (*sgemm)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                int lda, const float* b, int ldb, float beta, float* c, int ldc) = nullptr;
  void (*ssyrk)(int order, int uplo, int trans, int n, int k, float alpha, const float* a, int lda,
                float beta, float* c, int ldc) = nullptr;
  // Optional (nullptr when the library lacks it; ssymm_lower then mirrors A and uses sgemm).
  void (*ssymm)(int order, int side, int uplo, int m, int n, float alpha, const float* a, int lda,
                const float* b, int ldb, float beta, float* c, int ldc) = nullptr;
  void (*set_num_threads)(int) = nullptr;  // OpenBLAS only
  int (*get_num_threads)() = nullptr;      // OpenBLAS only
  char* (*get_corename)() = nullptr;       // OpenBLAS only
  char* (*get_config)() = nullptr;         // OpenBLAS only
  // LAPACKE's symmetric eigensolver from the same library when it carries LAPACKE (PyPI's
  // scipy-openblas32 does, Debian's libopenblas0 does not): the CLI's bench checks with it.
  int (*dsyevd)(int layout, char jobz, char uplo, int n, double* a, int lda, double* w) = nullptr;
  const char* library = "";
  // "" for OpenBLAS, "scipy_" for PyPI's scipy-openblas32, whose every symbol carries that prefix.
  const char* prefix = "";
  // OpenBLAS's thread count when it was loaded (its OPENBLAS_NUM_THREADS logic), before meshmuon set it
  // to 1: the default of product_threads(). 1 for other libraries.
  int default_threads = 1;
};

// Loads the BLAS on first use and sets OpenBLAS to one thread (meshmuon's products split the work
// themselves); throws meshmuon::Error naming the libraries tried when none loads.
const BlasApi& blas();

// LAPACKE_dsyevd, from the BLAS when it carries LAPACKE, else from liblapacke.so.3 (or
// $MESHMUON_LAPACKE_LIBRARY); throws meshmuon::Error naming what was tried when neither has it.
using DsyevdFn = decltype(BlasApi::dsyevd);
DsyevdFn lapacke_dsyevd();

}  // namespace meshmuon::cpu
