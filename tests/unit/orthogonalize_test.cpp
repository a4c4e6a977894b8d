// Orthogonalization: every schedule × method × shape against the exact polar factor from LAPACK SVD
// (double), plus zeros, batches, aliasing, determinism and argument errors.
// Run: build/bin/orthogonalize_test   (a few seconds on one core)
#include <gtest/gtest.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "meshmuon/bf16.h"
#include "meshmuon/blas.h"
#include "meshmuon/error.h"
#include "meshmuon/orthogonalize.h"
#include "backend/cpu/kernels/bf16_matmul.h"
#include "backend/cpu/kernels/bf16_products.h"
#include "test_support.h"

namespace {

template <class F>
void expect_orth_invalid(F&& f, const std::string& needle) {
  meshmuon::test::expect_invalid(f, needle, "[orth]");
}

using meshmuon::Coefficients;
using meshmuon::NsMethod;
using meshmuon::NsOptions;
using meshmuon::Orthogonalizer;
using meshmuon::Schedule;

struct Svd {
  std::vector<double> u, s, vt;  // thin: u m×r, s r, vt r×n (r = min(m, n))
};

Svd svd(std::vector<double> a, int m, int n) {
  const int r = std::min(m, n);
  Svd out{std::vector<double>(size_t(m) * r), std::vector<double>(size_t(r)),
          std::vector<double>(size_t(r) * n)};
  std::vector<double> superb(size_t(std::max(r, 2)));
  const int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'S', 'S', m, n, a.data(), n, out.s.data(),
                                  out.u.data(), r, out.vt.data(), n, superb.data());
  EXPECT_EQ(info, 0);
  return out;
}

// An fp32 m×n matrix with `rank` singular values spread over [1, 4] and random singular vectors.
std::vector<float> make_input(int m, int n, int rank, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> g(size_t(m) * n);
  for (double& v : g) v = normal(rng);
  const Svd base = svd(g, m, n);
  const int r = std::min(m, n);
  std::vector<float> out(g.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double v = 0;
      for (int k = 0; k < rank; ++k)
        v += base.u[size_t(i) * r + k] * (1.0 + 3.0 * k / std::max(rank - 1, 1)) * base.vt[size_t(k) * n + j];
      out[size_t(i) * n + j] = static_cast<float>(v);
    }
  return out;
}

double compose(const std::vector<Coefficients>& cs, double x) {
  for (const Coefficients& c : cs) x = c.a * x + c.b * x * x * x + c.c * x * x * x * x * x;
  return x;
}

// What the output of orthogonalizing `in` should be, computed in double from the exact SVD, and how
// far the fp32 result `out` is from it.
struct Check {
  double sigma_err = 0;       // max |σ_i(out) − f(σ_i(in)/norm)| over the `rank` leading values
  double sigma_lo = 1e300, sigma_hi = 0;  // range of those output σ
  double band_lo = 1e300, band_hi = 0;    // f over [min, max] of the normalized input σ (sampled)
  double null_max = 0;        // largest output σ beyond `rank` (directions where G is zero)
  double vector_err = 0;      // ‖out − U f(Σ) Vᵀ‖_F / √rank
  double polar_dist = 0;      // ‖out − U Vᵀ‖_F / ‖U Vᵀ‖_F over the `rank` directions
  double tol = 0;             // fp32 tolerance on σ: 5e-4 plus 1e-6 (input rounding) × |f'(σ)|
};

Check check(const std::vector<float>& in, const std::vector<float>& out, int m, int n, int rank,
            const Orthogonalizer& orth) {
  const NsOptions& o = orth.options();
  double ss = 0;
  for (float v : in) ss += double(v) * v;
  const double denom = std::sqrt(ss) * o.scale + o.eps;
  const Svd g = svd(std::vector<double>(in.begin(), in.end()), m, n);
  const Svd x = svd(std::vector<double>(out.begin(), out.end()), m, n);
  const int r = std::min(m, n);
  Check c;
  std::vector<double> expect(static_cast<size_t>(rank));
  for (int k = 0; k < rank; ++k) {
    const double sk = g.s[size_t(k)] / denom, h = 1e-7;
    expect[size_t(k)] = compose(orth.coefficients(), sk);
    // Near the top of an unsafeguarded schedule the composition is steep (PE paper raw: f'(1) ~ 7e4).
    const double slope = (compose(orth.coefficients(), sk) - compose(orth.coefficients(), sk - h)) / h;
    c.tol = std::max(c.tol, 5e-4 + 1e-6 * std::fabs(slope));
  }
  std::vector<double> sorted = expect;
  std::sort(sorted.rbegin(), sorted.rend());
  for (int k = 0; k < rank; ++k) {
    c.sigma_err = std::max(c.sigma_err, std::fabs(x.s[size_t(k)] - sorted[size_t(k)]));
    c.sigma_lo = std::min(c.sigma_lo, x.s[size_t(k)]);
    c.sigma_hi = std::max(c.sigma_hi, x.s[size_t(k)]);
  }
  for (int k = rank; k < r; ++k) c.null_max = std::max(c.null_max, x.s[size_t(k)]);
  const double lo = g.s[size_t(rank - 1)] / denom, hi = g.s[0] / denom;
  for (int i = 0; i <= 2000; ++i) {
    const double f = compose(orth.coefficients(), lo + (hi - lo) * i / 2000.0);
    c.band_lo = std::min(c.band_lo, f);
    c.band_hi = std::max(c.band_hi, f);
  }
  double ve = 0, pd = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double fx = 0, uv = 0;
      for (int k = 0; k < rank; ++k) {
        const double p = g.u[size_t(i) * r + k] * g.vt[size_t(k) * n + j];
        fx += expect[size_t(k)] * p;
        uv += p;
      }
      const double o_ij = out[size_t(i) * n + j];
      ve += (o_ij - fx) * (o_ij - fx);
      pd += (o_ij - uv) * (o_ij - uv);
    }
  c.vector_err = std::sqrt(ve / rank);
  c.polar_dist = std::sqrt(pd / rank);
  return c;
}

// Output σ bands for inputs whose normalized σ lie in [0.01, 1] (REFERENCE.md section 1; the exact
// extremes of the composed polynomials, which the table rounds to two digits), and the table's
// relative distance to U·Vᵀ on a Gaussian input.
struct Band {
  double lo, hi, polar;
};
Band reference_band(Schedule s) {
  switch (s) {
    case Schedule::Jordan: return {0.6818, 1.1344, 0.16};
    case Schedule::You: return {0.9777, 1.0318, 0.017};
    case Schedule::PolarExpress: return {0.8588, 1.1412, 0.10};
    case Schedule::Custom: return {0.8764, 1.1236, 0.10};  // the PE paper raw row, given as custom
  }
  return {0, 0, 0};
}

std::vector<Coefficients> pe_paper_raw() {
  return {{8.28721201814563, -23.595886519098837, 17.300387312530933},
          {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
          {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
          {3.3184196573706015, -2.488488024314874, 0.51004894012372},
          {2.300652019954817, -1.6689039845747493, 0.4188073119525673}};
}

NsOptions options_for(Schedule s, NsMethod method) {
  NsOptions o;
  o.schedule = s;
  o.method = method;
  if (s == Schedule::Custom) o.custom = pe_paper_raw();
  return o;
}

struct Case {
  int m, n, rank;
};
// 1×n, n×1, primes, tall, wide (aspect ≥ 2 runs Gram NS), square, rank 1 and rank k < min(m, n).
const Case kCases[] = {{1, 64, 1},  {64, 1, 1},  {37, 53, 37}, {101, 61, 61}, {24, 96, 24},
                       {96, 24, 24}, {48, 48, 48}, {40, 90, 1},  {90, 40, 7},   {29, 71, 11}};

using Param = std::tuple<Schedule, NsMethod, Case>;

class OrthogonalizeAll : public ::testing::TestWithParam<Param> {};

TEST_P(OrthogonalizeAll, MatchesExactPolarFactorInBand) {
  const auto [schedule, method, cs] = GetParam();
  Orthogonalizer orth(options_for(schedule, method));
  const std::vector<float> in = make_input(cs.m, cs.n, cs.rank, 1000u + cs.m * 7u + cs.n);
  std::vector<float> out(in.size());
  orth.run(in.data(), out.data(), cs.m, cs.n);
  const Check c = check(in, out, cs.m, cs.n, cs.rank, orth);
  const Band band = reference_band(schedule);
  // The input's normalized σ lie in [0.01, 1], where the composition stays inside the table's band.
  EXPECT_GE(c.band_lo, band.lo);
  EXPECT_LE(c.band_hi, band.hi);
  EXPECT_GE(c.sigma_lo, c.band_lo - c.tol);
  EXPECT_LE(c.sigma_hi, c.band_hi + c.tol);
  EXPECT_LT(c.sigma_err, c.tol);          // each σ where the scalar polynomial puts it
  EXPECT_LT(c.vector_err, 1.5 * c.tol);   // and the singular vectors those of G
  EXPECT_LT(c.null_max, 1e-3);        // zero directions stay ~0
  // Relative distance to U·Vᵀ: bounded by the band's worst deviation from 1; with a spread spectrum
  // (not rank 1, whose single σ may sit anywhere in the band) the table's Gaussian figure + margin.
  EXPECT_LE(c.polar_dist, std::max(1 - band.lo, band.hi - 1) + c.tol);
  if (cs.rank >= 7) EXPECT_LE(c.polar_dist, band.polar + 0.1);  // a spread spectrum, as in the table
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
}

std::string case_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [s, meth, cs] = info.param;
  return std::string(meshmuon::to_string(s)) + "_" + std::string(meshmuon::to_string(meth)) + "_" +
         std::to_string(cs.m) + "x" + std::to_string(cs.n) + "r" + std::to_string(cs.rank);
}

INSTANTIATE_TEST_SUITE_P(Schedules, OrthogonalizeAll,
                         ::testing::Combine(::testing::Values(Schedule::Jordan, Schedule::You,
                                                              Schedule::PolarExpress, Schedule::Custom),
                                            ::testing::Values(NsMethod::Plain, NsMethod::Symmetric,
                                                              NsMethod::Gram),
                                            ::testing::ValuesIn(kCases)),
                         case_name);

// Negative control: the checker rejects an input that was not orthogonalized, and a result whose
// singular vectors are wrong (rows permuted) although its singular values are right.
TEST(Orthogonalize, CheckerCanFail) {
  Orthogonalizer orth(options_for(Schedule::PolarExpress, NsMethod::Symmetric));
  const int m = 37, n = 53;
  const std::vector<float> in = make_input(m, n, m, 7);
  const Check raw = check(in, in, m, n, m, orth);
  EXPECT_GT(raw.sigma_err, 0.5);
  std::vector<float> out(in.size());
  orth.run(in.data(), out.data(), m, n);
  std::rotate(out.begin(), out.begin() + n, out.end());  // move row 0 to the bottom
  const Check c = check(in, out, m, n, m, orth);
  EXPECT_LT(c.sigma_err, c.tol);
  EXPECT_GT(c.vector_err, 0.5);
}

std::vector<float> run_once(const NsOptions& o, const std::vector<float>& in, int m, int n) {
  Orthogonalizer orth(o);
  std::vector<float> out(in.size());
  orth.run(in.data(), out.data(), m, n);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

const NsMethod kMethods[] = {NsMethod::Plain, NsMethod::Symmetric, NsMethod::Gram};

TEST(Orthogonalize, ZeroMatrixGivesExactZeros) {
  for (NsMethod method : kMethods)
    for (float eps : {0.0f, 1e-7f})
      for (meshmuon::EpsMode mode : {meshmuon::EpsMode::Add, meshmuon::EpsMode::Clamp}) {
        NsOptions o = options_for(Schedule::PolarExpress, method);
        o.eps = eps;
        o.eps_mode = mode;
        const std::vector<float> out = run_once(o, std::vector<float>(24 * 96, 0.0f), 24, 96);
        for (float v : out) ASSERT_EQ(v, 0.0f) << "eps " << eps;
      }
}

TEST(Orthogonalize, BatchEqualsSeparateRunsBitwise) {
  const int b = 3, m = 24, n = 61;  // aspect > 2: Gram NS runs too
  for (NsMethod method : kMethods) {
    Orthogonalizer orth(options_for(Schedule::PolarExpress, method));
    std::vector<float> in;
    for (int i = 0; i < b; ++i) {
      const std::vector<float> one = make_input(m, n, m - i, 50u + i);
      in.insert(in.end(), one.begin(), one.end());
    }
    std::vector<float> out(in.size());
    orth.run(meshmuon::TensorView(in.data(), {b, m, n}), meshmuon::TensorView(out.data(), {b, m, n}));
    for (int i = 0; i < b; ++i) {
      std::vector<float> one(in.begin() + i * m * n, in.begin() + (i + 1) * m * n);
      const std::vector<float> sep = run_once(orth.options(), one, m, n);
      ASSERT_TRUE(std::equal(sep.begin(), sep.end(), out.begin() + i * m * n)) << "matrix " << i;
    }
  }
}

TEST(Orthogonalize, InPlaceEqualsOutOfPlaceAndRepeatsBitwise) {
  // Step counts of both parities and with / without the Gram restart move X₀ between buffers.
  for (NsMethod method : kMethods)
    for (int steps : {1, 2, 3, 4, 5})
      for (auto [m, n] : {std::pair{30, 70}, std::pair{70, 30}, std::pair{192, 160}}) {
        NsOptions o = options_for(Schedule::Jordan, method);
        o.steps = steps;
        const std::vector<float> in = make_input(m, n, std::min(m, n), 3);
        const std::vector<float> a = run_once(o, in, m, n);
        Orthogonalizer orth(o);
        std::vector<float> b(in.size());
        orth.run(in.data(), b.data(), m, n);
        std::vector<float> c(in.size());
        orth.run(in.data(), c.data(), m, n);  // reused workspace
        std::vector<float> inplace = in;
        orth.run(meshmuon::TensorView(inplace.data(), {m, n}), meshmuon::TensorView(inplace.data(), {m, n}));
        ASSERT_EQ(a, b);
        ASSERT_EQ(a, c);
        ASSERT_EQ(a, inplace) << meshmuon::to_string(method) << " steps " << steps;
      }
}

TEST(Orthogonalize, MethodsAgreeAndTallIsTransposeOfWide) {
  const int m = 40, n = 100;
  const std::vector<float> in = make_input(m, n, m, 11);
  std::vector<float> in_t(in.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) in_t[size_t(j) * m + i] = in[size_t(i) * n + j];
  const std::vector<float> ref = run_once(options_for(Schedule::PolarExpress, NsMethod::Plain), in, m, n);
  for (NsMethod method : kMethods) {
    const NsOptions o = options_for(Schedule::PolarExpress, method);
    EXPECT_LT(max_abs_diff(run_once(o, in, m, n), ref), 2e-4) << meshmuon::to_string(method);
    const std::vector<float> t = run_once(o, in_t, n, m);
    std::vector<float> back(t.size());
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) back[size_t(i) * n + j] = t[size_t(j) * m + i];
    EXPECT_LT(max_abs_diff(back, ref), 2e-4) << meshmuon::to_string(method);
  }
  // Negative control: a different schedule is visibly different at this tolerance.
  EXPECT_GT(max_abs_diff(run_once(options_for(Schedule::Jordan, NsMethod::Plain), in, m, n), ref), 1e-2);
}

TEST(Orthogonalize, CustomCoefficientsAreUsedAsGiven) {
  NsOptions jordan = options_for(Schedule::Jordan, NsMethod::Symmetric);
  NsOptions custom = jordan;
  custom.schedule = Schedule::Custom;
  custom.custom.assign(5, Coefficients{3.4445, -4.7750, 2.0315});
  const std::vector<float> in = make_input(33, 47, 33, 5);
  EXPECT_EQ(run_once(jordan, in, 33, 47), run_once(custom, in, 33, 47));
  custom.custom[4].a = 3.0;
  EXPECT_NE(run_once(jordan, in, 33, 47), run_once(custom, in, 33, 47));
}

TEST(Orthogonalize, ScaleAndClampFollowTheFormula) {
  // X₀ = G / max(‖G‖·s, eps) with eps above ‖G‖·s: σ are then tiny and 1 step multiplies them by a.
  NsOptions o = options_for(Schedule::Jordan, NsMethod::Symmetric);
  o.steps = 1;
  o.scale = 1.02f;
  o.eps_mode = meshmuon::EpsMode::Clamp;
  o.eps = 1e6f;
  const std::vector<float> in = make_input(8, 20, 8, 9);
  const std::vector<float> out = run_once(o, in, 8, 20);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_NEAR(out[i], 3.4445 * in[i] / 1e6, 1e-9);
}


TEST(Orthogonalize, BadArgumentsThrowClearly) {
  Orthogonalizer orth(NsOptions{});
  std::vector<float> a(6 * 10), b(6 * 10);
  std::vector<meshmuon::BFloat16> h(6 * 10);
  expect_orth_invalid([&] { orth.run(meshmuon::TensorView(h.data(), {6, 10}), meshmuon::TensorView(b.data(), {6, 10})); },
                 "fp32");
  expect_orth_invalid([&] { orth.run(meshmuon::TensorView(a.data(), {6, 10}), meshmuon::TensorView(b.data(), {10, 6})); },
                 "shapes differ");
  expect_orth_invalid([&] { orth.run(meshmuon::TensorView(a.data(), {60}), meshmuon::TensorView(b.data(), {60})); },
                 "[m, n]");
  const meshmuon::TensorView strided(a.data(), meshmuon::DType::F32, {6, 5}, {10, 1});
  expect_orth_invalid([&] { orth.run(strided, meshmuon::TensorView(b.data(), {6, 5})); }, "contiguous");
  expect_orth_invalid([&] { orth.run(a.data(), a.data() + 1, 6, 9); }, "overlap");
  expect_orth_invalid([&] { orth.run(a.data(), b.data(), -1, 10); }, "non-negative");
  // Nothing was written by the failed calls.
  for (float v : b) ASSERT_EQ(v, 0.0f);
}

TEST(Orthogonalize, EmptyMatrixIsANoOp) {
  Orthogonalizer orth(NsOptions{});
  std::vector<float> a(4, 1.0f);
  orth.run(a.data(), a.data(), 0, 4);
  orth.run(meshmuon::TensorView(a.data(), {0, 3, 4}), meshmuon::TensorView(a.data(), {0, 3, 4}));
  EXPECT_EQ(a, std::vector<float>(4, 1.0f));
}

// bf16 emulation (NsOptions::bf16_rounding): a scalar reference of torch.optim.Muon's bf16 iteration
// written plainly here (double accumulation, each product rounded to bf16 as torch's matmuls do).
float bf16r(double v) { return meshmuon::bf16_to_float(meshmuon::float_to_bf16(static_cast<float>(v))); }

std::vector<float> torch_bf16_reference(const std::vector<float>& in, int m, int n, float eps) {
  const bool tall = m > n;  // torch transposes tall inputs to wide and back
  const int r = tall ? n : m, c = tall ? m : n;
  std::vector<float> x(size_t(r) * c);
  double ss = 0;
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < c; ++j) {
      const float v = bf16r(tall ? in[size_t(j) * n + i] : in[size_t(i) * n + j]);
      x[size_t(i) * c + j] = v;
      ss += double(v) * v;
    }
  const float norm = std::max(bf16r(std::sqrt(ss)), bf16r(eps));
  for (float& v : x) v = bf16r(double(v) / norm);
  std::vector<float> g(size_t(r) * r), z(size_t(r) * r), y(x.size());
  for (int step = 0; step < 5; ++step) {
    const double a = 3.4445, b = -4.7750, cc = 2.0315;
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < r; ++j) {
        double acc = 0;
        for (int k = 0; k < c; ++k) acc += double(x[size_t(i) * c + k]) * x[size_t(j) * c + k];
        g[size_t(i) * r + j] = bf16r(acc);
      }
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < r; ++j) {
        double acc = 0;
        for (int k = 0; k < r; ++k) acc += double(g[size_t(i) * r + k]) * g[size_t(k) * r + j];
        z[size_t(i) * r + j] = bf16r(b * g[size_t(i) * r + j] + cc * acc);
      }
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) {
        double acc = 0;
        for (int k = 0; k < r; ++k) acc += double(z[size_t(i) * r + k]) * x[size_t(k) * c + j];
        y[size_t(i) * c + j] = bf16r(a * x[size_t(i) * c + j] + acc);
      }
    x.swap(y);
  }
  std::vector<float> out(in.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) out[size_t(i) * n + j] = tall ? x[size_t(j) * c + i] : x[size_t(i) * n + j];
  return out;
}

class OrthogonalizeBf16 : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(OrthogonalizeBf16, MatchesTheTorchStyleReference) {
  const auto [m, n] = GetParam();
  const std::vector<float> in = make_input(m, n, std::min(m, n), 100 + m * 7 + n);
  NsOptions o = options_for(Schedule::Jordan, NsMethod::Symmetric);
  o.eps_mode = meshmuon::EpsMode::Clamp;
  o.bf16_rounding = true;
  const std::vector<float> got = run_once(o, in, m, n);
  const std::vector<float> ref = torch_bf16_reference(in, m, n, o.eps);
  double scale = 0;
  for (float v : ref) scale = std::max(scale, double(std::fabs(v)));
  // Every output is a bf16 value, and the result is the reference up to rare one-ulp bf16 flips
  // from a different fp32 summation order (a flip is 2^-8 relative).
  for (float v : got) ASSERT_EQ(v, bf16r(v));
  const double d_bf16 = max_abs_diff(got, ref);
  EXPECT_LE(d_bf16, 2e-2 * scale);
  // Negative control: the fp32 path is not bf16-valued. (Most shapes match the reference bitwise;
  // a flip in one product can cascade, e.g. at 7x13, hence the bound rather than equality.)
  o.bf16_rounding = false;
  const std::vector<float> fp32 = run_once(o, in, m, n);
  std::printf("bf16 %dx%d: emulation vs reference %.3g, fp32 vs reference %.3g\n", m, n, d_bf16,
              max_abs_diff(fp32, ref));
  bool all_bf16 = true;
  for (float v : fp32) all_bf16 = all_bf16 && v == bf16r(v);
  EXPECT_FALSE(all_bf16);
}

INSTANTIATE_TEST_SUITE_P(Shapes, OrthogonalizeBf16,
                         ::testing::Values(std::pair{1, 5}, std::pair{7, 13}, std::pair{13, 7},
                                           std::pair{16, 16}, std::pair{31, 64}, std::pair{64, 31}));

TEST(OrthogonalizeBf16, ZerosStayZero) {
  NsOptions o;
  o.bf16_rounding = true;
  const std::vector<float> zeros(5 * 9, 0.0f);
  EXPECT_EQ(run_once(o, zeros, 5, 9), zeros);
}

// ---- bf16 products (NsOptions::matmul_dtype = BF16, oneDNN) ----

using meshmuon::BFloat16;
using meshmuon::cpu::Bf16Matmul;
using meshmuon::cpu::Bf16Operand;

// Small integers are exact in bf16 and their products' sums are exact in fp32 (|sum| < 2^24), so the
// oneDNN products must equal a double reference exactly, whatever order they sum in.
std::vector<BFloat16> small_ints(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-8, 8);
  std::vector<BFloat16> v(count);
  for (BFloat16& x : v) x = meshmuon::float_to_bf16(static_cast<float>(d(rng)));
  return v;
}

double at(const Bf16Operand& a, int64_t i, int64_t j) {
  return meshmuon::bf16_to_float(a.trans ? a.data[j * a.ld + i] : a.data[i * a.ld + j]);
}

TEST(Bf16Matmul, GemmIsExactOnIntegersForEveryLayout) {
  if (!meshmuon::cpu::bf16_matmul_info().available) GTEST_SKIP() << meshmuon::cpu::bf16_matmul_info().error;
  Bf16Matmul mm;
  const int64_t m = 37, n = 150, k = 131, pad = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      // A is m×k (stored k×m when transposed), B is k×n; rows padded to test leading dimensions.
      const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
      const std::vector<BFloat16> a = small_ints(size_t((ta ? k : m) * lda), 1 + ta * 2 + tb);
      const std::vector<BFloat16> b = small_ints(size_t((tb ? n : k) * ldb), 7 + ta * 2 + tb);
      const Bf16Operand oa{a.data(), lda, ta}, ob{b.data(), ldb, tb};
      std::vector<float> c(size_t(m * ldc), -1.0f);
      std::vector<BFloat16> cb(size_t(m * ldc), BFloat16{0});
      mm.gemm(m, n, k, oa, ob, c.data(), ldc);
      mm.gemm(m, n, k, oa, ob, cb.data(), ldc);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          if (j >= n) {  // the padding is not written
            ASSERT_EQ(c[size_t(i * ldc + j)], -1.0f);
            continue;
          }
          double ref = 0;
          for (int64_t p = 0; p < k; ++p) ref += at(oa, i, p) * at(ob, p, j);
          ASSERT_EQ(c[size_t(i * ldc + j)], ref) << "ta " << ta << " tb " << tb << " at " << i << "," << j;
          // bf16 output: the fp32 accumulator rounded once to nearest even
          ASSERT_EQ(cb[size_t(i * ldc + j)].bits, meshmuon::float_to_bf16(static_cast<float>(ref)).bits);
        }
    }
}

TEST(Bf16Matmul, LowerProductCoversTheLowerTriangle) {
  if (!meshmuon::cpu::bf16_matmul_info().available) GTEST_SKIP() << meshmuon::cpu::bf16_matmul_info().error;
  Bf16Matmul mm;
  for (int64_t s : {1, 127, 128, 129, 300}) {
    const int64_t k = 45;
    const std::vector<BFloat16> x = small_ints(size_t(s * k), 100 + s);
    // X·Xᵀ: the left operand X (s×k), the right one Xᵀ (k×s) as a transposed view.
    const Bf16Operand left{x.data(), k, false}, right{x.data(), k, true};
    for (bool full : {false, true}) {
      std::vector<float> c(size_t(s * s), std::nanf(""));
      mm.lower_product(s, k, left, right, c.data(), full);
      int64_t unwritten_upper = 0;
      for (int64_t i = 0; i < s; ++i)
        for (int64_t j = 0; j < s; ++j) {
          double ref = 0;
          for (int64_t p = 0; p < k; ++p) ref += at(left, i, p) * at(right, p, j);
          if (j <= i || full) {
            ASSERT_EQ(c[size_t(i * s + j)], ref) << "s " << s << " at " << i << "," << j;
          } else if (std::isnan(c[size_t(i * s + j)])) {
            ++unwritten_upper;
          }
        }
      // The block form skips the blocks above the diagonal (the point of it) once s > one block.
      if (!full && s > 128) EXPECT_GT(unwritten_upper, 0);
      if (full) EXPECT_EQ(unwritten_upper, 0);
    }
  }
}

// The products' bits do not depend on the thread count: oneDNN must not split the reduction (nor
// pick a K blocking by thread count) for any shape. Random operands (sums depend on their order),
// shapes from few outputs with long reductions (where a split reduction would pay off most) to the
// Newton–Schulz ones, transposed A with a power-of-two K (the Gram product of a tall matrix, which
// oneDNN's bf16 kernels split across 2 threads and more), thread counts past the cores and past
// 16 (where AMX splits K: oneDNN's heuristics look at the count, not at the machine's cores).
TEST(Bf16Matmul, BitwiseAcrossThreadCountsForManyShapes) {
  if (!meshmuon::cpu::bf16_matmul_info().available) GTEST_SKIP() << meshmuon::cpu::bf16_matmul_info().error;
  Bf16Matmul mm;
  std::mt19937_64 rng(2024);
  std::normal_distribution<float> normal;
  struct Shape {
    int64_t m, n, k;
    bool tb;
    bool ta = false;  // A transposed: the Gram product of a tall matrix (X^T X, K its rows)
  };
  const Shape shapes[] = {{1, 1, 20000, false},         {8, 8, 16384, true},           {32, 32, 8192, true},
                          {64, 64, 4096, false},        {16, 512, 4096, false},        {128, 384, 2048, true},
                          {256, 256, 1024, true},       {300, 700, 300, false},        {512, 128, 3000, true},
                          {64, 64, 4096, false, true},  {128, 128, 2048, false, true}, {32, 32, 8192, false, true},
                          {200, 96, 4096, true, true}};
  for (const Shape& sh : shapes) {
    std::vector<BFloat16> a(size_t(sh.m * sh.k)), b(size_t(sh.k * sh.n));
    for (BFloat16& v : a) v = meshmuon::float_to_bf16(normal(rng));
    for (BFloat16& v : b) v = meshmuon::float_to_bf16(normal(rng));
    const Bf16Operand oa{a.data(), sh.ta ? sh.m : sh.k, sh.ta}, ob{b.data(), sh.tb ? sh.k : sh.n, sh.tb};
    std::vector<float> ref(size_t(sh.m * sh.n)), c(ref.size());
    std::vector<BFloat16> refb(ref.size()), cb(ref.size());
    const int saved = mm.set_threads(1);
    mm.gemm(sh.m, sh.n, sh.k, oa, ob, ref.data(), sh.n);
    mm.gemm(sh.m, sh.n, sh.k, oa, ob, refb.data(), sh.n);
    const auto expect_same = [&](const char* how, int threads) {
      EXPECT_EQ(ref, c) << sh.m << "x" << sh.n << "x" << sh.k << (sh.ta ? " (A transposed)" : "") << " fp32 out, " << how << threads << " threads ("
                        << meshmuon::cpu::bf16_matmul_info().kernel << ")";
      size_t differ = 0;
      for (size_t i = 0; i < cb.size(); ++i) differ += refb[i].bits != cb[i].bits;
      EXPECT_EQ(differ, 0u) << sh.m << "x" << sh.n << "x" << sh.k << (sh.ta ? " (A transposed)" : "") << " bf16 out, " << how << threads << " threads";
    };
    for (int threads : {2, 3, 4, 8, 16, 32}) {
      // The primitives made on one thread, run on more; then ones made on that many threads (oneDNN
      // sizes a primitive's blocking for the thread count current when it is made).
      mm.set_threads(threads);
      mm.gemm(sh.m, sh.n, sh.k, oa, ob, c.data(), sh.n);
      mm.gemm(sh.m, sh.n, sh.k, oa, ob, cb.data(), sh.n);
      expect_same("made on 1, run on ", threads);
      Bf16Matmul fresh;
      const int previous = fresh.set_threads(threads);
      fresh.gemm(sh.m, sh.n, sh.k, oa, ob, c.data(), sh.n);
      fresh.gemm(sh.m, sh.n, sh.k, oa, ob, cb.data(), sh.n);
      fresh.set_threads(previous);
      expect_same("made and run on ", threads);
    }
    mm.set_threads(saved);
  }
}

// Under ONEDNN_MAX_CPU_ISA=AVX512_CORE (the avx512 CPU kind: AVX-512 without bf16) oneDNN emulates
// bf16; oneDNN 3.x names that kernel "gemm:jit:bf16", which must not pass for native.
TEST(Bf16Matmul, EmulationIsNotNative) {
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (isa == nullptr || std::string(isa) != "AVX512_CORE") GTEST_SKIP() << "runs as the avx512 CPU kind";
  const meshmuon::cpu::Bf16MatmulInfo info = meshmuon::cpu::bf16_matmul_info();
  if (!info.available) GTEST_SKIP() << info.error;
  EXPECT_FALSE(info.native) << info.kernel;
}

NsOptions bf16_products(Schedule s, NsMethod method) {
  NsOptions o = options_for(s, method);
  o.matmul_dtype = meshmuon::DType::BF16;
  return o;
}

using meshmuon::cpu::Bf16ProductPath;

std::string path_name(Bf16ProductPath p) { return p == Bf16ProductPath::OneDnn ? "onednn" : "widened"; }

// Runs the body with bf16 products forced onto `path` (Orthogonalizers made inside use it); oneDNN
// is skipped where it has no bf16 matmul (AVX2-only CPUs, or ONEDNN_MAX_CPU_ISA=AVX2): the widened
// path, which runs everywhere, is then the one that runs there.
class ForcedBf16Path {
 public:
  explicit ForcedBf16Path(Bf16ProductPath path) { meshmuon::cpu::set_bf16_product_path_for_tests(path); }
  ~ForcedBf16Path() { meshmuon::cpu::set_bf16_product_path_for_tests(std::nullopt); }
  static bool unavailable(Bf16ProductPath path) {
    return path == Bf16ProductPath::OneDnn && !meshmuon::cpu::bf16_matmul_info().available;
  }
};
#define SKIP_IF_UNAVAILABLE(path)                                                           \
  if (ForcedBf16Path::unavailable(path))                                                   \
  GTEST_SKIP() << "oneDNN path unavailable here (" << meshmuon::cpu::bf16_matmul_info().error \
               << "); the widened cases run instead"

// Shapes past one 128-row block of lower_product and past one tile of the fp32 products, rank-
// deficient ones included.
const Case kBf16Cases[] = {{1, 300, 1},     {300, 700, 300}, {700, 300, 300}, {260, 260, 260},
                           {200, 500, 20},  {500, 200, 7},   {150, 151, 150}, {40, 90, 40}};

using Bf16Param = std::tuple<Bf16ProductPath, Schedule, NsMethod, Case>;
class OrthogonalizeBf16Products : public ::testing::TestWithParam<Bf16Param> {};

// Against the exact SVD as the fp32 test, with tolerances for bf16 operands: every product reads
// values rounded to 8 significant bits (unit roundoff 2^-8), so the output σ carry errors of ~1e-2
// (measured worst: 0.016 full rank; 0.065 for Polar Express on the rank-7 input, whose first step
// multiplies by 8.3). Zero directions of a rank-deficient input receive the rounding noise of X
// (unit roundoff 2^-8), which the iteration amplifies like any small σ — by up to the product of the a
// coefficients (< 500 for these schedules) — measured up to 0.27 (as torch.optim.Muon's bf16 NS
// does); that noise also enters ‖out − U f(Σ) Vᵀ‖, so the singular-vector check is for full rank.
// Both paths (oneDNN, meshmuon's widened products) meet the same bounds; the fp32 path meets them with
// a 20x margin; the checker's negative control is CheckerCanFail.
TEST_P(OrthogonalizeBf16Products, MatchesExactPolarFactorWithinBf16Error) {
  const auto [path, schedule, method, cs] = GetParam();
  SKIP_IF_UNAVAILABLE(path);
  ForcedBf16Path forced(path);
  Orthogonalizer orth(bf16_products(schedule, method));
  const std::vector<float> in = make_input(cs.m, cs.n, cs.rank, 2000u + cs.m * 7u + cs.n);
  std::vector<float> out(in.size());
  orth.run(in.data(), out.data(), cs.m, cs.n);
  const Check c = check(in, out, cs.m, cs.n, cs.rank, orth);
  const bool full_rank = cs.rank == std::min(cs.m, cs.n);
  const double tol = full_rank ? 0.04 : 0.15;
  EXPECT_GE(c.sigma_lo, c.band_lo - tol);
  EXPECT_LE(c.sigma_hi, c.band_hi + tol);
  EXPECT_LT(c.sigma_err, tol);
  if (full_rank) EXPECT_LT(c.vector_err, 1.5 * tol);
  EXPECT_LT(c.null_max, 500 * std::ldexp(1.0, -9));
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
  std::printf("bf16 products (%s) %s %dx%d r%d: sigma_err %.2e vector_err %.2e null %.2e\n",
              path_name(path).c_str(), std::string(meshmuon::to_string(method)).c_str(), cs.m, cs.n, cs.rank,
              c.sigma_err, c.vector_err, c.null_max);
}

std::string bf16_case_name(const ::testing::TestParamInfo<Bf16Param>& info) {
  const auto [path, s, meth, cs] = info.param;
  return path_name(path) + "_" + std::string(meshmuon::to_string(s)) + "_" + std::string(meshmuon::to_string(meth)) +
         "_" + std::to_string(cs.m) + "x" + std::to_string(cs.n) + "r" + std::to_string(cs.rank);
}

INSTANTIATE_TEST_SUITE_P(Shapes, OrthogonalizeBf16Products,
                         ::testing::Combine(::testing::Values(Bf16ProductPath::OneDnn, Bf16ProductPath::Widened),
                                            ::testing::Values(Schedule::Jordan, Schedule::PolarExpress),
                                            ::testing::Values(NsMethod::Plain, NsMethod::Symmetric),
                                            ::testing::ValuesIn(kBf16Cases)),
                         bf16_case_name);

class Bf16Paths : public ::testing::TestWithParam<Bf16ProductPath> {};
INSTANTIATE_TEST_SUITE_P(Paths, Bf16Paths,
                         ::testing::Values(Bf16ProductPath::OneDnn, Bf16ProductPath::Widened),
                         [](const auto& info) { return path_name(info.param); });

// The products give the same bits on 1, 2 and 3 threads (oneDNN does not split the reduction; the
// widened path runs the tiled fp32 products), which is what lets LocalOptimizer run parameters on
// separate threads and the distributed engine match it bitwise. Also: in place equals out of
// place, and a rerun repeats.
TEST_P(Bf16Paths, BitwiseAcrossThreadCountsAndRuns) {
  SKIP_IF_UNAVAILABLE(GetParam());
  ForcedBf16Path forced(GetParam());
  const int saved = meshmuon::blas_get_num_threads();
  for (NsMethod method : {NsMethod::Plain, NsMethod::Symmetric})
    for (auto [m, n] : {std::pair{300, 700}, std::pair{700, 300}, std::pair{260, 260}, std::pair{640, 1536}}) {
      const std::vector<float> in = make_input(m, n, std::min(m, n), 77u + m + n);
      Orthogonalizer orth(bf16_products(Schedule::Jordan, method));
      meshmuon::blas_set_num_threads(1);
      std::vector<float> one(in.size()), other(in.size()), again(in.size());
      orth.run(in.data(), one.data(), m, n);
      for (int threads : {2, 3}) {
        meshmuon::blas_set_num_threads(threads);
        orth.run(in.data(), other.data(), m, n);
        EXPECT_EQ(one, other) << m << "x" << n << " on " << threads << " threads";
      }
      std::vector<float> inplace = in;
      orth.run(inplace.data(), inplace.data(), m, n);
      EXPECT_EQ(inplace, other);
      orth.run(in.data(), again.data(), m, n);
      EXPECT_EQ(again, other);
      // Negative control: the fp32 products give other bits.
      Orthogonalizer f32(options_for(Schedule::Jordan, method));
      f32.run(in.data(), again.data(), m, n);
      EXPECT_NE(again, other);
    }
  meshmuon::blas_set_num_threads(saved);
}

TEST_P(Bf16Paths, ZerosAndEmptyAndBadOptions) {
  SKIP_IF_UNAVAILABLE(GetParam());
  ForcedBf16Path forced(GetParam());
  Orthogonalizer orth(bf16_products(Schedule::Jordan, NsMethod::Symmetric));
  const std::vector<float> zeros(size_t(200 * 450), 0.0f);
  std::vector<float> out(zeros.size(), 1.0f);
  orth.run(zeros.data(), out.data(), 200, 450);
  EXPECT_EQ(out, zeros);
  orth.run(nullptr, nullptr, 0, 5);  // empty: a no-op
  NsOptions both = bf16_products(Schedule::Jordan, NsMethod::Symmetric);
  both.bf16_rounding = true;
  expect_orth_invalid([&] { Orthogonalizer o(both); }, "exclude each other");
  expect_orth_invalid([&] { Orthogonalizer o(bf16_products(Schedule::Jordan, NsMethod::Gram)); },
                      "method gram needs matmul_dtype fp32");
}

// The two paths compute the same arithmetic (bf16 operands, fp32 accumulation) in different
// accumulation orders: their outputs agree to bf16's error, not bitwise.
TEST(OrthogonalizeBf16Products, PathsAgreeToBf16Error) {
  if (ForcedBf16Path::unavailable(Bf16ProductPath::OneDnn))
    GTEST_SKIP() << "oneDNN has no bf16 matmul here: " << meshmuon::cpu::bf16_matmul_info().error;
  const int m = 300, n = 700;
  const std::vector<float> in = make_input(m, n, m, 991);
  std::vector<float> a(in.size()), b(in.size());
  using meshmuon::cpu::bf16_product_runs;
  // Each run goes to the path forced (observed by the paths' run counters, not inferred from the
  // bits: the two may round alike on some core).
  const auto runs = [] { return std::pair{bf16_product_runs(Bf16ProductPath::OneDnn), bf16_product_runs(Bf16ProductPath::Widened)}; };
  const auto r0 = runs();
  {
    ForcedBf16Path forced(Bf16ProductPath::OneDnn);
    Orthogonalizer(bf16_products(Schedule::Jordan, NsMethod::Symmetric)).run(in.data(), a.data(), m, n);
  }
  const auto r1 = runs();
  EXPECT_EQ(r1.first, r0.first + 1);
  EXPECT_EQ(r1.second, r0.second);
  {
    ForcedBf16Path forced(Bf16ProductPath::Widened);
    Orthogonalizer(bf16_products(Schedule::Jordan, NsMethod::Symmetric)).run(in.data(), b.data(), m, n);
  }
  const auto r2 = runs();
  EXPECT_EQ(r2.first, r1.first);
  EXPECT_EQ(r2.second, r1.second + 1);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  EXPECT_LT(worst, 0.02);
}

// Choosing a path: the environment's choice (auto: native oneDNN, else widened), and a forced oneDNN
// where it cannot run is a clear error at construction, before anything runs.
TEST(OrthogonalizeBf16Products, PathChoiceSaysWhatRunsAndWhy) {
  const meshmuon::cpu::Bf16Products chosen = meshmuon::cpu::bf16_products();
  const meshmuon::cpu::Bf16MatmulInfo dnnl = meshmuon::cpu::bf16_matmul_info();
  EXPECT_FALSE(chosen.reason.empty() && chosen.error.empty());
  if (!chosen.forced) {
    EXPECT_EQ(chosen.path, dnnl.available && dnnl.native ? Bf16ProductPath::OneDnn : Bf16ProductPath::Widened);
    EXPECT_EQ(chosen.kind, dnnl.available && dnnl.native ? "native" : "widened");
  }
  ForcedBf16Path forced(Bf16ProductPath::OneDnn);
  if (dnnl.available) {
    EXPECT_EQ(meshmuon::cpu::bf16_products().kind, dnnl.native ? "native" : "onednn_emulated");
    Orthogonalizer ok(bf16_products(Schedule::Jordan, NsMethod::Symmetric));
  } else {
    try {
      Orthogonalizer o(bf16_products(Schedule::Jordan, NsMethod::Symmetric));
      ADD_FAILURE() << "a forced oneDNN path without oneDNN must throw";
    } catch (const meshmuon::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot form bf16 products"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
