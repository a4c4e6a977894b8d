// Polar Express coefficients for any step count: greedy minimax odd quintics found by a Remez
// exchange (Amsel, Persson, Musco, Gower, arXiv 2505.16932; construction in REFERENCE.md section 1).
#include <cmath>
#include <limits>

#include "meshmuon/error.h"
#include "meshmuon/orthogonalize.h"

namespace meshmuon {
namespace {

// long double (x87 extended on x86-64) keeps the 4x4 solves and the composition well inside the
// 1e-12 agreement with the published double-precision lists.
using Real = long double;

struct Quintic {
  Real a, b, c;
  Real operator()(Real x) const { return x * (a + x * x * (b + c * x * x)); }
};

// Solves M·v = rhs (4x4) by Gaussian elimination with partial pivoting.
void solve4(Real m[4][4], Real rhs[4], Real v[4]) {
  for (int col = 0; col < 4; ++col) {
    int piv = col;
    for (int r = col + 1; r < 4; ++r)
      if (std::fabs(m[r][col]) > std::fabs(m[piv][col])) piv = r;
    if (piv != col) {
      for (int k = 0; k < 4; ++k) std::swap(m[col][k], m[piv][k]);
      std::swap(rhs[col], rhs[piv]);
    }
    for (int r = col + 1; r < 4; ++r) {
      const Real f = m[r][col] / m[col][col];
      for (int k = col; k < 4; ++k) m[r][k] -= f * m[col][k];
      rhs[r] -= f * rhs[col];
    }
  }
  for (int r = 3; r >= 0; --r) {
    Real s = rhs[r];
    for (int k = r + 1; k < 4; ++k) s -= m[r][k] * v[k];
    v[r] = s / m[r][r];
  }
}

// The odd quintic minimizing max over [l, u] of |1 − p(x)|: Remez exchange on {l, q, r, u}.
Quintic optimal_quintic(Real l, Real u) {
  if (l / u >= 1 - 5e-6L) return {Real(15) / 8 / u, Real(-10) / 8 / (u * u * u),
                                  Real(3) / 8 / (u * u * u * u * u)};
  Real q = (3 * l + u) / 4, r = (l + 3 * u) / 4;  // exact as l -> u
  Quintic p{0, 0, 0};
  Real e = std::numeric_limits<Real>::infinity();
  for (int iter = 0; iter < 200; ++iter) {
    const Real xs[4] = {l, q, r, u};
    Real m[4][4], rhs[4] = {1, 1, 1, 1}, v[4];
    for (int i = 0; i < 4; ++i) {
      const Real x = xs[i];
      m[i][0] = x;
      m[i][1] = x * x * x;
      m[i][2] = x * x * x * x * x;
      m[i][3] = (i % 2 == 0) ? 1 : -1;  // alternating error signs
    }
    solve4(m, rhs, v);
    p = {v[0], v[1], v[2]};
    const Real old_e = e;
    e = v[3];
    // Interior extrema of p: roots of p'(x) = a + 3b x² + 5c x⁴.
    const Real disc = std::sqrt(9 * p.b * p.b - 20 * p.a * p.c);
    q = std::sqrt((-3 * p.b - disc) / (10 * p.c));
    r = std::sqrt((-3 * p.b + disc) / (10 * p.c));
    if (std::fabs(old_e - e) <= 1e-15L) break;
  }
  return p;
}

}  // namespace

std::vector<Coefficients> polar_express_coefficients(int steps, double l0, double safety,
                                                     double cushion) {
  MESHMUON_CHECK(steps >= 1, "[orth] polar_express steps must be >= 1, got ", steps);
  MESHMUON_CHECK(std::isfinite(l0) && l0 > 0 && l0 <= 1,
              "[orth] polar_express l0 (smallest singular value to map) must be in (0, 1], got ", l0);
  MESHMUON_CHECK(std::isfinite(safety) && safety >= 0 && safety < 1,
              "[orth] polar_express safety must be in [0, 1), got ", safety);
  MESHMUON_CHECK(std::isfinite(cushion) && cushion >= 0 && cushion < 1,
              "[orth] polar_express cushion must be in [0, 1), got ", cushion);
  std::vector<Coefficients> out;
  Real l = l0, u = 1;
  const Real f = 1 + static_cast<Real>(safety);
  for (int t = 0; t < steps; ++t) {
    Quintic p = optimal_quintic(std::max(l, cushion * u), u);
    if (cushion * u > l) {  // the cushion moved the left end: re-centre p over the true interval
      const Real s = 2 / (p(l) + p(u));
      p = {p.a * s, p.b * s, p.c * s};
    }
    // The safety factor shrinks the input a little (p(x/f)) so fp32 rounding cannot push a singular
    // value past the top of the interval; the last step needs no margin.
    if (t != steps - 1) p = {p.a / f, p.b / (f * f * f), p.c / (f * f * f * f * f)};
    out.push_back({static_cast<double>(p.a), static_cast<double>(p.b), static_cast<double>(p.c)});
    l = p(l);
    u = 2 - l;
    l = std::min(l, u);
  }
  return out;
}

}  // namespace meshmuon
