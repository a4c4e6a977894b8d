// The test-only method (test_method.h): one table entry, nothing else.
#include "test_method.h"

#include <atomic>
#include <vector>

#include "backend/cpu/kernels/ns_methods.h"

namespace meshmuon::conformance {
namespace {

std::atomic<uint64_t> g_runs{0};

// X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ (wide; tall on XᵀX), each product in double.
void double_products_ns(float* x0, float* out, int64_t m, int64_t n, const std::vector<Coefficients>& k,
                        cpu::NsScratch&) {
  g_runs.fetch_add(1, std::memory_order_relaxed);
  const bool wide = m <= n;
  const int64_t s = wide ? m : n, l = wide ? n : m;
  auto at = [&](const std::vector<double>& x, int64_t i, int64_t j) { return wide ? x[static_cast<size_t>(i * n + j)] : x[static_cast<size_t>(j * n + i)]; };
  std::vector<double> x(x0, x0 + m * n), a(static_cast<size_t>(s * s)), z(static_cast<size_t>(s * s)), nx(static_cast<size_t>(m * n));
  for (const Coefficients& c : k) {
    for (int64_t i = 0; i < s; ++i)  // A = X·Xᵀ on the Gram side (x as s × l)
      for (int64_t j = 0; j < s; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < l; ++t) acc += at(x, i, t) * at(x, j, t);
        a[static_cast<size_t>(i * s + j)] = double(float(acc));
      }
    for (int64_t i = 0; i < s; ++i)  // Z = b·A + c·A²
      for (int64_t j = 0; j < s; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < s; ++t) acc += a[static_cast<size_t>(i * s + t)] * a[static_cast<size_t>(t * s + j)];
        z[static_cast<size_t>(i * s + j)] = double(float(c.b * a[static_cast<size_t>(i * s + j)] + c.c * double(float(acc))));
      }
    for (int64_t i = 0; i < s; ++i)  // X ← a·X + Z·X
      for (int64_t j = 0; j < l; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < s; ++t) acc += z[static_cast<size_t>(i * s + t)] * at(x, t, j);
        const double v = double(float(c.a * at(x, i, j) + acc));
        (wide ? nx[static_cast<size_t>(i * n + j)] : nx[static_cast<size_t>(j * n + i)]) = v;
      }
    x.swap(nx);
  }
  for (int64_t i = 0; i < m * n; ++i) out[i] = float(x[static_cast<size_t>(i)]);
}

bool in_place(int64_t, int64_t, int) { return false; }
double flops(double s, double l, int steps) { return steps * (4 * s * s * l + 2 * s * s * s); }

}  // namespace

NsMethod test_method() {
  static const NsMethod id = cpu::register_ns_method(
      {kTestMethodName, "Newton-Schulz with double-accumulated products (a test-only method)", double_products_ns,
       in_place, false, std::string("[orth] method ") + kTestMethodName + " has no bf16 products; use matmul_dtype fp32",
       flops});
  return id;
}

uint64_t test_method_runs() { return g_runs.load(); }

}  // namespace meshmuon::conformance
