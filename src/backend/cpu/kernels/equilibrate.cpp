// MuonEq row equilibration (before Newton–Schulz) and Muon+ renormalization (after), the two
// scalings around the polar iteration that NsOptions::muon_eq / muon_plus switch on, and the
// reproducible Frobenius norm they and the normalization share. Every norm is accumulated in double
// in an order fixed by the sizes alone (8 interleaved partial sums per row, rows summed in order),
// so the results are bitwise the same on every thread count; scales are rounded once to fp32 and
// each element is one fp32 product.
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels/ns_kernels.h"
#include "backend/cpu/kernels/products.h"

namespace meshmuon::cpu {
namespace {

// Σ x² over `count` values in double: 8 interleaved partial sums, combined pairwise.
double sum_squares(const float* x, int64_t count) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (; i < count; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

double frobenius_norm(const float* x, int64_t count) { return std::sqrt(sum_squares(x, count)); }

void muon_eq_rows(const float* in, float* out, int64_t m, int64_t n, std::vector<double>& row_sq) {
  row_sq.resize(static_cast<size_t>(m));
  parallel_rows(m, n, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) row_sq[static_cast<size_t>(i)] = sum_squares(in + i * n, n);
  });
  double total = 0;
  for (int64_t i = 0; i < m; ++i) total += row_sq[static_cast<size_t>(i)];
  const double target = std::sqrt(total) / std::sqrt(static_cast<double>(m));  // the RMS row norm
  parallel_rows(m, n, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const double norm = std::max(std::sqrt(row_sq[static_cast<size_t>(i)]), kMuonEqMinRowNorm);
      const float s = static_cast<float>(target / norm);
      for (int64_t j = i * n; j < (i + 1) * n; ++j) out[j] = in[j] * s;
    }
  });
}

void muon_plus(float* x, int64_t m, int64_t n) {
  const double norm = std::max(frobenius_norm(x, m * n), kMuonPlusMinNorm);
  const float s = static_cast<float>(std::sqrt(static_cast<double>(std::min(m, n))) / norm);
  parallel_rows(m, n, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * n; i < r1 * n; ++i) x[i] *= s;
  });
}

}  // namespace meshmuon::cpu
