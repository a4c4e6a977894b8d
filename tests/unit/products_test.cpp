// meshmuon's fp32 products (backend/cpu/kernels/products.h) and the worker pool under them
// (core/parallel_for.h): exact on integer-valued operands for every layout, bitwise the same on
// every thread count, and split into several tiles where the sizes allow (so that the thread-count
// check is not vacuous).
// Run: build/bin/products_test; with OPENBLAS_CORETYPE=Haswell or Zen to check those cores (ctest
// does: products_test_haswell, products_test_zen).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel_for.h"
#include "meshmuon/blas.h"
#include "backend/cpu/kernels/blas.h"
#include "backend/cpu/kernels/products.h"

namespace {

using meshmuon::cpu::TileEpilogue;

std::vector<float> small_ints(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-8, 8);
  std::vector<float> v(count);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

std::vector<float> normals(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

// Element (i, j) of op(X) for X stored row-major with stride ld.
float op_at(const std::vector<float>& x, int ld, bool trans, int i, int j) {
  return trans ? x[size_t(j) * ld + i] : x[size_t(i) * ld + j];
}

struct ThreadsGuard {
  int saved = meshmuon::blas_get_num_threads();
  ~ThreadsGuard() { meshmuon::blas_set_num_threads(saved); }
};

// Sums of at most 2^10 products of integers in [-8, 8] are exact in fp32: every tile, whatever its
// split, must give the double reference exactly; alpha and beta are powers of two (exact too).
TEST(Products, SgemmIsExactOnIntegersForEveryLayout) {
  ThreadsGuard guard;
  meshmuon::blas_set_num_threads(3);
  const int m = 301, n = 517, k = 259, pad = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
      const auto a = small_ints(size_t(ta ? k : m) * lda, 1 + ta * 2 + tb);
      const auto b = small_ints(size_t(tb ? n : k) * ldb, 11 + ta * 2 + tb);
      auto c = small_ints(size_t(m) * ldc, 21);
      const auto c0 = c;
      meshmuon::cpu::sgemm(ta, tb, m, n, k, 2.0f, a.data(), lda, b.data(), ldb, 0.5f, c.data(), ldc);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < ldc; ++j) {
          const size_t at = size_t(i) * ldc + j;
          if (j >= n) {
            ASSERT_EQ(c[at], c0[at]) << "padding written at " << i << "," << j;
            continue;
          }
          double ref = 0;
          for (int p = 0; p < k; ++p) ref += double(op_at(a, lda, ta, i, p)) * op_at(b, ldb, tb, p, j);
          ASSERT_EQ(c[at], 2.0 * ref + 0.5 * c0[at]) << "ta " << ta << " tb " << tb << " at " << i << "," << j;
        }
    }
}

TEST(Products, SyrkLowerAndSymmAreExactOnIntegers) {
  ThreadsGuard guard;
  meshmuon::blas_set_num_threads(2);
  for (int n : {1, 130, 700}) {
    const int k = 200;
    for (bool trans : {false, true}) {
      const int lda = trans ? n : k;
      const auto a = small_ints(size_t(trans ? k : n) * lda, 31 + n);
      std::vector<float> c(size_t(n) * n, std::nanf(""));
      meshmuon::cpu::ssyrk_lower(trans, n, k, 1.0f, a.data(), lda, 0.0f, c.data(), n);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j <= i; ++j) {
          double ref = 0;
          for (int p = 0; p < k; ++p) ref += double(op_at(a, lda, trans, i, p)) * op_at(a, lda, trans, j, p);
          ASSERT_EQ(c[size_t(i) * n + j], ref) << "n " << n << " trans " << trans << " at " << i << "," << j;
        }
    }
    // SYMM reads only the lower triangle: poison the upper one.
    auto s = small_ints(size_t(n) * n, 41 + n);
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) s[size_t(i) * n + j] = std::nanf("");
    const auto sym = [&](int i, int j) { return double(i >= j ? s[size_t(i) * n + j] : s[size_t(j) * n + i]); };
    const int w = 97;
    for (bool left : {true, false}) {
      const int rows = left ? n : w, cols = left ? w : n;
      const auto b = small_ints(size_t(rows) * cols, 51 + n + left);
      std::vector<float> c(b.size());
      meshmuon::cpu::ssymm_lower(left, rows, cols, 1.0f, s.data(), n, b.data(), cols, 0.0f, c.data(), cols);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
          double ref = 0;
          for (int p = 0; p < n; ++p)
            ref += left ? sym(i, p) * b[size_t(p) * cols + j] : b[size_t(i) * cols + p] * sym(p, j);
          ASSERT_EQ(c[size_t(i) * cols + j], ref) << "n " << n << " left " << left << " at " << i << "," << j;
        }
    }
  }
}

// The reason the products exist: bits independent of the thread count, on whichever BLAS core this
// process runs (ctest repeats this with OPENBLAS_CORETYPE=Haswell and Zen, whose own threaded
// driver changes bits between 1 and 2 threads).
TEST(Products, BitwiseOnEveryThreadCount) {
  ThreadsGuard guard;
  struct Case { int m, n, k; };
  for (const Case cs : {Case{1024, 1024, 1024}, Case{768, 3072, 768}, Case{300, 1100, 900}, Case{64, 4096, 64}}) {
    const auto a = normals(size_t(cs.m) * cs.k, 61), b = normals(size_t(cs.k) * cs.n, 62);
    std::vector<float> first;
    std::vector<float> sy_first;
    for (int threads : {1, 2, 3, 4}) {
      meshmuon::blas_set_num_threads(threads);
      std::vector<float> c(size_t(cs.m) * cs.n);
      meshmuon::cpu::sgemm(false, false, cs.m, cs.n, cs.k, 1.0f, a.data(), cs.k, b.data(), cs.n, 0.0f, c.data(), cs.n);
      std::vector<float> sy(size_t(cs.m) * cs.m, 0.0f);
      meshmuon::cpu::ssyrk_lower(false, cs.m, cs.k, 1.0f, a.data(), cs.k, 0.0f, sy.data(), cs.m);
      if (first.empty()) {
        first = c, sy_first = sy;
        continue;
      }
      EXPECT_EQ(c, first) << cs.m << "x" << cs.n << "x" << cs.k << " on " << threads << " threads";
      EXPECT_EQ(sy, sy_first) << "syrk " << cs.m << "x" << cs.k << " on " << threads << " threads";
    }
  }
}

// Negative control for the test above: these products really are split, and the tiles really run
// on several threads (otherwise "bitwise on every thread count" would hold vacuously). Why tiles at
// all: OpenBLAS's own threaded driver splits k by thread count on some cores (Haswell, Zen seen), so
// its bits follow the thread count; whether a core does is OpenBLAS's business, not asserted here.
TEST(Products, LargeProductsAreSplitAndRunOnSeveralThreads) {
  const auto g = meshmuon::cpu::sgemm_tiles(1024, 1024, 1024);
  EXPECT_GE(g.row_parts * g.col_parts, 8);
  EXPECT_GE(meshmuon::cpu::ssyrk_blocks(1024, 1024), 4);
  EXPECT_EQ(meshmuon::cpu::sgemm_tiles(32, 32, 32).row_parts * meshmuon::cpu::sgemm_tiles(32, 32, 32).col_parts, 1);
  // The grid is a function of the sizes only.
  ThreadsGuard guard;
  meshmuon::blas_set_num_threads(1);
  const auto one = meshmuon::cpu::sgemm_tiles(768, 3072, 768);
  meshmuon::blas_set_num_threads(4);
  const auto four = meshmuon::cpu::sgemm_tiles(768, 3072, 768);
  EXPECT_EQ(one.row_parts, four.row_parts);
  EXPECT_EQ(one.col_parts, four.col_parts);

  std::mutex mu;
  std::set<std::thread::id> seen;
  std::vector<float> a = normals(1024 * 1024, 71), c(1024 * 1024);
  const TileEpilogue record = [&](int64_t, int64_t, int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the other threads take tiles
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(std::this_thread::get_id());
  };
  meshmuon::blas_set_num_threads(3);
  meshmuon::cpu::sgemm(false, true, 1024, 1024, 1024, 1.0f, a.data(), 1024, a.data(), 1024, 0.0f, c.data(), 1024, &record);
  EXPECT_GE(seen.size(), 2u);
}

TEST(Products, TheBlasItselfRunsOnOneThread) {
  // meshmuon pins OpenBLAS to one thread and restores that if someone changed it.
  const auto& api = meshmuon::cpu::blas();
  if (api.get_num_threads == nullptr) GTEST_SKIP() << "not OpenBLAS: " << api.library;
  EXPECT_EQ(api.get_num_threads(), 1);
  api.set_num_threads(2);
  std::vector<float> a = normals(256 * 256, 81), c(256 * 256);
  meshmuon::cpu::sgemm(false, false, 256, 256, 256, 1.0f, a.data(), 256, a.data(), 256, 0.0f, c.data(), 256);
  EXPECT_EQ(api.get_num_threads(), 1);
}

TEST(ParallelFor, RunsEveryIndexOnceOnAnyThreadCount) {
  for (int threads : {1, 2, 5}) {
    for (int64_t count : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
      meshmuon::detail::parallel_for(count, threads, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << threads << " threads, index " << i;
    }
  }
  EXPECT_GE(meshmuon::detail::parallel_pool_workers(), 1);
}

TEST(ParallelFor, RethrowsTheFirstErrorAfterTheOthersFinished) {
  std::atomic<int> ran{0};
  EXPECT_THROW(meshmuon::detail::parallel_for(64, 3,
                                           [&](int64_t i) {
                                             ran++;
                                             if (i == 5) throw std::runtime_error("tile 5");
                                           }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 6);
  // The pool is still usable after a throw.
  std::atomic<int> after{0};
  meshmuon::detail::parallel_for(10, 3, [&](int64_t) { after++; });
  EXPECT_EQ(after.load(), 10);
}

TEST(ParallelFor, ConcurrentCallersAndNestedCallsFinish) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      meshmuon::detail::parallel_for(50, 3, [&](int64_t) {
        meshmuon::detail::parallel_for(4, 2, [&](int64_t) { total++; });
      });
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4 * 50 * 4);
}

}  // namespace
