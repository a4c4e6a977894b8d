// Tiled products over single-threaded BLAS calls (products.h). Tile bounds are a function of the
// sizes only: that is the whole determinism argument, so nothing here may read the thread count
// before the tiles are fixed.
#include "backend/cpu/kernels/products.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/parallel_for.h"
#include "meshmuon/error.h"
#include "backend/cpu/kernels/blas.h"

namespace meshmuon::cpu {
namespace {

// Tiles of 128 to 512 rows and columns run within a few percent of one whole single-threaded call
// (OpenBLAS 0.3.21, SkylakeX and Haswell cores, measured); below 2^24 multiply-adds a product is one
// tile (the split would cost more than it gives). At least 8 tiles where the sizes allow, so 2-4
// threads stay busy; tile edges on multiples of 16 floats (64 bytes).
constexpr int kMaxTile = 512;
constexpr int kMaxTileCols = 1024;
constexpr int kMinTile = 128;
constexpr int kTargetTiles = 8;
constexpr int kAlign = 16;
constexpr double kSplitWork = double(1 << 24);

std::atomic<int> g_threads{0};  // 0: not set, use the BLAS's count at load
thread_local int t_threads = 0;  // a ScopedProductThreads of this thread (0: none)

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Bound i (0..parts) of `size` cut into `parts` near-equal pieces on multiples of kAlign.
int bound(int size, int parts, int i) {
  if (i >= parts) return size;
  return static_cast<int>(int64_t(size) * i / parts / kAlign * kAlign);
}

// Runs f(tile) for every tile, on product_threads() threads when there is more than one tile.
template <class F>
void run_tiles(int tiles, F&& f) {
  const BlasApi& api = blas();
  // meshmuon's products run OpenBLAS on one thread (blas.cpp sets it at load); a count changed since
  // by someone else in the process would bring back its thread-dependent splits.
  if (api.get_num_threads != nullptr && api.get_num_threads() != 1) api.set_num_threads(1);
  if (tiles == 1) return f(0);
  detail::parallel_for(tiles, product_threads(), [&](int64_t t) { f(static_cast<int>(t)); });
}

const float* rows_of(const float* a, bool trans, int ld, int first) {  // op(A) from row `first`
  return trans ? a + first : a + int64_t(first) * ld;
}
const float* cols_of(const float* b, bool trans, int ld, int first) {  // op(B) from column `first`
  return trans ? b + int64_t(first) * ld : b + first;
}

}  // namespace

int product_threads() {
  if (t_threads > 0) return t_threads;
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : blas().default_threads;
}

void set_product_threads(int n) {
  MESHMUON_CHECK(n >= 1, "[blas] thread count must be >= 1, got ", n);
  (void)blas();  // loads the BLAS (and pins OpenBLAS to one thread) before the first product
  g_threads.store(n, std::memory_order_relaxed);
}

// Pieces of a product split along one dimension only (SYMM: every piece needs all of A).
int line_parts(int size, double work) {
  int p = std::max(1, ceil_div(size, kMaxTile));
  if (work < kSplitWork) return 1;
  while (p < kTargetTiles && size / (p + 1) >= kMinTile) ++p;
  return p;
}

void parallel_rows(int64_t rows, int64_t cols, const std::function<void(int64_t, int64_t)>& fn) {
  if (rows <= 0) return;
  // pieces of at least 32K elements (a piece costs ~10 us; thread hand-off ~a few us), 64 at most
  constexpr int64_t kMinPiece = int64_t(1) << 15, kMaxPieces = 64;
  const int64_t per_row = std::max<int64_t>(cols, 1);
  const int64_t pieces = std::clamp<int64_t>(rows * per_row / kMinPiece, 1, std::min(kMaxPieces, rows));
  const int threads = product_threads();
  if (pieces == 1 || threads == 1) return fn(0, rows);
  detail::parallel_for(pieces, threads, [&](int64_t p) { fn(rows * p / pieces, rows * (p + 1) / pieces); });
}

ScopedProductThreads::ScopedProductThreads(int n) : previous_(t_threads) {
  MESHMUON_CHECK(n >= 1, "[blas] thread count must be >= 1, got ", n);
  t_threads = n;
}
ScopedProductThreads::~ScopedProductThreads() { t_threads = previous_; }

TileGrid sgemm_tiles(int m, int n, int k) {
  TileGrid g{std::max(1, ceil_div(m, kMaxTile)), std::max(1, ceil_div(n, kMaxTileCols))};
  if (double(m) * n * k < kSplitWork) return {1, 1};
  const auto fits = [](int size, int parts) { return size / parts >= kMinTile; };
  while (g.row_parts * g.col_parts < kTargetTiles) {
    // cut the dimension whose pieces are longer, while its pieces stay >= kMinTile
    const bool rows_first = m / g.row_parts >= n / g.col_parts;
    if (rows_first && fits(m, g.row_parts + 1)) ++g.row_parts;
    else if (fits(n, g.col_parts + 1)) ++g.col_parts;
    else if (fits(m, g.row_parts + 1)) ++g.row_parts;
    else break;
  }
  return g;
}

int ssyrk_blocks(int n, int k) {
  int p = std::max(1, ceil_div(n, kMaxTile));
  if (double(n) * n * k / 2 < kSplitWork) return 1;
  while (p * (p + 1) / 2 < kTargetTiles && n / (p + 1) >= kMinTile) ++p;
  return p;
}

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc, const TileEpilogue* epilogue) {
  if (m == 0 || n == 0) return;
  const TileGrid g = sgemm_tiles(m, n, k);
  const BlasApi& api = blas();
  run_tiles(g.row_parts * g.col_parts, [&](int t) {
    const int i = t / g.col_parts, j = t % g.col_parts;
    const int r0 = bound(m, g.row_parts, i), r1 = bound(m, g.row_parts, i + 1);
    const int c0 = bound(n, g.col_parts, j), c1 = bound(n, g.col_parts, j + 1);
    if (r1 == r0 || c1 == c0) return;
    api.sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, r1 - r0, c1 - c0, k, alpha,
              rows_of(a, trans_a, lda, r0), lda, cols_of(b, trans_b, ldb, c0), ldb, beta,
              c + int64_t(r0) * ldc + c0, ldc);
    if (epilogue != nullptr) (*epilogue)(r0, r1, c0, c1);
  });
}

void ssyrk_lower(bool trans, int n, int k, float alpha, const float* a, int lda, float beta, float* c,
                 int ldc) {
  if (n == 0) return;
  const int p = ssyrk_blocks(n, k);
  const BlasApi& api = blas();
  // Tiles (i, j ≤ i) of the lower block triangle, in row-major order; diagonal tiles by SYRK.
  std::vector<std::pair<int, int>> tiles;
  tiles.reserve(size_t(p) * (p + 1) / 2);
  for (int i = 0; i < p; ++i)
    for (int j = 0; j <= i; ++j) tiles.emplace_back(i, j);
  run_tiles(static_cast<int>(tiles.size()), [&](int t) {
    const auto [i, j] = tiles[static_cast<size_t>(t)];
    const int r0 = bound(n, p, i), r1 = bound(n, p, i + 1);
    const int c0 = bound(n, p, j), c1 = bound(n, p, j + 1);
    if (r1 == r0 || c1 == c0) return;
    float* ct = c + int64_t(r0) * ldc + c0;
    if (i == j)
      api.ssyrk(kRowMajor, kLower, trans ? kTrans : kNoTrans, r1 - r0, k, alpha, rows_of(a, trans, lda, r0), lda,
                beta, ct, ldc);
    else  // op(A) rows [r0, r1) times op(A)ᵀ columns [c0, c1) = op(A) rows [c0, c1), transposed
      api.sgemm(kRowMajor, trans ? kTrans : kNoTrans, trans ? kNoTrans : kTrans, r1 - r0, c1 - c0, k, alpha,
                rows_of(a, trans, lda, r0), lda, rows_of(a, trans, lda, c0), lda, beta, ct, ldc);
  });
}

void ssymm_lower(bool left, int m, int n, float alpha, const float* a, int lda, const float* b, int ldb,
                 float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  const BlasApi& api = blas();
  const int side = left ? m : n;
  std::vector<float> full;  // a BLAS without SYMM: A mirrored into a full copy for SGEMM
  if (api.ssymm == nullptr) {
    full.resize(size_t(side) * side);
    for (int i = 0; i < side; ++i)
      for (int j = 0; j <= i; ++j) full[size_t(i) * side + j] = full[size_t(j) * side + i] = a[int64_t(i) * lda + j];
    a = full.data(), lda = side;
  }
  // Left: C's column blocks (each needs all of A); right: C's row blocks.
  const int size = left ? n : m;
  const int parts = line_parts(size, double(m) * n * side);
  run_tiles(parts, [&](int t) {
    const int e0 = bound(size, parts, t), e1 = bound(size, parts, t + 1);
    if (e1 == e0) return;
    if (api.ssymm == nullptr && left)
      api.sgemm(kRowMajor, kNoTrans, kNoTrans, m, e1 - e0, m, alpha, a, lda, b + e0, ldb, beta, c + e0, ldc);
    else if (api.ssymm == nullptr)
      api.sgemm(kRowMajor, kNoTrans, kNoTrans, e1 - e0, n, n, alpha, b + int64_t(e0) * ldb, ldb, a, lda, beta,
                c + int64_t(e0) * ldc, ldc);
    else if (left)
      api.ssymm(kRowMajor, kLeft, kLower, m, e1 - e0, alpha, a, lda, b + e0, ldb, beta, c + e0, ldc);
    else
      api.ssymm(kRowMajor, kRight, kLower, e1 - e0, n, alpha, a, lda, b + int64_t(e0) * ldb, ldb, beta,
                c + int64_t(e0) * ldc, ldc);
  });
}

}  // namespace meshmuon::cpu
