// Gram Newton–Schulz (after Dao AI Lab, 2025), derived here for the wide case X (m×n, m ≤ n):
// with X_t = Q_t·X₀ and R_t = X_t·X_tᵀ, a step with Z_t = aI + bR_t + cR_t² gives
//   X_{t+1} = Z_t·X_t  =>  Q_{t+1} = Z_t·Q_t,   R_{t+1} = Z_t·R_t·Z_tᵀ = Z_t²·R_t
// (Z_t is a polynomial in R_t, so the two commute). Every step is m×m work; X is multiplied only at
// the restart and at the end. Tall matrices use the mirror image (X_t = X₀·Q_t, R = XᵀX).
#include <algorithm>
#include <utility>

#include "backend/cpu/kernels/products.h"
#include "backend/cpu/kernels/ns_kernels.h"

namespace meshmuon::cpu {

void gram_newton_schulz(float* x0, float* out, int64_t m, int64_t n,
                        const std::vector<Coefficients>& coefficients, NsScratch& scratch) {
  const int s = static_cast<int>(std::min(m, n));
  const int64_t ss = static_cast<int64_t>(s) * s;
  float* r = scratch.ensure(scratch.r, ss);
  float* sq = scratch.ensure(scratch.s, ss);
  float* z = scratch.ensure(scratch.z, ss);
  float* q = scratch.ensure(scratch.q, ss);
  float* t = scratch.ensure(scratch.t, ss);
  float* x = x0;
  gram(x, m, n, /*symmetric=*/true, 1.0f, r);
  bool q_identity = true;
  const int steps = static_cast<int>(coefficients.size());
  for (int step = 0; step < steps; ++step) {
    // pass 1: Z = aI + bR + cR² (R² by SYRK since R is symmetric).
    ssyrk_lower(false, s, s, 1.0f, r, s, 0.0f, sq, s);
    gram_polynomial(coefficients[static_cast<size_t>(step)], r, sq, z, s);
    // pass 2: Q ← Z·Q (just Z while Q = I).
    const float* zcur = z;
    if (q_identity) {
      std::swap(q, z);
      zcur = q;
    } else {
      sgemm(false, false, s, s, s, 1.0f, z, s, q, s, 0.0f, t, s);
      std::swap(q, t);
    }
    q_identity = false;
    if (step == steps - 1) break;
    if (step == kGramRestartStep) {
      // pass 3a (restart): X ← Q·X₀ explicitly, R from it, Q = I; drops the error R accumulated.
      float* dst = (x == out) ? scratch.ensure(scratch.x, m * n) : out;
      apply_left_factor(q, x, dst, m, n);
      x = dst;
      gram(x, m, n, /*symmetric=*/true, 1.0f, r);
      q_identity = true;
    } else {
      // pass 3b: R ← Z²·R; Z² by SYRK (Z symmetric), the product by SSYMM reading Z²'s lower
      // triangle (as fast as SGEMM at s×s, measured, and no mirror pass); the exactly symmetric R
      // the next SYRK needs is restored from the lower triangle.
      ssyrk_lower(false, s, s, 1.0f, zcur, s, 0.0f, sq, s);
      ssymm_lower(true, s, s, 1.0f, sq, s, r, s, 0.0f, t, s);
      symmetrize_lower(t, s);
      std::swap(r, t);
    }
  }
  // pass 4: X = Q·X₀ into out. The caller puts X₀ in `out` when a restart happens (it moves X to
  // scratch.x) and in scratch.x otherwise, so this product never reads what it writes.
  apply_left_factor(q, x, out, m, n);
}

}  // namespace meshmuon::cpu
