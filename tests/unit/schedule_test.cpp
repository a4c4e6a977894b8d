// Newton–Schulz coefficient schedules: Polar Express against both published lists (REFERENCE.md
// section 1) to 1e-12, other step counts through their composed polynomial, Emerging-Optimizers'
// tables and the iteration they give against float64, names, validation, flops.
// Run: build/bin/schedule_test
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "meshmuon/orthogonalize.h"
#include "test_support.h"

namespace {

template <class F>
void expect_orth_invalid(F&& f, const std::string& needle) {
  meshmuon::test::expect_invalid(f, needle, "[orth]");
}

using meshmuon::Coefficients;
using meshmuon::NsMethod;
using meshmuon::NsOptions;
using meshmuon::Schedule;

// nanochat / modded-nanogpt: l0 = 1e-3, safety = 0.02, cushion = 0.02.
const std::vector<Coefficients> kNanochat = {
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};

// arXiv 2505.16932 as published: safety = 0, cushion = 0.02407327424182761.
const std::vector<Coefficients> kPaperRaw = {
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673}};

void expect_same(const std::vector<Coefficients>& got, const std::vector<Coefficients>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    EXPECT_NEAR(got[t].a, want[t].a, tol) << "step " << t;
    EXPECT_NEAR(got[t].b, want[t].b, tol) << "step " << t;
    EXPECT_NEAR(got[t].c, want[t].c, tol) << "step " << t;
  }
}

TEST(PolarExpress, MatchesNanochatList) {
  expect_same(meshmuon::polar_express_coefficients(5, 1e-3, 0.02, 0.02), kNanochat, 1e-12);
  NsOptions o;
  o.schedule = Schedule::PolarExpress;
  expect_same(meshmuon::make_schedule(o), kNanochat, 1e-12);  // the option defaults are nanochat's
}

TEST(PolarExpress, MatchesPaperList) {
  expect_same(meshmuon::polar_express_coefficients(5, 1e-3, 0.0, 0.02407327424182761), kPaperRaw, 1e-12);
}

TEST(PolarExpress, ComparisonCanFail) {
  // Negative control: the two lists differ by far more than the tolerance.
  const auto got = meshmuon::polar_express_coefficients(5, 1e-3, 0.02, 0.02);
  EXPECT_GT(std::fabs(got[0].c - kPaperRaw[0].c), 1.0);
  EXPECT_GT(std::fabs(got[4].a - kPaperRaw[4].a), 1e-3);
}

// The composed polynomial over [l0, 1], sampled densely in double (log-spaced near l0).
std::pair<double, double> composed_range(const std::vector<Coefficients>& cs, double l0) {
  double lo = 1e300, hi = -1e300;
  const int kSamples = 20000;
  for (int i = 0; i <= kSamples; ++i) {
    double x = l0 * std::pow(1.0 / l0, double(i) / kSamples);
    for (const Coefficients& c : cs) x = c.a * x + c.b * x * x * x + c.c * x * x * x * x * x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  return {lo, hi};
}

TEST(PolarExpress, OtherStepCountsMapIntoTheirBand) {
  double previous_err = 1.0;
  for (int steps : {1, 2, 3, 5, 8, 10}) {
    const auto cs = meshmuon::polar_express_coefficients(steps, 1e-3, 0.02, 0.02);
    ASSERT_EQ(cs.size(), size_t(steps));
    for (const Coefficients& c : cs) ASSERT_TRUE(std::isfinite(c.a) && std::isfinite(c.b) && std::isfinite(c.c));
    const auto [lo, hi] = composed_range(cs, 1e-3);
    // Positive on [l0, 1], below 2, centred on 1 (the last step equioscillates around 1), and each
    // extra step tightens the band.
    EXPECT_GT(lo, 0.0) << steps;
    EXPECT_LT(hi, 2.0) << steps;
    EXPECT_NEAR(1 - lo, hi - 1, 1e-6) << steps;
    EXPECT_LT(hi - 1, previous_err) << steps;
    previous_err = hi - 1;
  }
  // REFERENCE.md: 5 steps give 0.86 – 1.14; 8 steps converge far tighter.
  const auto [lo5, hi5] = composed_range(meshmuon::polar_express_coefficients(5, 1e-3, 0.02, 0.02), 1e-3);
  EXPECT_NEAR(lo5, 0.8589, 1e-3);
  EXPECT_NEAR(hi5, 1.1411, 1e-3);
  const auto [lo8, hi8] = composed_range(meshmuon::polar_express_coefficients(8, 1e-3, 0.02, 0.02), 1e-3);
  EXPECT_GT(lo8, 0.99);
  EXPECT_LT(hi8, 1.01);
}

TEST(Schedule, NamedSchedulesAndCustom) {
  NsOptions o;
  o.schedule = Schedule::Jordan;
  o.steps = 3;
  const auto j = meshmuon::make_schedule(o);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[2].a, 3.4445);
  EXPECT_EQ(j[2].b, -4.7750);
  EXPECT_EQ(j[2].c, 2.0315);
  o.schedule = Schedule::You;
  o.steps = 5;
  const auto y = meshmuon::make_schedule(o);
  EXPECT_EQ(y[0].a, 4.0848);
  EXPECT_EQ(y[4].c, 1.2012);
  o.schedule = Schedule::Custom;
  o.steps = 2;
  o.custom = {{1.5, -0.5, 0.0}, {2.0, -1.0, 0.25}};
  const auto c = meshmuon::make_schedule(o);
  EXPECT_EQ(c[1].c, 0.25);
  EXPECT_EQ(c[0].a, 1.5);
}

// Emerging-Optimizers' tables (muon_utils.py, its _COEFFICIENT_SETS) and iteration rules: cans and
// deepseekv4 repeat their last triple past the table, aol cycles, cubic5 has exactly 5 steps.
TEST(Schedule, EmergingOptimizersTables) {
  NsOptions o;
  o.schedule = Schedule::Cans;
  o.steps = 7;
  auto t = meshmuon::make_schedule(o);
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(t[0].a, 8.4703);
  EXPECT_EQ(t[0].b, -25.1081);
  EXPECT_EQ(t[0].c, 18.6293);
  EXPECT_EQ(t[4].a, 2.2737);
  EXPECT_EQ(t[6].b, -1.6447);  // the last, repeated
  o.schedule = Schedule::Aol;
  o.steps = 6;
  t = meshmuon::make_schedule(o);
  EXPECT_EQ(t[0].a, 4.0098);
  EXPECT_EQ(t[3].c, 1.3169);
  EXPECT_EQ(t[4].a, 4.0098);  // cycled
  EXPECT_EQ(t[5].b, -5.5479);
  o.schedule = Schedule::DeepSeekV4;
  o.steps = 12;
  t = meshmuon::make_schedule(o);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(t[size_t(i)].a, 3.4445) << i;
  EXPECT_EQ(t[7].b, -4.7750);
  for (int i = 8; i < 12; ++i) {
    EXPECT_EQ(t[size_t(i)].a, 2.0) << i;
    EXPECT_EQ(t[size_t(i)].b, -1.5) << i;
    EXPECT_EQ(t[size_t(i)].c, 0.5) << i;
  }
  o.steps = 5;  // a shorter run: a prefix (Emerging-Optimizers' default is 5 steps)
  t = meshmuon::make_schedule(o);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[4].a, 3.4445);
  o.schedule = Schedule::Cubic5;
  t = meshmuon::make_schedule(o);
  EXPECT_EQ(t[0].a, 3.3656576);
  EXPECT_EQ(t[4].b, -0.9630650);
  for (const Coefficients& c : t) EXPECT_EQ(c.c, 0.0);
  o.steps = 6;
  expect_orth_invalid([o] { meshmuon::make_schedule(o); }, "fixed 5-step schedule, got steps=6");
}

TEST(Schedule, NamesRoundTrip) {
  for (Schedule s : {Schedule::Jordan, Schedule::You, Schedule::PolarExpress, Schedule::Custom, Schedule::Cans,
                     Schedule::Aol, Schedule::DeepSeekV4, Schedule::Cubic5})
    EXPECT_EQ(meshmuon::parse_schedule(meshmuon::to_string(s)), s);
  for (NsMethod m : {NsMethod::Plain, NsMethod::Symmetric, NsMethod::Gram})
    EXPECT_EQ(meshmuon::parse_ns_method(meshmuon::to_string(m)), m);
  EXPECT_EQ(meshmuon::to_string(Schedule::PolarExpress), "polar_express");
}


TEST(Schedule, BadOptionsThrowClearly) {
  auto with = [](auto edit) {
    NsOptions o;
    edit(o);
    return [o] { meshmuon::Orthogonalizer orth(o); };
  };
  expect_orth_invalid(with([](NsOptions& o) { o.steps = 0; }), "steps must be >= 1");
  expect_orth_invalid(with([](NsOptions& o) { o.schedule = Schedule::You; o.steps = 4; }), "exactly 5 steps");
  expect_orth_invalid(with([](NsOptions& o) { o.schedule = Schedule::Custom; o.custom = {{1, 0, 0}}; }),
                 "custom schedule has 1");
  expect_orth_invalid(with([](NsOptions& o) {
                   o.schedule = Schedule::Custom;
                   o.steps = 1;
                   o.custom = {{1, std::numeric_limits<double>::quiet_NaN(), 0}};
                 }),
                 "not finite");
  expect_orth_invalid(with([](NsOptions& o) { o.scale = 0; }), "scale");
  expect_orth_invalid(with([](NsOptions& o) { o.eps = -1; }), "eps");
  expect_orth_invalid(with([](NsOptions& o) { o.schedule = Schedule::PolarExpress; o.pe_l0 = 0; }), "l0");
  expect_orth_invalid([] { meshmuon::parse_schedule("muon"); }, "unknown schedule 'muon'");
  expect_orth_invalid([] { meshmuon::parse_ns_method("fast"); }, "unknown method 'fast'");
}

// A random fp32 m x n matrix (normal entries), the same for a seed.
std::vector<float> random_matrix(int m, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> out(size_t(m) * n);
  for (float& v : out) v = normal(rng);
  return out;
}

// The iteration in float64, written from the formula: X₀ = G / max(‖G‖_F·s, eps) (default eps_mode
// add: / (‖G‖_F·s + eps)), then per step X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ on the short side.
std::vector<double> ns_reference(const std::vector<float>& in, int m, int n, const NsOptions& o,
                                 const std::vector<Coefficients>& coefficients) {
  const bool wide = m <= n;
  const int s = wide ? m : n, l = wide ? n : m;  // X is s×l
  std::vector<double> x(size_t(s) * l);
  double norm = 0;
  for (float v : in) norm += double(v) * v;
  norm = std::sqrt(norm) * o.scale + o.eps;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) x[wide ? size_t(i) * l + j : size_t(j) * l + i] = in[size_t(i) * n + j] / norm;
  std::vector<double> a(size_t(s) * s), b(a.size()), next(x.size());
  for (const Coefficients& c : coefficients) {
    for (int i = 0; i < s; ++i)
      for (int j = 0; j < s; ++j) {
        double v = 0;
        for (int k = 0; k < l; ++k) v += x[size_t(i) * l + k] * x[size_t(j) * l + k];
        a[size_t(i) * s + j] = v;
      }
    for (int i = 0; i < s; ++i)
      for (int j = 0; j < s; ++j) {
        double v = 0;
        for (int k = 0; k < s; ++k) v += a[size_t(i) * s + k] * a[size_t(k) * s + j];
        b[size_t(i) * s + j] = c.b * a[size_t(i) * s + j] + c.c * v;
      }
    for (int i = 0; i < s; ++i)
      for (int j = 0; j < l; ++j) {
        double v = c.a * x[size_t(i) * l + j];
        for (int k = 0; k < s; ++k) v += b[size_t(i) * s + k] * x[size_t(k) * l + j];
        next[size_t(i) * l + j] = v;
      }
    x.swap(next);
  }
  std::vector<double> out(in.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) out[size_t(i) * n + j] = x[wide ? size_t(i) * l + j : size_t(j) * l + i];
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

// Emerging-Optimizers' schedules (cans, aol, deepseekv4, cubic5) run the iteration of their tables:
// the fp32 result of every method within 2e-5 of the float64 iteration with the table's
// coefficients (Gram Newton–Schulz 2e-4), and far from the iteration with Jordan's (a check that
// can fail).
TEST(Schedule, EmergingOptimizersSchedulesRunTheirTables) {
  struct Run {
    Schedule schedule;
    int steps;
  };
  for (const Run run : {Run{Schedule::Cans, 5}, Run{Schedule::Aol, 6}, Run{Schedule::DeepSeekV4, 10},
                        Run{Schedule::Cubic5, 5}}) {
    for (NsMethod method : {NsMethod::Plain, NsMethod::Symmetric, NsMethod::Gram}) {
      for (const auto [m, n] : {std::pair{24, 61}, std::pair{70, 20}}) {
        NsOptions o;
        o.schedule = run.schedule;
        o.method = method;
        o.steps = run.steps;
        const std::vector<float> in = random_matrix(m, n, 31);
        std::vector<float> got(in.size());
        meshmuon::Orthogonalizer(o).run(in.data(), got.data(), m, n);
        const double err = max_abs_diff(got, ns_reference(in, m, n, o, meshmuon::make_schedule(o)));
        NsOptions jordan = o;
        jordan.schedule = Schedule::Jordan;
        const double other = max_abs_diff(got, ns_reference(in, m, n, o, meshmuon::make_schedule(jordan)));
        // Gram Newton–Schulz iterates on the small Gram matrix in fp32: a larger error, documented
        const double tolerance = method == NsMethod::Gram ? 2e-4 : 2e-5;
        EXPECT_LT(err, tolerance) << meshmuon::to_string(run.schedule) << " " << meshmuon::to_string(method) << " " << m << "x" << n;
        std::printf("%s %s %dx%d: vs float64 %.2e, vs jordan's %.2e\n", std::string(meshmuon::to_string(run.schedule)).c_str(),
                    std::string(meshmuon::to_string(method)).c_str(), m, n, err, other);
        EXPECT_GT(other, 100 * std::max(err, 1e-7)) << meshmuon::to_string(run.schedule) << " vs jordan";
      }
    }
  }
}

TEST(Schedule, FlopCounts) {
  NsOptions o;
  const double m = 1024, n = 4096;
  o.method = NsMethod::Plain;
  EXPECT_EQ(meshmuon::ns_flops(1024, 4096, o), 20 * m * m * n + 10 * m * m * m);
  EXPECT_EQ(meshmuon::ns_flops(4096, 1024, o), 20 * m * m * n + 10 * m * m * m);  // tall: same
  o.method = NsMethod::Symmetric;
  EXPECT_EQ(meshmuon::ns_flops(1024, 4096, o), 15 * m * m * n + 5 * m * m * m);
  o.steps = 10;
  EXPECT_EQ(meshmuon::ns_flops(1024, 4096, o), 30 * m * m * n + 10 * m * m * m);
  o.steps = 5;
  o.method = NsMethod::Gram;
  // 6m²n for the products with X; 20m³ on the Gram side (see gram_ns.cpp).
  EXPECT_EQ(meshmuon::ns_flops(1024, 4096, o), 6 * m * m * n + 20 * m * m * m);
  EXPECT_EQ(meshmuon::ns_flops(1024, 1024, o), 15 * m * m * m + 5 * m * m * m);  // square: symmetric
  EXPECT_EQ(meshmuon::ns_flops(0, 4096, o), 0.0);
}

}  // namespace
