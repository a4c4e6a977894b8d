// MuonEq row equilibration and Muon+ renormalization (NsOptions::muon_eq / muon_plus, nanochat's
// order MuonEq -> normalize -> Newton–Schulz -> Muon+): the fp32 Orthogonalizer against a float64
// reference of the same formula with the same coefficients; MuonEq's effect on ill-conditioned rows
// (with a negative control); Muon+'s norm; zeros; determinism; validation.
// Run: build/bin/muon_eq_plus_test   (about a second)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "meshmuon/blas.h"
#include "meshmuon/optim_options.h"
#include "meshmuon/orthogonalize.h"
#include "test_support.h"

namespace {

using meshmuon::Coefficients;
using meshmuon::EpsMode;
using meshmuon::NsMethod;
using meshmuon::NsOptions;
using meshmuon::Orthogonalizer;
using meshmuon::Schedule;
using meshmuon::test::randn;

// nanochat's settings: Polar Express, 5 steps, X / (‖X‖·1.01 + 1e-6).
NsOptions nanochat_ns(bool eq, bool plus) {
  NsOptions o;
  o.schedule = Schedule::PolarExpress, o.steps = 5, o.scale = 1.01f, o.eps = 1e-6f, o.eps_mode = EpsMode::Add;
  o.muon_eq = eq, o.muon_plus = plus;
  return o;
}

double frob(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

// C = A·B for row-major A (r×k) and B (k×c), in double.
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int r, int k, int c) {
  std::vector<double> out(size_t(r) * c, 0.0);
  for (int i = 0; i < r; ++i)
    for (int p = 0; p < k; ++p)
      for (int j = 0; j < c; ++j) out[size_t(i) * c + j] += a[size_t(i) * k + p] * b[size_t(p) * c + j];
  return out;
}

std::vector<double> transpose(const std::vector<double>& a, int r, int c) {
  std::vector<double> t(a.size());
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < c; ++j) t[size_t(j) * r + i] = a[size_t(i) * c + j];
  return t;
}

// The whole formula in double, written plainly from nanochat's muon_step_fused: MuonEq, X / (‖X‖·s
// + eps), per step A = X·Xᵀ (wide) or Xᵀ·X (tall), X ← a·X + (b·A + c·A²)·X (or X·(b·A + c·A²)),
// then Muon+.
std::vector<double> reference(const std::vector<float>& in, int m, int n, const NsOptions& o,
                              const std::vector<Coefficients>& coefficients) {
  std::vector<double> x(in.begin(), in.end());
  if (o.muon_eq) {
    const double target = frob(x) / std::sqrt(double(m));
    for (int i = 0; i < m; ++i) {
      double rs = 0;
      for (int j = 0; j < n; ++j) rs += x[size_t(i) * n + j] * x[size_t(i) * n + j];
      const double s = target / std::max(std::sqrt(rs), 1e-6);
      for (int j = 0; j < n; ++j) x[size_t(i) * n + j] *= s;
    }
  }
  const double d = frob(x) * o.scale + o.eps;
  for (double& v : x) v /= d;
  const bool wide = m <= n;
  const int s = std::min(m, n);
  for (const Coefficients& k : coefficients) {
    const std::vector<double> xt = transpose(x, m, n);
    const std::vector<double> a = wide ? matmul(x, xt, m, n, m) : matmul(xt, x, n, m, n);
    std::vector<double> z = matmul(a, a, s, s, s);
    for (size_t i = 0; i < z.size(); ++i) z[i] = k.b * a[i] + k.c * z[i];
    const std::vector<double> zx = wide ? matmul(z, x, m, m, n) : matmul(x, z, m, n, n);
    for (size_t i = 0; i < x.size(); ++i) x[i] = k.a * x[i] + zx[i];
  }
  if (o.muon_plus) {
    const double f = std::sqrt(double(s)) / std::max(frob(x), 1e-6);
    for (double& v : x) v *= f;
  }
  return x;
}

// ‖a − b‖_F / ‖b‖_F.
double rel_dist(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]), r += b[i] * b[i];
  return std::sqrt(d / r);
}
double rel_dist(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_dist(a, std::vector<double>(b.begin(), b.end()));
}

std::vector<float> run(const NsOptions& o, const std::vector<float>& in, int m, int n) {
  Orthogonalizer orth(o);
  std::vector<float> out(in.size());
  orth.run(in.data(), out.data(), m, n);
  return out;
}

// Gaussian rows whose norms span 10⁻³..10³ (row i scaled by 10^(−3 + 6i/(m−1))): an update whose
// rows differ in scale by a factor of 10⁶, so without MuonEq the large rows dominate the polar
// factor's spectrum.
std::vector<float> ill_conditioned_rows(int m, int n, uint32_t seed) {
  std::vector<float> g = randn(size_t(m) * n, seed);
  for (int i = 0; i < m; ++i) {
    const float s = static_cast<float>(std::pow(10.0, -3.0 + 6.0 * i / std::max(m - 1, 1)));
    for (int j = 0; j < n; ++j) g[size_t(i) * n + j] *= s;
  }
  return g;
}

// Tolerance of the fp32 result against the float64 reference (relative, Frobenius): the fp32
// Newton–Schulz alone (both scalings off) measures 2.1e-6 .. 4.7e-6 on these shapes, because every
// product rounds to fp32 (u = 6e-8, sums over <= 96 terms) and Polar Express's first steps amplify
// the input's rounding by their slope (a ≈ 8 near σ = 0). MuonEq and Muon+ add one fp32 rounding per
// element each; with them the largest measured is 7.3e-6 (8x96, MuonEq: its better conditioned input
// keeps more small singular values in the amplified range). 2e-5 leaves a margin of ~3x; a wrong
// formula (MuonEq or Muon+ missing or on another norm) is off by > 1e-3 (ReferenceCheckCanFail).
// MESHMUON_TEST_VERBOSE=1 prints the measured distances.
constexpr double kRefTol = 2e-5;

TEST(MuonEqPlus, MatchesTheFloat64ReferenceOfNanochatsFormula) {
  struct Shape { int m, n; };
  for (const Shape sh : {Shape{24, 40}, Shape{40, 24}, Shape{32, 32}, Shape{8, 96}})
    for (bool eq : {false, true})
      for (bool plus : {false, true})
        for (NsMethod method : {NsMethod::Symmetric, NsMethod::Plain, NsMethod::Gram}) {
          NsOptions o = nanochat_ns(eq, plus);
          o.method = method;
          const std::vector<float> g = randn(size_t(sh.m) * sh.n, 7 + sh.m);
          const Orthogonalizer orth(o);
          const std::vector<double> want = reference(g, sh.m, sh.n, o, orth.coefficients());
          const double d = rel_dist(run(o, g, sh.m, sh.n), want);
          if (std::getenv("MESHMUON_TEST_VERBOSE"))
            std::printf("%dx%d eq %d plus %d %s: %.2e\n", sh.m, sh.n, eq, plus, std::string(to_string(method)).c_str(), d);
          EXPECT_LE(d, kRefTol) << sh.m << "x" << sh.n << " muon_eq " << eq << " muon_plus " << plus << " method "
                                << to_string(method);
        }
}

TEST(MuonEqPlus, ReferenceCheckCanFail) {
  // The comparison above is not vacuous: the reference with one option flipped is far from the
  // fp32 result (both on ill-conditioned rows, where MuonEq matters, and on Gaussian input for Muon+).
  const int m = 24, n = 40;
  const std::vector<float> g = ill_conditioned_rows(m, n, 3);
  const NsOptions on = nanochat_ns(true, true);
  const Orthogonalizer orth(on);
  const std::vector<float> got = run(on, g, m, n);
  EXPECT_LE(rel_dist(got, reference(g, m, n, on, orth.coefficients())), kRefTol);
  EXPECT_GT(rel_dist(got, reference(g, m, n, nanochat_ns(false, true), orth.coefficients())), 1e-2);
  EXPECT_GT(rel_dist(got, reference(g, m, n, nanochat_ns(true, false), orth.coefficients())), 1e-3);
}

TEST(MuonEqPlus, MuonEqChangesTheResultOnIllConditionedRows) {
  for (const auto& [m, n] : {std::pair{32, 64}, std::pair{64, 32}}) {
    const std::vector<float> g = ill_conditioned_rows(m, n, 11);
    const NsOptions on = nanochat_ns(true, false), off = nanochat_ns(false, false);
    const Orthogonalizer orth(on);
    const std::vector<float> with = run(on, g, m, n), without = run(off, g, m, n);
    // Each matches its own reference, and they differ by far more than that tolerance.
    EXPECT_LE(rel_dist(with, reference(g, m, n, on, orth.coefficients())), kRefTol);
    EXPECT_LE(rel_dist(without, reference(g, m, n, off, orth.coefficients())), kRefTol);
    EXPECT_GT(rel_dist(with, without), 0.1) << m << "x" << n;
    // What MuonEq is for: the small rows get an update of their own size. Row norms of the result
    // with MuonEq stay within a factor of a few of each other; without it the smallest rows' update
    // is ~0 (their share of the spectrum is 10⁻⁶ of the largest).
    auto row_norm_ratio = [&](const std::vector<float>& u) {
      double lo = 1e300, hi = 0;
      for (int i = 0; i < m; ++i) {
        double s = 0;
        for (int j = 0; j < n; ++j) s += double(u[size_t(i) * n + j]) * u[size_t(i) * n + j];
        lo = std::min(lo, std::sqrt(s)), hi = std::max(hi, std::sqrt(s));
      }
      return lo / hi;
    };
    if (std::getenv("MESHMUON_TEST_VERBOSE"))
      std::printf("%dx%d: with/without %.3f, row norm ratio with %.3f without %.2e\n", m, n, rel_dist(with, without),
                  row_norm_ratio(with), row_norm_ratio(without));
    EXPECT_GT(row_norm_ratio(with), 0.2) << m << "x" << n;
    EXPECT_LT(row_norm_ratio(without), 1e-2) << m << "x" << n;
  }
}

TEST(MuonEqPlus, MuonEqGivesEveryRowTheRmsRowNorm) {
  // With Newton–Schulz the identity (one custom step a = 1, b = c = 0) the output is the equilibrated
  // input normalized: every row has norm 1/√m (relative 1e-6: one fp32 rounding per element plus the
  // normalization's); without MuonEq the rows keep their spread (negative control).
  const int m = 16, n = 40;
  const std::vector<float> g = ill_conditioned_rows(m, n, 5);
  for (bool eq : {true, false}) {
    NsOptions o;
    o.schedule = Schedule::Custom, o.steps = 1, o.custom = {{1, 0, 0}}, o.eps = 0, o.muon_eq = eq;
    const std::vector<float> u = run(o, g, m, n);
    double lo = 1e300, hi = 0;
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += double(u[size_t(i) * n + j]) * u[size_t(i) * n + j];
      lo = std::min(lo, std::sqrt(s)), hi = std::max(hi, std::sqrt(s));
    }
    if (eq) {
      EXPECT_NEAR(lo * std::sqrt(double(m)), 1.0, 1e-6);
      EXPECT_NEAR(hi * std::sqrt(double(m)), 1.0, 1e-6);
    } else {
      EXPECT_LT(lo / hi, 1e-5);
    }
  }
}

TEST(MuonEqPlus, MuonPlusGivesTheSemiOrthogonalNorm) {
  // ‖U‖_F = √min(m, n) to fp32 rounding (relative 1e-6: the scale and each element rounded once),
  // for every method, fp32 and bf16 products, wide, tall and square, and each matrix of a batch.
  struct Case { int m, n; NsMethod method; meshmuon::DType dtype; };
  const Case cases[] = {{24, 40, NsMethod::Symmetric, meshmuon::DType::F32}, {40, 24, NsMethod::Plain, meshmuon::DType::F32},
                        {32, 96, NsMethod::Gram, meshmuon::DType::F32},      {32, 32, NsMethod::Symmetric, meshmuon::DType::F32},
                        {24, 40, NsMethod::Symmetric, meshmuon::DType::BF16}, {40, 24, NsMethod::Plain, meshmuon::DType::BF16}};
  for (const Case& c : cases) {
    for (bool plus : {true, false}) {
      NsOptions o = nanochat_ns(true, plus);
      o.method = c.method, o.matmul_dtype = c.dtype;
      Orthogonalizer orth(o);
      const int batch = 3;
      const std::vector<float> g = randn(size_t(batch) * c.m * c.n, 21);
      std::vector<float> u(g.size());
      orth.run(meshmuon::TensorView(const_cast<float*>(g.data()), meshmuon::DType::F32, meshmuon::Shape{batch, c.m, c.n}),
               meshmuon::TensorView(u.data(), meshmuon::DType::F32, meshmuon::Shape{batch, c.m, c.n}));
      for (int b = 0; b < batch; ++b) {
        double s = 0;
        for (size_t i = size_t(b) * c.m * c.n; i < size_t(b + 1) * c.m * c.n; ++i) s += double(u[i]) * u[i];
        const double rel = std::sqrt(s) / std::sqrt(double(std::min(c.m, c.n))) - 1.0;
        const std::string what = std::to_string(c.m) + "x" + std::to_string(c.n) + " " +
                                 std::string(to_string(c.method)) + " " + std::string(to_string(c.dtype));
        if (plus)
          EXPECT_LE(std::fabs(rel), 1e-6) << what << " matrix " << b;
        else  // negative control: Polar Express alone leaves the norm off √min(m, n) by far more
          EXPECT_GT(std::fabs(rel), 1e-4) << what << " matrix " << b;
      }
    }
  }
}

TEST(MuonEqPlus, ZerosStayZeros) {
  // An all-zero matrix gives zeros; a zero row under MuonEq stays zero (its norm is clamped to
  // 1e-6), and the other rows are finite.
  const int m = 8, n = 12;
  const NsOptions o = nanochat_ns(true, true);
  std::vector<float> u = run(o, std::vector<float>(size_t(m) * n, 0.0f), m, n);
  for (float v : u) EXPECT_EQ(v, 0.0f);
  std::vector<float> g = randn(size_t(m) * n, 4);
  std::fill(g.begin() + 2 * n, g.begin() + 3 * n, 0.0f);
  u = run(o, g, m, n);
  for (int j = 0; j < n; ++j) EXPECT_EQ(u[size_t(2) * n + j], 0.0f);
  for (float v : u) EXPECT_TRUE(std::isfinite(v));
}

TEST(MuonEqPlus, BitwiseOnEveryThreadCountInPlaceAndInABatch) {
  const int saved = meshmuon::blas_get_num_threads();
  const NsOptions o = nanochat_ns(true, true);
  for (const auto& [m, n] : {std::pair{96, 160}, std::pair{160, 96}}) {
    const std::vector<float> g = ill_conditioned_rows(m, n, 9);
    meshmuon::blas_set_num_threads(1);
    const std::vector<float> one = run(o, g, m, n);
    for (int threads : {2, 3}) {
      meshmuon::blas_set_num_threads(threads);
      EXPECT_EQ(run(o, g, m, n), one) << m << "x" << n << " on " << threads << " threads";
    }
    Orthogonalizer orth(o);
    std::vector<float> in_place = g;
    orth.run(in_place.data(), in_place.data(), m, n);
    EXPECT_EQ(in_place, one) << "in place";
    std::vector<float> two(2 * g.size()), out(two.size());
    std::copy(g.begin(), g.end(), two.begin());
    std::copy(g.begin(), g.end(), two.begin() + static_cast<std::ptrdiff_t>(g.size()));
    orth.run(meshmuon::TensorView(two.data(), meshmuon::DType::F32, meshmuon::Shape{2, m, n}),
             meshmuon::TensorView(out.data(), meshmuon::DType::F32, meshmuon::Shape{2, m, n}));
    EXPECT_TRUE(std::equal(one.begin(), one.end(), out.begin()));
    EXPECT_TRUE(std::equal(one.begin(), one.end(), out.begin() + static_cast<std::ptrdiff_t>(g.size())));
  }
  meshmuon::blas_set_num_threads(saved);
}

TEST(MuonEqPlus, ValidationNamesTheOption) {
  for (const char* which : {"muon_eq", "muon_plus"}) {
    NsOptions o;
    o.bf16_rounding = true;
    EXPECT_NO_THROW(Orthogonalizer{o});  // negative control: bf16_rounding alone is fine
    (std::string(which) == "muon_eq" ? o.muon_eq : o.muon_plus) = true;
    meshmuon::test::expect_invalid([&] { Orthogonalizer orth(o); }, std::string(which) + " is not combined with bf16_rounding",
                                "[orth]");
    meshmuon::GroupOptions g;
    g.ns = o;
    meshmuon::test::expect_invalid([&] { meshmuon::validate_group_options(g, 2); }, which, "[optim] group 2: ns options");
  }
  meshmuon::GroupOptions g;
  g.decay_lr = static_cast<meshmuon::DecayLr>(5);
  meshmuon::test::expect_invalid([&] { meshmuon::validate_group_options(g, 1); }, "decay_lr", "[optim] group 1");
  g.decay_lr = meshmuon::DecayLr::Adjusted;
  EXPECT_NO_THROW(meshmuon::validate_group_options(g, 1));
}

}  // namespace
