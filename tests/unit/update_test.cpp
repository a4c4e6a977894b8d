// Update kernels (momentum, LR rules, weight decay, cautious mask, NorMuon, AdamW) against plain
// references written here: a double-precision math reference (tolerance) and, where the contract
// fixes the fp32 rounding, a float reference spelled out op by op (exact). Run: build/bin/update_test
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "meshmuon/bf16.h"
#include "meshmuon/update.h"
#include "backend/cpu/kernels/update_steps.h"
#include "test_support.h"

namespace {

using meshmuon::BFloat16;

using meshmuon::test::randn;

std::vector<BFloat16> to_bf16(const std::vector<float>& v) {
  std::vector<BFloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = meshmuon::float_to_bf16(v[i]);
  return out;
}

// |a − b| ≤ tol·max(|b|, floor): the relative check used against the double references.
void expect_near_rel(const std::vector<float>& got, const std::vector<double>& want, double tol,
                     double floor, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - want[i]), tol * std::max(std::fabs(want[i]), floor))
        << what << " element " << i << ": got " << got[i] << ", want " << want[i];
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << what << " element " << i << ": " << a[i] << " vs " << b[i];
}

// torch's vectorized CPU lerp, written out independently of the library's helper.
float lerp_fp32(float start, float end, float weight) {
  if (weight > -0.5f && weight < 0.5f) return std::fma(weight, end - start, start);
  return std::fma(weight - 1.0f, end - start, end);
}

// ---- momentum --------------------------------------------------------------------------------

using MomentumCase = std::tuple<meshmuon::MomentumKind, bool /*nesterov*/, bool /*bf16*/, int /*n*/>;
class MomentumTest : public ::testing::TestWithParam<MomentumCase> {};

TEST_P(MomentumTest, MatchesReferencesOverSteps) {
  const auto [kind, nesterov, bf16, n] = GetParam();
  const double mu = 0.95;
  const meshmuon::MomentumOptions opt{kind, mu, nesterov};
  std::vector<float> buf(n, 0.0f), update(n);
  std::vector<double> buf_d(n, 0.0);
  std::vector<float> buf_f(n, 0.0f);  // exact fp32 reference
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g = randn(n, 100 + step);
    if (bf16) {  // the reference sees the same (rounded) values the kernel widens
      const auto gb = to_bf16(g);
      for (int i = 0; i < n; ++i) g[i] = meshmuon::bf16_to_float(gb[i]);
      meshmuon::momentum_step(opt, buf.data(), gb.data(), update.data(), n);
    } else {
      meshmuon::momentum_step(opt, buf.data(), g.data(), update.data(), n);
    }
    std::vector<double> upd_d(n);
    std::vector<float> upd_f(n);
    const float mu_f = static_cast<float>(mu), w_f = static_cast<float>(1.0 - mu);
    for (int i = 0; i < n; ++i) {
      if (kind == meshmuon::MomentumKind::Ema) {
        buf_d[i] = mu * buf_d[i] + (1 - mu) * g[i];
        upd_d[i] = nesterov ? (1 - mu) * g[i] + mu * buf_d[i] : buf_d[i];
        buf_f[i] = lerp_fp32(buf_f[i], g[i], w_f);
        upd_f[i] = nesterov ? lerp_fp32(g[i], buf_f[i], mu_f) : buf_f[i];
      } else {
        buf_d[i] = mu * buf_d[i] + g[i];
        upd_d[i] = nesterov ? g[i] + mu * buf_d[i] : buf_d[i];
        const float scaled = buf_f[i] * mu_f;
        buf_f[i] = scaled + g[i];
        upd_f[i] = nesterov ? std::fma(buf_f[i], mu_f, g[i]) : buf_f[i];
      }
    }
    expect_bitwise(buf, buf_f, "buf (fp32 reference)");
    expect_bitwise(update, upd_f, "update (fp32 reference)");
    // fp32 roundings (~6e-8 relative to the operands, |g| < 5, |buf| < 20 here) of a few ops per
    // step over 4 steps: ≤ 1e-5 absolute where results cancel to small values, 1e-6 relative above.
    expect_near_rel(buf, buf_d, 1e-6, 10.0, "buf (double reference)");
    expect_near_rel(update, upd_d, 1e-6, 10.0, "update (double reference)");
  }
}

INSTANTIATE_TEST_SUITE_P(
    KindsNesterovDtypes, MomentumTest,
    ::testing::Combine(::testing::Values(meshmuon::MomentumKind::Ema, meshmuon::MomentumKind::HeavyBall),
                       ::testing::Bool(), ::testing::Bool(), ::testing::Values(0, 1, 17, 1031)));

TEST(Momentum, UpdateMayAliasFp32GradButNotBuffer) {
  std::vector<float> g = randn(33, 7), buf = randn(33, 8), out(33);
  std::vector<float> g2 = g, buf2 = buf;
  meshmuon::momentum_step({}, buf.data(), g.data(), out.data(), 33);
  meshmuon::momentum_step({}, buf2.data(), g2.data(), g2.data(), 33);  // in place over the gradient
  expect_bitwise(out, g2, "aliased update");
  EXPECT_THROW(meshmuon::momentum_step({}, buf.data(), g.data(), buf.data() + 5, 20), std::invalid_argument);
  EXPECT_THROW(meshmuon::momentum_step({meshmuon::MomentumKind::Ema, -0.5, true}, buf.data(), g.data(),
                                    out.data(), 33),
               std::invalid_argument);
  EXPECT_THROW(meshmuon::momentum_step({}, nullptr, g.data(), out.data(), 3), std::invalid_argument);
}

// The range's boundary values, as torch.optim.Muon (EMA, checks only μ >= 0) and Motif / Dion (heavy
// ball, μ >= 0) take them: μ = 0 (no memory), μ = 1 (EMA: the buffer never moves from where it is;
// heavy ball: the buffer is the plain sum of the gradients), μ > 1 (extrapolation). Integer-valued
// gradients make the sums exact, so the expected values are written without rounding.
using MomentumEdge = std::tuple<meshmuon::MomentumKind, bool /*nesterov*/, double /*mu*/>;
class MomentumEdgeTest : public ::testing::TestWithParam<MomentumEdge> {};

TEST_P(MomentumEdgeTest, BoundaryMomentumIsTheRule) {
  const auto [kind, nesterov, mu] = GetParam();
  const int n = 19;
  const bool ema = kind == meshmuon::MomentumKind::Ema;
  std::vector<float> buf(n), update(n), buf_f(n), sum(n);
  for (int i = 0; i < n; ++i) buf[i] = buf_f[i] = sum[i] = static_cast<float>(i % 5) - 2.0f;  // a nonzero start
  const std::vector<float> start = buf;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(n);
    for (int i = 0; i < n; ++i) g[i] = static_cast<float>((i * 7 + step * 3) % 11) - 5.0f;
    meshmuon::momentum_step({kind, mu, nesterov}, buf.data(), g.data(), update.data(), n);
    const float mu_f = static_cast<float>(mu), w_f = static_cast<float>(1.0 - mu);
    for (int i = 0; i < n; ++i) {
      float upd;
      if (ema) {
        buf_f[i] = lerp_fp32(buf_f[i], g[i], w_f);
        upd = nesterov ? lerp_fp32(g[i], buf_f[i], mu_f) : buf_f[i];
      } else {
        buf_f[i] = buf_f[i] * mu_f + g[i];
        upd = nesterov ? std::fma(buf_f[i], mu_f, g[i]) : buf_f[i];
      }
      sum[i] += g[i];
      ASSERT_EQ(buf[i], buf_f[i]) << "element " << i << " step " << step;
      ASSERT_EQ(update[i], upd) << "element " << i << " step " << step;
      if (mu == 1.0 && ema) {  // torch: buf.lerp_(g, 0) keeps buf; g.lerp(buf, 1) is buf
        ASSERT_EQ(buf[i], start[i]);
        ASSERT_EQ(update[i], start[i]);
      } else if (mu == 1.0) {  // Motif / Dion: buf.mul_(1).add_(g), a pure sum
        ASSERT_EQ(buf[i], sum[i]);
        ASSERT_EQ(update[i], nesterov ? sum[i] + g[i] : sum[i]);
      } else if (mu == 0.0) {  // no memory: the update is the gradient
        ASSERT_EQ(buf[i], g[i]);
        ASSERT_EQ(update[i], g[i]);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    KindsNesterovEdges, MomentumEdgeTest,
    ::testing::Combine(::testing::Values(meshmuon::MomentumKind::Ema, meshmuon::MomentumKind::HeavyBall),
                       ::testing::Bool(), ::testing::Values(0.0, 1.0, 1.5)));

TEST(Momentum, RefusesNegativeAndNonFiniteMomentum) {
  std::vector<float> g(4, 1.0f), buf(4, 0.0f), out(4);
  for (double mu : {-1e-9, -0.5, std::numeric_limits<double>::infinity(), std::nan("")}) {
    const std::string msg = meshmuon::test::error_of(
        [&] { meshmuon::momentum_step({meshmuon::MomentumKind::Ema, mu, true}, buf.data(), g.data(), out.data(), 4); });
    EXPECT_NE(msg.find("momentum"), std::string::npos) << mu;
    EXPECT_NE(msg.find("must be finite and >= 0"), std::string::npos) << msg;
  }
  for (float x : buf) EXPECT_EQ(x, 0.0f);  // refused before anything is written
}

TEST(Momentum, TorchLerpPicksItsBranchByWeight) {
  // μ = 0.3 gives buf ← lerp(buf, g, 0.7): torch's |w| ≥ 0.5 branch, fma(w − 1, g − buf, g). Find
  // inputs where the other branch rounds differently (so the check can fail), then compare.
  const float w = static_cast<float>(1.0 - 0.3);
  std::vector<float> a = randn(4096, 77), b = randn(4096, 78);
  int found = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float large = std::fma(w - 1.0f, b[i] - a[i], b[i]);
    const float small = std::fma(w, b[i] - a[i], a[i]);
    if (large == small) continue;
    ++found;
    std::vector<float> buf{a[i]}, g{b[i]}, out(1);
    meshmuon::momentum_step({meshmuon::MomentumKind::Ema, 0.3, false}, buf.data(), g.data(), out.data(), 1);
    ASSERT_EQ(buf[0], large) << "a " << a[i] << " b " << b[i];
  }
  EXPECT_GT(found, 0);
}

// ---- LR rules --------------------------------------------------------------------------------

TEST(LrRule, GlobalShapesTallWideSquareExpert) {
  const double lr = 0.02;
  struct Case { meshmuon::Shape shape; bool expert; double a, b; };
  const Case cases[] = {{{1024, 256}, false, 1024, 256}, {{256, 1024}, false, 256, 1024},
                        {{97, 97}, false, 97, 97},       {{8, 384, 96}, true, 384, 96},
                        {{3, 5, 7}, true, 5, 7},         {{1, 4096}, false, 1, 4096}};
  for (const Case& c : cases) {
    const meshmuon::MatrixDims d = meshmuon::matrix_dims(c.shape, c.expert);
    ASSERT_EQ(d.rows, c.a);
    ASSERT_EQ(d.cols, c.b);
    ASSERT_EQ(d.batch, c.expert ? c.shape[0] : 1);
    const double original = lr * std::sqrt(c.a > c.b ? c.a / c.b : 1.0);
    const double rms = lr * 0.2 * std::sqrt(c.a > c.b ? c.a : c.b);
    EXPECT_NEAR(meshmuon::adjusted_lr(lr, meshmuon::LrRule::Original, d.rows, d.cols), original, 1e-15);
    EXPECT_NEAR(meshmuon::adjusted_lr(lr, meshmuon::LrRule::MatchRmsAdamw, d.rows, d.cols), rms, 1e-15);
    EXPECT_EQ(meshmuon::adjusted_lr(lr, meshmuon::LrRule::None, d.rows, d.cols), lr);
  }
  // Known values: tall 4:1 doubles the lr; 0.2·sqrt(1024) = 6.4.
  EXPECT_DOUBLE_EQ(meshmuon::adjusted_lr(0.02, meshmuon::LrRule::Original, 1024, 256), 0.04);
  EXPECT_DOUBLE_EQ(meshmuon::adjusted_lr(0.02, meshmuon::LrRule::Original, 256, 1024), 0.02);
  EXPECT_DOUBLE_EQ(meshmuon::adjusted_lr(1.0, meshmuon::LrRule::MatchRmsAdamw, 256, 1024), 6.4);
  EXPECT_THROW(meshmuon::matrix_dims({16}, false), std::invalid_argument);
  EXPECT_THROW(meshmuon::matrix_dims({4, 4, 4}, false), std::invalid_argument);
  EXPECT_THROW(meshmuon::matrix_dims({4, 4}, true), std::invalid_argument);
  EXPECT_EQ(meshmuon::parse_lr_rule("match_rms_adamw"), meshmuon::LrRule::MatchRmsAdamw);
  EXPECT_EQ(meshmuon::to_string(meshmuon::LrRule::Original), "original");
  EXPECT_THROW(meshmuon::parse_lr_rule("moonlight"), std::invalid_argument);
}

// ---- weight decay + update -------------------------------------------------------------------

class ApplyTest : public ::testing::TestWithParam<int> {};

TEST_P(ApplyTest, DecoupledAndCautiousMatchReferences) {
  const int n = GetParam();
  const double lr = 0.02, lr_adj = 0.04, wd = 0.1;
  const std::vector<float> p0 = randn(n, 11), u = randn(n, 12, 0.05f);
  for (bool cautious : {false, true}) {
    std::vector<float> p = p0;
    meshmuon::apply_update({lr, lr_adj, wd, cautious}, p.data(), u.data(), n);
    std::vector<double> want(n);
    std::vector<float> want_f(n);
    for (int i = 0; i < n; ++i) {
      const double x = p0[i];
      const bool decay = !cautious || u[i] * p0[i] >= 0.0f;
      want[i] = x - lr_adj * u[i] - (decay ? lr * wd * x : 0.0);
      if (cautious) {
        const float d = decay ? static_cast<float>(lr * wd) * p0[i] : 0.0f;
        const float s = static_cast<float>(lr_adj) * u[i];
        want_f[i] = p0[i] - (s + d);
      } else {
        const float kept = p0[i] * static_cast<float>(1.0 - lr * wd);
        want_f[i] = std::fma(u[i], static_cast<float>(-lr_adj), kept);
      }
    }
    expect_bitwise(p, want_f, cautious ? "cautious (fp32)" : "decoupled (fp32)");
    expect_near_rel(p, want, 1e-6, 1e-2, cautious ? "cautious (double)" : "decoupled (double)");
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ApplyTest, ::testing::Values(0, 1, 7, 64, 1009));

TEST(Apply, DecayUsesUnadjustedLr) {
  // U = 0: only the decay acts, p·(1 − lr·wd) with the UNADJUSTED lr (negative control: adjusted).
  std::vector<float> p{2.0f}, u{0.0f};
  meshmuon::apply_update({0.5, 5.0, 0.5, false}, p.data(), u.data(), 1);
  EXPECT_EQ(p[0], 1.5f);
  p = {2.0f};
  meshmuon::apply_update({0.5, 5.0, 0.5, true}, p.data(), u.data(), 1);
  EXPECT_EQ(p[0], 1.5f);
}

TEST(Apply, AdjustedDecayLrMatchesHandComputedUpdate) {
  // decay_lr = adjusted (nanochat): the decay uses the adjusted lr, for plain and cautious decay.
  // Values chosen so every scalar and product is exact in fp32: lr 0.25, lr_adj 0.5, wd 0.5.
  using meshmuon::DecayLr;
  const double lr = 0.25, lr_adj = 0.5, wd = 0.5;
  // U = 0: p·(1 − lr_adj·wd) = 2·0.75 = 1.5 (unadjusted: 2·(1 − 0.125) = 1.75, the negative control)
  for (bool cautious : {false, true}) {
    std::vector<float> p{2.0f}, u{0.0f};
    meshmuon::apply_update({lr, lr_adj, wd, cautious, DecayLr::Adjusted}, p.data(), u.data(), 1);
    EXPECT_EQ(p[0], 1.5f) << "cautious " << cautious;
    p = {2.0f};
    meshmuon::apply_update({lr, lr_adj, wd, cautious, DecayLr::Unadjusted}, p.data(), u.data(), 1);
    EXPECT_EQ(p[0], 1.75f) << "cautious " << cautious;
  }
  // U ≠ 0, p = [2, 2], U = [1, −1]: plain p − lr_adj·wd·p − lr_adj·U = [2 − 0.5 − 0.5, 2 − 0.5 + 0.5];
  // cautious: element 1 has U·p < 0, so no decay there: [1, 2.5].
  std::vector<float> p{2.0f, 2.0f}, u{1.0f, -1.0f};
  meshmuon::apply_update({lr, lr_adj, wd, false, DecayLr::Adjusted}, p.data(), u.data(), 2);
  EXPECT_EQ(p, (std::vector<float>{1.0f, 2.0f}));
  p = {2.0f, 2.0f};
  meshmuon::apply_update({lr, lr_adj, wd, true, DecayLr::Adjusted}, p.data(), u.data(), 2);
  EXPECT_EQ(p, (std::vector<float>{1.0f, 2.5f}));
  EXPECT_EQ(meshmuon::decay_lr_value({lr, lr_adj, wd, false, DecayLr::Adjusted}), lr_adj);
  EXPECT_EQ(meshmuon::decay_lr_value({lr, lr_adj, wd, false, DecayLr::Unadjusted}), lr);
  EXPECT_EQ(meshmuon::parse_decay_lr("adjusted"), DecayLr::Adjusted);
  EXPECT_EQ(meshmuon::to_string(DecayLr::Unadjusted), "unadjusted");
  meshmuon::test::expect_invalid([] { (void)meshmuon::parse_decay_lr("scaled"); }, "decay_lr 'scaled'", "[optim]");
  EXPECT_THROW(meshmuon::apply_update({lr, lr_adj, wd, false, static_cast<DecayLr>(7)}, p.data(), u.data(), 2),
               std::invalid_argument);
}

TEST(Apply, CautiousMaskSignEdgeCases) {
  const float tiny = 1e-30f;  // tiny·(−tiny) underflows to −0, which counts as ≥ 0
  struct Case { float p, u; bool decays; };
  const Case cases[] = {{1.0f, 1.0f, true},   {-1.0f, -1.0f, true}, {1.0f, -1.0f, false},
                        {-1.0f, 1.0f, false}, {1.0f, 0.0f, true},   {1.0f, -0.0f, true},
                        {0.0f, -1.0f, true},  {-0.0f, 1.0f, true},  {tiny, -tiny, true},
                        {-2.0f, 3.0f, false}};
  const double lr = 0.25, lr_adj = 0.5, wd = 0.5;
  for (const Case& c : cases) {
    std::vector<float> p{c.p}, u{c.u};
    meshmuon::apply_update({lr, lr_adj, wd, true}, p.data(), u.data(), 1);
    const float step = static_cast<float>(lr_adj) * c.u;
    const float decay = c.decays ? static_cast<float>(lr * wd) * c.p : 0.0f;
    EXPECT_EQ(p[0], c.p - (step + decay)) << "p " << c.p << " u " << c.u;
    if (c.p != 0.0f && std::fabs(c.p) > 1e-20f) {  // the decay term is visible: check it mattered
      const float other = c.p - (step + (c.decays ? 0.0f : static_cast<float>(lr * wd) * c.p));
      EXPECT_NE(p[0], other) << "mask had no effect for p " << c.p << " u " << c.u;
    }
  }
}

// The cautious mask over a long vector (the vectorized body and its remainder, not only the scalar
// tail the single-element cases above run): random signs and magnitudes with zeros, −0, values whose
// product underflows, denormals and infinities spread through it, bitwise the conditional formula
// (decay = (u·p >= 0) ? lr·wd·p : +0), NaN where the formula gives NaN.
TEST(Apply, CautiousMaskIsTheConditionalFormulaOnLongVectors) {
  const int64_t n = 1037;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const float specials[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, -1e-40f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  std::vector<float> p(n), u(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = i % 13 == 0 ? specials[(i / 13) % 8] : normal(rng);
    u[i] = i % 17 == 0 ? specials[(i / 17) % 8] : normal(rng);
  }
  const double lr = 0.02, lr_adj = 0.04, wd = 0.1;
  std::vector<float> got = p;
  meshmuon::apply_update({lr, lr_adj, wd, true}, got.data(), u.data(), n);
  const float lr_wd = static_cast<float>(lr * wd), step_lr = static_cast<float>(lr_adj);
  int kept = 0, dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = u[i] * p[i] >= 0.0f;
    (keep ? kept : dropped) += 1;
    const float want = p[i] - (step_lr * u[i] + (keep ? lr_wd * p[i] : 0.0f));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << i << ": p " << p[i] << " u " << u[i];
    }
  }
  EXPECT_GT(kept, 100);
  EXPECT_GT(dropped, 100);  // both sides of the mask are exercised
}

TEST(Apply, RejectsBadArguments) {
  std::vector<float> p(4), u(4);
  EXPECT_THROW(meshmuon::apply_update({-1.0, 0.1, 0.1, false}, p.data(), u.data(), 4), std::invalid_argument);
  EXPECT_THROW(meshmuon::apply_update({0.1, 0.1, -0.1, false}, p.data(), u.data(), 4), std::invalid_argument);
  EXPECT_THROW(meshmuon::apply_update({0.1, 0.1, 0.1, false}, p.data(), p.data() + 1, 3), std::invalid_argument);
  EXPECT_THROW(meshmuon::apply_update({0.1, 0.1, 0.1, false}, p.data(), u.data(), -1), std::invalid_argument);
}

// ---- NorMuon ---------------------------------------------------------------------------------


using Shape2 = std::tuple<int, int>;
class NorMuonTest : public ::testing::TestWithParam<Shape2> {};

TEST_P(NorMuonTest, MatchesDoubleReferenceOverSteps) {
  const auto [m, n] = GetParam();
  const double beta2 = 0.95;
  const int len = static_cast<int>(meshmuon::normuon_state_size(m, n));
  ASSERT_EQ(len, m >= n ? m : n);
  std::vector<float> v(len, 0.0f);
  std::vector<double> v_ref(len, 0.0);
  for (int step = 0; step < 5; ++step) {
    // Rows / columns of different scales so the per-row / per-column normalization is visible.
    std::vector<float> u = randn(static_cast<size_t>(m) * n, 300 + step);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) u[i * n + j] *= 1.0f + 0.1f * static_cast<float>((i + 2 * j) % 7);
    std::vector<double> u_ref(u.begin(), u.end());
    std::vector<float> u_split = u, v_split = v, mean(len);
    meshmuon::normuon_apply(u.data(), m, n, v.data(), beta2);
    meshmuon::normuon_mean_square(u_split.data(), m, n, mean.data());
    meshmuon::normuon_finish(u_split.data(), m, n, mean.data(), v_split.data(), beta2);
    expect_bitwise(u_split, u, "split passes vs apply");
    expect_bitwise(v_split, v, "split passes vs apply (state)");
    meshmuon::test::normuon_reference(u_ref.data(), m, n, v_ref.data(), beta2);
    // fp32 state and scaling vs double: a few roundings per step, relative 1e-5 is ample.
    expect_near_rel(v, v_ref, 1e-5, 1e-12, "v");
    expect_near_rel(u, u_ref, 1e-5, 1e-3, "U");
  }
}

INSTANTIATE_TEST_SUITE_P(TallWideSquare, NorMuonTest,
                         ::testing::Values(Shape2{37, 11}, Shape2{11, 37}, Shape2{16, 16},
                                           Shape2{1, 13}, Shape2{13, 1}, Shape2{64, 96}));

TEST(NorMuon, NormUsesTheWholeMatrix) {
  // Negative control: running the finish on the top half alone (with its own v_mean) differs from
  // the whole matrix, because the norm sums over all rows.
  const int m = 8, n = 4;
  std::vector<float> u = randn(m * n, 5), v(m, 0.0f), mean(m);
  for (int j = 0; j < n; ++j) u[j] *= 10.0f;  // one row much larger
  std::vector<float> whole = u, vw = v;
  meshmuon::normuon_apply(whole.data(), m, n, vw.data(), 0.9);
  std::vector<float> half(u.begin(), u.begin() + m / 2 * n), vh(m / 2, 0.0f);
  meshmuon::normuon_apply(half.data(), m / 2, n, vh.data(), 0.9);
  bool differs = false;
  for (int i = 0; i < m / 2 * n; ++i) differs = differs || half[i] != whole[i];
  EXPECT_TRUE(differs);
  // The zero matrix stays zero (no division by zero).
  std::vector<float> z(m * n, 0.0f), vz(m, 0.0f);
  meshmuon::normuon_apply(z.data(), m, n, vz.data(), 0.9);
  for (float x : z) EXPECT_EQ(x, 0.0f);
}

// NorMuon's β2 at its boundary values (nanochat checks none; Dion's NorMuon only β2 >= 0): β2 = 1
// leaves v exactly where it is (from v's initial zeros the scaling is the identity up to rounding:
// a uniform step 1e5 that the renormalization divides out); β2 = 0 makes v the last v_mean; β2 > 1
// extrapolates. Each against the double reference; negative and non-finite β2 refused.
class NorMuonEdgeTest : public ::testing::TestWithParam<double> {};

TEST_P(NorMuonEdgeTest, BoundaryBeta2IsTheRule) {
  const double beta2 = GetParam();
  for (auto [m, n] : {Shape2{13, 5}, Shape2{5, 13}}) {
    const int len = static_cast<int>(meshmuon::normuon_state_size(m, n));
    std::vector<float> v(len, 0.0f);
    std::vector<double> v_ref(len, 0.0);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> u = randn(static_cast<size_t>(m) * n, 700 + step);
      for (int i = 0; i < m; ++i) u[i * n] *= 3.0f;  // rows of different scales
      const std::vector<float> u0 = u, v0 = v;
      std::vector<double> u_ref(u.begin(), u.end());
      std::vector<float> mean(len);
      meshmuon::normuon_mean_square(u0.data(), m, n, mean.data());
      meshmuon::normuon_apply(u.data(), m, n, v.data(), beta2);
      meshmuon::test::normuon_reference(u_ref.data(), m, n, v_ref.data(), beta2);
      expect_near_rel(u, u_ref, 1e-5, 1e-3, "U");
      if (beta2 == 1.0) {
        expect_bitwise(v, v0, "v with beta2 = 1");
        for (size_t i = 0; i < u.size(); ++i) ASSERT_NEAR(u[i], u0[i], 1e-5 * std::max(1.0f, std::fabs(u0[i])));
      } else if (beta2 == 0.0) {
        expect_bitwise(v, mean, "v with beta2 = 0");
      } else {
        expect_near_rel(v, v_ref, 1e-5, 1e-12, "v");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Edges, NorMuonEdgeTest, ::testing::Values(0.0, 1.0, 1.5));

TEST(NorMuon, RefusesNegativeAndNonFiniteBeta2) {
  std::vector<float> u = randn(12, 3), v(4, 0.0f);
  const std::vector<float> u0 = u;
  for (double beta2 : {-0.1, std::numeric_limits<double>::infinity(), std::nan("")}) {
    const std::string msg = meshmuon::test::error_of([&] { meshmuon::normuon_apply(u.data(), 4, 3, v.data(), beta2); });
    EXPECT_NE(msg.find("[normuon] beta2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("must be finite and >= 0"), std::string::npos) << msg;
  }
  expect_bitwise(u, u0, "U after refused calls");
}

// ---- AdamW -----------------------------------------------------------------------------------

using AdamCase = std::tuple<int /*n*/, bool /*bf16*/, double /*wd*/>;
class AdamWTest : public ::testing::TestWithParam<AdamCase> {};

TEST_P(AdamWTest, MatchesReferencesOverSteps) {
  const auto [n, bf16, wd] = GetParam();
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<float> p = randn(n, 21), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> p_d(p.begin(), p.end()), m_d(n, 0.0), v_d(n, 0.0);
  std::vector<float> p_f = p, m_f(n, 0.0f), v_f(n, 0.0f);
  for (int t = 1; t <= 6; ++t) {
    std::vector<float> g = randn(n, 40 + t, 0.1f);
    const meshmuon::AdamWOptions o{lr, b1, b2, eps, wd, t};
    if (bf16) {
      const auto gb = to_bf16(g);
      for (int i = 0; i < n; ++i) g[i] = meshmuon::bf16_to_float(gb[i]);
      meshmuon::adamw_step(o, p.data(), gb.data(), m.data(), v.data(), n);
    } else {
      meshmuon::adamw_step(o, p.data(), g.data(), m.data(), v.data(), n);
    }
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (int i = 0; i < n; ++i) {
      // math reference (REFERENCE.md section 2), double
      p_d[i] *= 1 - lr * wd;
      m_d[i] = b1 * m_d[i] + (1 - b1) * g[i];
      v_d[i] = b2 * v_d[i] + (1 - b2) * g[i] * g[i];
      p_d[i] -= (lr / bc1) * m_d[i] / (std::sqrt(v_d[i] / bc2) + eps);
      // torch's fp32 order, op by op
      const float x = p_f[i] * static_cast<float>(1.0 - lr * wd);
      m_f[i] = lerp_fp32(m_f[i], g[i], static_cast<float>(1.0 - b1));
      v_f[i] = v_f[i] * static_cast<float>(b2);
      v_f[i] = v_f[i] + static_cast<float>(1.0 - b2) * g[i] * g[i];
      const float denom = std::sqrt(v_f[i]) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(eps);
      p_f[i] = x + static_cast<float>(-(lr / bc1)) * m_f[i] / denom;
    }
    expect_bitwise(p, p_f, "param (torch order)");
    expect_bitwise(m, m_f, "exp_avg (torch order)");
    expect_bitwise(v, v_f, "exp_avg_sq (torch order)");
    // m/sqrt(v) amplifies relative errors of v by 1/2 and of m by 1; a few fp32 roundings per step.
    expect_near_rel(p, p_d, 1e-5, 1e-1, "param (double)");
    expect_near_rel(m, m_d, 1e-5, 1e-2, "exp_avg (double)");  // cancellation: floor at |g|/10
    expect_near_rel(v, v_d, 1e-5, 1e-8, "exp_avg_sq (double)");
  }
}

INSTANTIATE_TEST_SUITE_P(SizesDtypesDecay, AdamWTest,
                         ::testing::Combine(::testing::Values(0, 1, 31, 1000), ::testing::Bool(),
                                            ::testing::Values(0.0, 0.1)));

TEST(AdamW, FirstStepIsBiasCorrected) {
  // t = 1 with zero state: m̂ = g, v̂ = g², so p moves by lr·g/(|g| + eps) ≈ lr·sign(g).
  std::vector<float> p{0.0f, 0.0f}, g{0.5f, -2.0f}, m(2, 0.0f), v(2, 0.0f);
  meshmuon::adamw_step({0.1, 0.9, 0.999, 1e-8, 0.0, 1}, p.data(), g.data(), m.data(), v.data(), 2);
  EXPECT_NEAR(p[0], -0.1, 1e-6);
  EXPECT_NEAR(p[1], 0.1, 1e-6);
  EXPECT_THROW(meshmuon::adamw_step({0.1, 0.9, 0.999, 1e-8, 0.0, 0}, p.data(), g.data(), m.data(),
                                 v.data(), 2),
               std::invalid_argument);
  EXPECT_THROW(meshmuon::adamw_step({0.1, 1.0, 0.999, 1e-8, 0.0, 1}, p.data(), g.data(), m.data(),
                                 v.data(), 2),
               std::invalid_argument);
  EXPECT_THROW(meshmuon::adamw_step({0.1, 0.9, 0.999, 0.0, 0.0, 1}, p.data(), g.data(), m.data(),
                                 v.data(), 2),
               std::invalid_argument);
}

}  // namespace
