// Internal: per-matrix Muon math shared by LocalOptimizer and the distributed executor.
#include "exec/muon_math.h"

#include <cmath>
#include <vector>

#include "dmuon/bf16.h"
#include "dmuon/optimizer.h"
#include "dmuon/update.h"

namespace dmuon::detail {

void round_to_comm(float* x, int64_t n, DType comm) {
  if (comm == DType::F32) return;
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

void muon_unit(Orthogonalizer& orth, float* u, int64_t rows, int64_t cols, float* v, float* v_mean,
               double beta2, DType comm) {
  if (rows == 0 || cols == 0) return;
  orth.run(u, u, rows, cols);
  if (v != nullptr) {
    normuon_mean_square(u, rows, cols, v_mean);
    normuon_finish(u, rows, cols, v_mean, v, beta2);
  }
  round_to_comm(u, rows * cols, comm);
}

int64_t first_non_finite(const TensorView& g) {
  const int64_t n = g.numel();
  if (g.dtype == DType::BF16) {  // exponent all ones: inf or NaN
    const BFloat16* x = static_cast<const BFloat16*>(g.data);
    for (int64_t i = 0; i < n; ++i)
      if ((x[i].bits & 0x7F80u) == 0x7F80u) return i;
    return -1;
  }
  const float* x = static_cast<const float*>(g.data);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

}  // namespace dmuon::detail
