// meshmuon's fp32 matrix products on the CPU, parallel and deterministic. The result C is cut into tiles
// whose bounds depend only on the product's sizes; each tile is ONE single-threaded BLAS call over
// the whole reduction dimension; the tiles run on product_threads() threads (core/parallel_for.h).
// So a product's bits depend on its sizes, operands and the BLAS core, never on the thread count.
// (OpenBLAS's own threaded driver splits the reduction dimension differently for 1 and 2 threads
// on its Haswell and Zen cores, so its results change with the thread count there.)
// All matrices are row-major fp32. `trans` flags as CBLAS: op(A) = Aᵀ when set.
#pragma once

#include <cstdint>
#include <functional>

namespace meshmuon::cpu {

// Threads the products use (default: OpenBLAS's count when meshmuon loaded it, which follows
// OPENBLAS_NUM_THREADS; meshmuon then runs OpenBLAS itself on one thread). Process-wide, unless the
// calling thread holds a ScopedProductThreads.
int product_threads();
void set_product_threads(int n);  // n >= 1

// The calling thread's products use `n` threads while this lives (e.g. 1 to time work by the
// thread's CPU clock); other threads keep the process-wide count.
class ScopedProductThreads {
 public:
  explicit ScopedProductThreads(int n);
  ~ScopedProductThreads();
  ScopedProductThreads(const ScopedProductThreads&) = delete;
  ScopedProductThreads& operator=(const ScopedProductThreads&) = delete;

 private:
  int previous_;
};

// Called after a tile of C is final, with its bounds [r0, r1) x [c0, c1), on the thread that
// computed it (e.g. rounding the tile to bf16 while it is in cache). Must touch only that tile.
using TileEpilogue = std::function<void(int64_t r0, int64_t r1, int64_t c0, int64_t c1)>;

// C (m×n) = alpha·op(A)·op(B) + beta·C, op(A) m×k, op(B) k×n.
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc, const TileEpilogue* epilogue = nullptr);

// The lower triangle of C (n×n) = alpha·op(A)·op(A)ᵀ + beta·C, op(A) n×k. Entries above the
// diagonal may be written too (inside diagonal tiles); callers read only the lower triangle or
// mirror it.
void ssyrk_lower(bool trans, int n, int k, float alpha, const float* a, int lda, float beta, float* c,
                 int ldc);

// C (m×n) = alpha·A·B + beta·C (left, A m×m) or alpha·B·A + beta·C (right, A n×n), A symmetric with
// only its lower triangle read.
void ssymm_lower(bool left, int m, int n, float alpha, const float* a, int lda, const float* b, int ldb,
                 float beta, float* c, int ldc);

// Element-wise work on `rows` rows of `cols` elements each: fn(r0, r1) on row ranges, spread over
// product_threads() threads when there is enough of it. For work where each row's result does not
// depend on the split (so the bits never depend on the thread count).
void parallel_rows(int64_t rows, int64_t cols, const std::function<void(int64_t r0, int64_t r1)>& fn);

// The tile grid of a product (tests and benchmarks): sgemm's rows x columns parts for C m×n with
// reduction k; ssyrk_lower's blocks per side of C n×n (it computes parts·(parts+1)/2 tiles).
struct TileGrid {
  int row_parts = 1, col_parts = 1;
};
TileGrid sgemm_tiles(int m, int n, int k);
int ssyrk_blocks(int n, int k);

}  // namespace meshmuon::cpu
