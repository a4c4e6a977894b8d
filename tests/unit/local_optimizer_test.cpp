// LocalOptimizer: a 5-step run over Muon matrices (tall, wide, QK-tagged), an expert stack and AdamW
// parameters against a step-by-step double reference written here (its own Newton–Schulz), then
// bad inputs (each must throw or skip and leave parameters, state and counters bitwise unchanged).
// Run: build/bin/local_optimizer_test
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "meshmuon/bf16.h"
#include "meshmuon/blas.h"
#include "meshmuon/local_optimizer.h"
#include "meshmuon/optimizer.h"
#include "meshmuon/plan.h"
#include "test_support.h"

namespace {

using meshmuon::Algorithm;
using meshmuon::GroupOptions;
using meshmuon::ParamGroup;
using meshmuon::ParamInfo;
using meshmuon::Shape;
using meshmuon::TensorView;

using Mat = std::vector<double>;

// ---- double reference ------------------------------------------------------------------------

struct Coef { double a, b, c; };
const std::vector<Coef> kJordan(5, Coef{3.4445, -4.7750, 2.0315});
const std::vector<Coef> kPolarExpress = {  // REFERENCE.md section 1, `polar_express` row
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};

Mat matmul(const Mat& x, const Mat& y, int m, int k, int n) {  // (m×k)(k×n)
  Mat z(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int l = 0; l < k; ++l)
      for (int j = 0; j < n; ++j) z[i * n + j] += x[i * k + l] * y[l * n + j];
  return z;
}

Mat transpose(const Mat& x, int m, int n) {
  Mat t(x.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) t[j * m + i] = x[i * n + j];
  return t;
}

// X = G / (‖G‖_F + 1e-7); on the wide side: A = XXᵀ, X ← aX + (bA + cA²)X.
Mat newton_schulz(Mat g, int m, int n, const std::vector<Coef>& coefs) {
  if (m > n) return transpose(newton_schulz(transpose(g, m, n), n, m, coefs), n, m);
  double norm = 0;
  for (double v : g) norm += v * v;
  norm = std::sqrt(norm);
  for (double& v : g) v /= norm + 1e-7;
  for (const Coef& c : coefs) {
    const Mat a = matmul(g, transpose(g, m, n), m, n, m);
    const Mat aa = matmul(a, a, m, m, m);
    Mat b(a.size());
    for (size_t i = 0; i < a.size(); ++i) b[i] = c.b * a[i] + c.c * aa[i];
    const Mat bx = matmul(b, g, m, m, n);
    for (size_t i = 0; i < g.size(); ++i) g[i] = c.a * g[i] + bx[i];
  }
  return g;
}


// ---- the model -------------------------------------------------------------------------------

using meshmuon::test::randn;

std::vector<ParamInfo> model_params() {
  std::vector<ParamInfo> p = {{"w_tall", {24, 10}},        {"w_wide", {10, 24}},
                              {"experts", {3, 12, 8}, true}, {"wq", {8, 12}},
                              {"bias", {16}},              {"embed", {20, 6}}};
  p[3].qk = meshmuon::QkTag{0, meshmuon::QkKind::Q, 2, 4};
  return p;
}

std::vector<ParamGroup> model_groups() {
  GroupOptions g0;  // Muon, EMA Nesterov, original LR rule, NorMuon + cautious, Jordan NS
  g0.lr = 0.02;
  g0.weight_decay = 0.1;
  g0.normuon = true;
  g0.cautious_wd = true;
  GroupOptions g1;  // Muon, heavy ball, match_rms_adamw, Polar Express, QK-clip
  g1.lr = 0.01;
  g1.weight_decay = 0.05;
  g1.momentum = 0.9;
  g1.nesterov = false;
  g1.momentum_kind = meshmuon::MomentumKind::HeavyBall;
  g1.lr_rule = meshmuon::LrRule::MatchRmsAdamw;
  g1.ns.schedule = meshmuon::Schedule::PolarExpress;
  g1.qk_clip_threshold = 5.0;
  GroupOptions g2;  // AdamW
  g2.algorithm = Algorithm::AdamW;
  g2.lr = 3e-3;
  g2.weight_decay = 0.01;
  return {{g0, {0, 1}}, {g1, {2, 3}}, {g2, {4, 5}}};
}

struct Tensors {
  std::vector<std::vector<float>> params, grads;
  std::vector<std::vector<meshmuon::BFloat16>> grads_bf16;
  std::vector<TensorView> pv, gv;

  Tensors(const std::vector<ParamInfo>& info, uint32_t seed) {
    for (size_t i = 0; i < info.size(); ++i)
      params.push_back(randn(static_cast<size_t>(info[i].shape.numel()), seed + 17 * i, 0.5f));
    grads.resize(info.size());
    grads_bf16.resize(info.size());
  }
  // Gradients of step t; parameter 0's gradient is passed as bf16.
  void make_grads(const std::vector<ParamInfo>& info, int t) {
    pv.clear();
    gv.clear();
    for (size_t i = 0; i < info.size(); ++i) {
      grads[i] = randn(params[i].size(), 1000 * t + i, 1.0f);
      pv.emplace_back(params[i].data(), info[i].shape);
      if (i == 0) {
        grads_bf16[i].resize(grads[i].size());
        for (size_t j = 0; j < grads[i].size(); ++j) {
          grads_bf16[i][j] = meshmuon::float_to_bf16(grads[i][j]);
          grads[i][j] = meshmuon::bf16_to_float(grads_bf16[i][j]);
        }
        gv.emplace_back(grads_bf16[i].data(), info[i].shape);
      } else {
        gv.emplace_back(grads[i].data(), info[i].shape);
      }
    }
  }
};

// Per-query-head max logits of layer 0 at step t: head 1 above τ = 5 on odd steps.
std::map<int, std::vector<float>> logits_at(int t) {
  return {{0, {3.0f, t % 2 ? 8.0f + t : 4.0f}}};
}

TEST(LocalOptimizer, FiveStepsMatchDoubleReference) {
  const auto info = model_params();
  meshmuon::LocalOptimizer opt(info, model_groups());
  Tensors x(info, 1);
  const auto groups = model_groups();

  // Reference state.
  std::vector<Mat> p_ref, buf, m1, m2, nv;
  std::vector<std::vector<bool>> ambiguous;  // cautious mask too close to call (see below)
  for (size_t i = 0; i < info.size(); ++i) {
    p_ref.emplace_back(x.params[i].begin(), x.params[i].end());
    buf.emplace_back(x.params[i].size(), 0.0);
    m1.emplace_back(x.params[i].size(), 0.0);
    m2.emplace_back(x.params[i].size(), 0.0);
    nv.emplace_back(64, 0.0);
    ambiguous.emplace_back(x.params[i].size(), false);
  }
  std::vector<GroupOptions> go = {groups[0].options, groups[1].options, groups[2].options};
  for (int t = 1; t <= 5; ++t) {
    if (t == 3) {  // an LR schedule changes lr between steps
      go[0].lr = opt.options(0).lr = 0.01;
      go[2].lr = opt.options(2).lr = 1e-3;
    }
    x.make_grads(info, t);
    const auto logits = logits_at(t);
    ASSERT_TRUE(opt.step(x.pv, x.gv, logits));

    for (size_t g = 0; g < 3; ++g) {
      const GroupOptions& o = go[g];
      for (size_t i : groups[g].params) {
        Mat& p = p_ref[i];
        const std::vector<float>& gr = x.grads[i];
        if (o.algorithm == Algorithm::AdamW) {
          const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
          for (size_t j = 0; j < p.size(); ++j) {
            p[j] *= 1 - o.lr * o.weight_decay;
            m1[i][j] = o.beta1 * m1[i][j] + (1 - o.beta1) * gr[j];
            m2[i][j] = o.beta2 * m2[i][j] + (1 - o.beta2) * gr[j] * gr[j];
            p[j] -= o.lr / bc1 * m1[i][j] / (std::sqrt(m2[i][j] / bc2) + o.eps);
          }
          continue;
        }
        const Shape& s = info[i].shape;
        const int e = info[i].expert_stack ? static_cast<int>(s[0]) : 1;
        const int rows = static_cast<int>(info[i].expert_stack ? s[1] : s[0]);
        const int cols = static_cast<int>(info[i].expert_stack ? s[2] : s[1]);
        const double mu = o.momentum;
        Mat u(p.size());
        for (size_t j = 0; j < p.size(); ++j) {
          if (o.momentum_kind == meshmuon::MomentumKind::Ema) {
            buf[i][j] = mu * buf[i][j] + (1 - mu) * gr[j];
            u[j] = o.nesterov ? (1 - mu) * gr[j] + mu * buf[i][j] : buf[i][j];
          } else {
            buf[i][j] = mu * buf[i][j] + gr[j];
            u[j] = o.nesterov ? gr[j] + mu * buf[i][j] : buf[i][j];
          }
        }
        const auto& coefs = o.ns.schedule == meshmuon::Schedule::PolarExpress ? kPolarExpress : kJordan;
        const size_t mat = static_cast<size_t>(rows) * cols;
        const int len = rows >= cols ? rows : cols;
        for (int k = 0; k < e; ++k) {
          Mat one(u.begin() + k * mat, u.begin() + (k + 1) * mat);
          one = newton_schulz(one, rows, cols, coefs);
          if (o.normuon) meshmuon::test::normuon_reference(one.data(), rows, cols, nv[i].data() + k * len, o.normuon_beta2);
          std::copy(one.begin(), one.end(), u.begin() + k * mat);
        }
        const double lr_adj = o.lr_rule == meshmuon::LrRule::Original
                                   ? o.lr * std::sqrt(std::max(1.0, double(rows) / cols))
                                   : o.lr * 0.2 * std::sqrt(double(std::max(rows, cols)));
        for (size_t j = 0; j < p.size(); ++j) {
          if (o.cautious_wd) {
            // fp32 NS differs from this double one by ~1e-5 relative: where U·p is that close to
            // 0 the mask may legitimately differ (a jump of lr·wd·|p|), so such elements are marked.
            if (std::fabs(u[j]) < 1e-3 || std::fabs(p[j]) < 1e-5) ambiguous[i][j] = true;
            const bool decay = u[j] * p[j] >= 0;
            p[j] = p[j] - lr_adj * u[j] - (decay ? o.lr * o.weight_decay * p[j] : 0.0);
          } else {
            p[j] = p[j] * (1 - o.lr * o.weight_decay) - lr_adj * u[j];
          }
        }
        if (o.qk_clip_threshold > 0 && info[i].qk) {
          const auto& tag = *info[i].qk;
          for (int r = 0; r < rows; ++r) {
            const double sh = logits.at(0)[r / tag.head_dim];
            const double gamma = sh > o.qk_clip_threshold ? o.qk_clip_threshold / sh : 1.0;
            for (int c = 0; c < cols; ++c) p[r * cols + c] *= std::sqrt(gamma);
          }
        }
      }
    }
  }

  // Tolerance: fp32 BLAS Newton–Schulz agrees with this double one to ~1e-5 relative; updates are
  // lr-scaled (|lr_adj·U| ≲ 0.01), and fp32 parameter roundings add ~6e-8 per step. Observed
  // worst difference 4e-7; 5e-6 leaves margin and still catches a 1% lr error (4e-5).
  int ambiguous_count = 0;
  for (size_t i = 0; i < info.size(); ++i) {
    EXPECT_EQ(opt.step_count(i), 5);
    for (size_t j = 0; j < p_ref[i].size(); ++j) {
      const double tol = 5e-6 + (ambiguous[i][j] ? 5 * 0.02 * 0.1 * std::fabs(p_ref[i][j]) : 0.0);
      ambiguous_count += ambiguous[i][j];
      ASSERT_NEAR(x.params[i][j], p_ref[i][j], tol) << info[i].name << " element " << j;
    }
  }
  EXPECT_LT(ambiguous_count, 40);
  // State: momentum buffers, NorMuon second moments and Adam moments.
  for (size_t i : {0u, 1u, 2u, 3u}) {
    const TensorView b = opt.state(i, "momentum_buffer");
    for (size_t j = 0; j < buf[i].size(); ++j)
      ASSERT_NEAR(b.f32()[j], buf[i][j], 1e-5 * std::max(1.0, std::fabs(buf[i][j])));
  }
  for (size_t i : {0u, 1u}) {
    const TensorView v = opt.state(i, "normuon_v");
    EXPECT_EQ(v.shape, i == 0 ? Shape({24, 1}) : Shape({1, 24}));
    for (int64_t j = 0; j < v.numel(); ++j) ASSERT_NEAR(v.f32()[j], nv[i][j], 1e-4 * nv[i][j]);
  }
  for (size_t i : {4u, 5u}) {
    const TensorView a = opt.state(i, "exp_avg"), b = opt.state(i, "exp_avg_sq");
    for (size_t j = 0; j < m1[i].size(); ++j) {
      ASSERT_NEAR(a.f32()[j], m1[i][j], 1e-5);
      ASSERT_NEAR(b.f32()[j], m2[i][j], 1e-5 * m2[i][j] + 1e-9);
    }
  }
  EXPECT_THROW(opt.state(4, "momentum_buffer"), std::invalid_argument);
  EXPECT_EQ(opt.state_keys(2), (std::vector<std::string>{"momentum_buffer"}));
}

TEST(LocalOptimizer, DeterministicAndEagerState) {
  const auto info = model_params();
  meshmuon::LocalOptimizer a(info, model_groups()), b(info, model_groups());
  for (size_t i = 0; i < info.size(); ++i) {  // all state exists, zero, before any step
    for (const std::string& k : a.state_keys(i)) {
      const TensorView v = a.state(i, k);
      for (int64_t j = 0; j < v.numel(); ++j) ASSERT_EQ(v.f32()[j], 0.0f);
    }
    EXPECT_EQ(a.step_count(i), 0);
  }
  Tensors xa(info, 5), xb(info, 5);
  for (int t = 1; t <= 2; ++t) {
    xa.make_grads(info, t);
    xb.make_grads(info, t);
    a.step(xa.pv, xa.gv, logits_at(t));
    b.step(xb.pv, xb.gv, logits_at(t));
  }
  for (size_t i = 0; i < info.size(); ++i)
    ASSERT_EQ(std::memcmp(xa.params[i].data(), xb.params[i].data(), xa.params[i].size() * 4), 0);
}

// Parameters on several threads: bitwise the same as one after another, for fp32 and bf16 products
// (each parameter's arithmetic does not depend on the thread that runs it, nor on BLAS threads).
TEST(LocalOptimizer, ThreadCountDoesNotChangeAnyBit) {
  const auto info = model_params();
  for (bool bf16 : {false, true}) {
    auto groups = model_groups();
    if (bf16) groups[0].options.ns.matmul_dtype = meshmuon::DType::BF16;
    std::vector<std::vector<float>> first;
    for (int threads : {1, 2, 3, 0}) {
      meshmuon::LocalOptimizerOptions o;
      o.threads = threads;
      meshmuon::LocalOptimizer opt(info, groups, o);
      Tensors x(info, 5);
      for (int t = 1; t <= 2; ++t) {
        x.make_grads(info, t);
        ASSERT_TRUE(opt.step(x.pv, x.gv, logits_at(t)));
      }
      std::vector<std::vector<float>> got = x.params;
      for (size_t i = 0; i < info.size(); ++i)
        for (const std::string& k : opt.state_keys(i)) {
          const TensorView v = opt.state(i, k);
          got.emplace_back(v.f32(), v.f32() + v.numel());
        }
      if (first.empty()) first = got;
      EXPECT_EQ(got, first) << "threads " << threads << (bf16 ? " bf16" : " fp32");
    }
    // Negative control: the comparison sees a change in one group's lr.
    groups[1].options.lr *= 1.01;
    meshmuon::LocalOptimizerOptions o;
    o.threads = 2;
    meshmuon::LocalOptimizer opt(info, groups, o);
    Tensors x(info, 5);
    x.make_grads(info, 1);
    opt.step(x.pv, x.gv, logits_at(1));
    x.make_grads(info, 2);
    opt.step(x.pv, x.gv, logits_at(2));
    EXPECT_NE(x.params, std::vector<std::vector<float>>(first.begin(), first.begin() + info.size()));
  }
  meshmuon::LocalOptimizerOptions bad;
  bad.threads = -1;
  EXPECT_THROW(meshmuon::LocalOptimizer(info, model_groups(), bad), std::invalid_argument);
}

// ---- bad inputs ------------------------------------------------------------------------------

struct Snapshot {
  std::vector<std::vector<float>> params, state;
  std::vector<int64_t> counts;
};

Snapshot snapshot(meshmuon::LocalOptimizer& opt, const Tensors& x) {
  Snapshot s{x.params, {}, {}};
  for (size_t i = 0; i < opt.params().size(); ++i) {
    for (const std::string& k : opt.state_keys(i)) {
      const TensorView v = opt.state(i, k);
      s.state.emplace_back(v.f32(), v.f32() + v.numel());
    }
    s.counts.push_back(opt.step_count(i));
  }
  return s;
}

void expect_unchanged(meshmuon::LocalOptimizer& opt, const Tensors& x, const Snapshot& before) {
  const Snapshot now = snapshot(opt, x);
  ASSERT_EQ(now.params.size(), before.params.size());
  for (size_t i = 0; i < now.params.size(); ++i)
    ASSERT_EQ(std::memcmp(now.params[i].data(), before.params[i].data(), now.params[i].size() * 4), 0)
        << "parameter " << i << " changed";
  for (size_t i = 0; i < now.state.size(); ++i)
    ASSERT_EQ(std::memcmp(now.state[i].data(), before.state[i].data(), now.state[i].size() * 4), 0)
        << "state " << i << " changed";
  EXPECT_EQ(now.counts, before.counts);
}

template <class E, class F>
void expect_throw_naming(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    x_.make_grads(info_, 1);
    ASSERT_TRUE(opt_.step(x_.pv, x_.gv, logits_at(1)));  // non-zero state to protect
    x_.make_grads(info_, 2);
    before_ = snapshot(opt_, x_);
  }
  std::vector<ParamInfo> info_ = model_params();
  meshmuon::LocalOptimizer opt_{info_, model_groups()};
  Tensors x_{info_, 3};
  Snapshot before_;
};

// torch's `grad is None`: a parameter without a gradient keeps its values, state and step count;
// the others step exactly as if it were not there (bitwise as a run that gives it a gradient).
TEST_F(BadInput, AbsentGradientLeavesThatParameterAlone) {
  meshmuon::LocalOptimizer twin{info_, model_groups()};
  Tensors y{info_, 3};
  y.make_grads(info_, 1);
  ASSERT_TRUE(twin.step(y.pv, y.gv, logits_at(1)));
  y.make_grads(info_, 2);
  for (size_t absent : {size_t{1}, size_t{2}, size_t{5}}) x_.gv[absent] = TensorView();  // Muon, stack, AdamW
  ASSERT_TRUE(opt_.step(x_.pv, x_.gv, logits_at(2)));
  ASSERT_TRUE(twin.step(y.pv, y.gv, logits_at(2)));
  const Snapshot now = snapshot(opt_, x_);
  size_t k = 0;
  for (size_t i = 0; i < info_.size(); ++i) {
    const bool absent = i == 1 || i == 2 || i == 5;
    const std::vector<float>& want = absent ? before_.params[i] : y.params[i];
    EXPECT_EQ(std::memcmp(now.params[i].data(), want.data(), want.size() * 4), 0) << info_[i].name;
    EXPECT_EQ(now.counts[i], absent ? 1 : 2) << info_[i].name;
    for (size_t j = 0; j < opt_.state_keys(i).size(); ++j, ++k)
      if (absent) EXPECT_EQ(now.state[k], before_.state[k]) << info_[i].name << " state changed";
  }
}

TEST_F(BadInput, NonFiniteGradientRaisesNamingTheParameter) {
  x_.grads[5][7] = NAN;  // "embed" (AdamW)
  expect_throw_naming<meshmuon::Error>([&] { opt_.step(x_.pv, x_.gv, logits_at(2)); }, "'embed'");
  expect_unchanged(opt_, x_, before_);
  x_.grads[5][7] = 0.0f;
  x_.grads_bf16[0][3] = meshmuon::float_to_bf16(INFINITY);  // "w_tall" (Muon, bf16 gradient)
  expect_throw_naming<meshmuon::Error>([&] { opt_.step(x_.pv, x_.gv, logits_at(2)); }, "'w_tall'");
  expect_unchanged(opt_, x_, before_);
}

TEST_F(BadInput, NonFiniteGradientSkipReturnsFalse) {
  opt_.set_policy(meshmuon::NonFinitePolicy::Skip);
  x_.grads[2][0] = -INFINITY;
  EXPECT_FALSE(opt_.step(x_.pv, x_.gv, logits_at(2)));
  expect_unchanged(opt_, x_, before_);
  x_.grads[2][0] = 0.0f;  // negative control: a finite step does change things
  EXPECT_TRUE(opt_.step(x_.pv, x_.gv, logits_at(2)));
  EXPECT_NE(std::memcmp(x_.params[2].data(), before_.params[2].data(), x_.params[2].size() * 4), 0);
  EXPECT_EQ(opt_.step_count(2), 2);
}

TEST_F(BadInput, ShapeDtypeContiguityLogitsAndOptions) {
  const auto logits = logits_at(2);
  auto pv = x_.pv, gv = x_.gv;
  pv[1] = TensorView(x_.params[1].data(), Shape{24, 10});  // transposed shape
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, logits); }, "'w_wide'");
  pv = x_.pv;
  gv[3] = TensorView(x_.grads[3].data(), Shape{96});
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, logits); }, "'wq'");
  gv = x_.gv;
  pv[4] = TensorView(x_.params[4].data(), meshmuon::DType::BF16, Shape{16});
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, logits); }, "'bias'");
  pv = x_.pv;
  pv[5] = TensorView(x_.params[5].data(), meshmuon::DType::F32, Shape{20, 6}, Shape{1, 20});
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, logits); }, "'embed'");
  pv = x_.pv;
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, {}); }, "'wq'");
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, {{0, {1.0f, 2.0f, 3.0f}}}); },
                                             "'wq'");
  opt_.options(1).momentum = -0.5;  // >= 0 only (1 and above are torch.optim.Muon's range)
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, logits); }, "momentum");
  opt_.options(1).momentum = 0.9;
  opt_.options(2).eps = 0.0;
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, logits); }, "eps");
  opt_.options(2).eps = 1e-8;
  opt_.options(0).lr = -1.0;
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, logits); }, "lr");
  opt_.options(0).lr = 0.02;
  opt_.options(0).ns.steps = 0;
  EXPECT_THROW(opt_.step(pv, gv, logits), std::invalid_argument);
  opt_.options(0).ns.steps = 5;
  opt_.options(1).normuon = true;  // its state was not created at construction
  expect_throw_naming<std::invalid_argument>([&] { opt_.step(pv, gv, logits); }, "normuon");
  opt_.options(1).normuon = false;
  EXPECT_THROW(opt_.step(std::span<const TensorView>(pv).first(5), gv, logits), std::invalid_argument);
  expect_unchanged(opt_, x_, before_);
  EXPECT_TRUE(opt_.step(pv, gv, logits));  // negative control: the restored inputs are accepted
}

TEST(LocalOptimizerSetup, RejectsBadGroupingNamingTheParameter) {
  auto info = model_params();
  auto groups = model_groups();
  groups[0].params.push_back(4);  // "bias" (1-D) into a Muon group and into AdamW group 2
  expect_throw_naming<std::invalid_argument>([&] { meshmuon::LocalOptimizer(info, groups); },
                                             "'bias' is in groups 0 and 2");
  groups = model_groups();
  groups[2].params = {5};
  groups[0].params.push_back(4);  // 1-D in Muon only
  expect_throw_naming<std::invalid_argument>([&] { meshmuon::LocalOptimizer(info, groups); }, "AdamW");
  expect_throw_naming<std::invalid_argument>([&] { meshmuon::LocalOptimizer(info, groups); }, "'bias'");
  groups = model_groups();
  info[2].expert_stack = false;  // 3-D without expert_stack in Muon
  expect_throw_naming<std::invalid_argument>([&] { meshmuon::LocalOptimizer(info, groups); }, "'experts'");
  info = model_params();
  groups[2].params = {4};  // "embed" in no group
  expect_throw_naming<std::invalid_argument>([&] { meshmuon::LocalOptimizer(info, groups); }, "'embed'");
  groups = model_groups();
  info[3].qk->heads = 3;  // tag describes 12 rows, the weight has 8
  expect_throw_naming<std::invalid_argument>([&] { meshmuon::LocalOptimizer(info, groups); }, "'wq'");
  info = model_params();
  groups[2].options.beta2 = 1.0;
  expect_throw_naming<std::invalid_argument>([&] { meshmuon::LocalOptimizer(info, groups); }, "beta2");
  EXPECT_NO_THROW(meshmuon::LocalOptimizer(model_params(), model_groups()));  // negative control
  EXPECT_EQ(meshmuon::parse_algorithm("adamw"), Algorithm::AdamW);
  EXPECT_EQ(meshmuon::to_string(meshmuon::MomentumKind::HeavyBall), "heavy_ball");
  EXPECT_EQ(meshmuon::parse_non_finite_policy("skip"), meshmuon::NonFinitePolicy::Skip);
  EXPECT_THROW(meshmuon::parse_momentum_kind("nesterov"), std::invalid_argument);
}

// ---- one engine: edge shapes, threads, environment ---------------------------------------------

// Empty matrices and stacks, 1-D and empty AdamW parameters, a bf16 gradient and an absent one,
// NorMuon on: every thread count gives bitwise the results of threads = 1; a skipped step modifies
// nothing.
// Group ranges at their ends: momentum and normuon_beta2 take any finite value >= 0 (torch.optim.Muon
// and Dion check only >= 0; 1 freezes an EMA or NorMuon's v), AdamW's betas [0, 1) (1 divides by
// 1 - beta^t = 0 in every peer's bias correction).
TEST(GroupOptionsRanges, BoundaryValues) {
  using meshmuon::test::error_of;
  const double inf = std::numeric_limits<double>::infinity();
  for (double x : {0.0, 1.0, 1.5}) {
    GroupOptions o;
    o.momentum = x;
    o.normuon = true;
    o.normuon_beta2 = x;
    EXPECT_EQ(error_of([&] { meshmuon::validate_group_options(o, 0); }), "") << x;
  }
  for (double x : {-1e-12, -0.5, inf, std::nan("")}) {
    GroupOptions o;
    o.momentum = x;
    EXPECT_NE(error_of([&] { meshmuon::validate_group_options(o, 2); }).find("group 2: momentum"), std::string::npos);
    o = GroupOptions{};
    o.normuon_beta2 = x;
    const std::string msg = error_of([&] { meshmuon::validate_group_options(o, 2); });
    EXPECT_NE(msg.find("group 2: normuon_beta2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("must be finite and >= 0"), std::string::npos) << msg;
  }
  GroupOptions a;
  a.algorithm = Algorithm::AdamW;
  a.beta1 = 1.0;
  EXPECT_NE(error_of([&] { meshmuon::validate_group_options(a, 1); }).find("beta1 1 is outside [0, 1)"), std::string::npos);
}

TEST(LocalOptimizerEngine, EdgeShapesBitwiseOnEveryThreadCount) {
  std::vector<ParamInfo> info = {{"rows0", {0, 16}},       {"cols0", {16, 0}},   {"stack0", {0, 4, 4}, true},
                                 {"stack_empty", {2, 0, 5}, true}, {"w", {40, 24}}, {"w_t", {24, 40}},
                                 {"stack", {3, 6, 10}, true}, {"bias", {7}},        {"bias0", {0}},
                                 {"one", {1}}};
  GroupOptions muon, adamw;
  muon.normuon = true;
  muon.cautious_wd = true;
  adamw.algorithm = Algorithm::AdamW;
  const std::vector<ParamGroup> groups = {{muon, {0, 1, 2, 3, 4, 5, 6}}, {adamw, {7, 8, 9}}};
  std::vector<std::vector<float>> first;
  for (int threads : {1, 2, 4, 0}) {
    meshmuon::LocalOptimizerOptions o;
    o.threads = threads;
    meshmuon::LocalOptimizer opt(info, groups, o);
    Tensors x(info, 11);
    for (int t = 1; t <= 3; ++t) {
      x.make_grads(info, t);  // parameter 0's gradient is bf16 (an empty one here); make 4's bf16 too
      std::vector<meshmuon::BFloat16> wb(x.grads[4].size());
      for (size_t j = 0; j < wb.size(); ++j) wb[j] = meshmuon::float_to_bf16(x.grads[4][j]);
      x.gv[4] = TensorView(wb.data(), info[4].shape);
      if (t == 2) x.gv[5] = x.gv[7] = TensorView();  // no gradient: left alone
      ASSERT_TRUE(opt.step(x.pv, x.gv));
    }
    EXPECT_EQ(opt.step_count(5), 2);
    EXPECT_EQ(opt.step_count(7), 2);
    EXPECT_EQ(opt.step_count(8), 3);
    std::vector<std::vector<float>> got = x.params;
    for (size_t i = 0; i < info.size(); ++i)
      for (const std::string& k : opt.state_keys(i)) {
        const TensorView v = opt.state(i, k);
        got.emplace_back(v.f32(), v.f32() + v.numel());
      }
    if (first.empty()) first = got;
    EXPECT_EQ(got, first) << "threads " << threads;
    // Skip: a non-finite gradient returns false and modifies nothing.
    opt.set_policy(meshmuon::NonFinitePolicy::Skip);
    EXPECT_EQ(opt.policy(), meshmuon::NonFinitePolicy::Skip);
    x.make_grads(info, 4);
    x.grads[9][0] = NAN;
    const Snapshot before = snapshot(opt, x);
    EXPECT_FALSE(opt.step(x.pv, x.gv));
    expect_unchanged(opt, x, before);
  }
}

// threads ≥ 2 runs the step's products on one BLAS thread and restores the count after; set_threads
// changes later steps. Observed from the state hooks, which run on the step's own thread.
TEST(LocalOptimizerEngine, ThreadsSetBlasToOneDuringTheStepAndRestoreIt) {
  const int outside = 2;
  meshmuon::blas_set_num_threads(outside);
  if (meshmuon::blas_get_num_threads() != outside) GTEST_SKIP() << "the BLAS does not take 2 threads here";
  const auto info = model_params();
  std::vector<int> seen;
  meshmuon::LocalOptimizerOptions o;
  o.state_hooks.acquire = [&](std::span<const size_t>) { seen.push_back(meshmuon::blas_get_num_threads()); };
  meshmuon::LocalOptimizer opt(info, model_groups(), o);
  Tensors x(info, 2);
  for (int threads : {1, 2, 0, 4, 1}) {
    opt.set_threads(threads);
    EXPECT_EQ(opt.threads(), threads);
    seen.clear();
    x.make_grads(info, 1);
    ASSERT_TRUE(opt.step(x.pv, x.gv, logits_at(1)));
    ASSERT_FALSE(seen.empty());
    for (int b : seen) EXPECT_EQ(b, threads == 1 ? outside : 1) << "threads " << threads;
    EXPECT_EQ(meshmuon::blas_get_num_threads(), outside) << "threads " << threads;
  }
  EXPECT_THROW(opt.set_threads(-1), std::invalid_argument);
}

// The facade exposes its engine's one-rank plan (every Muon parameter computed in place, nothing
// sent) and the last step's counters (times; no bytes on one rank).
TEST(LocalOptimizerEngine, PlanAndLastStats) {
  const auto info = model_params();
  meshmuon::LocalOptimizer opt(info, model_groups());
  const meshmuon::Plan& plan = opt.plan();
  EXPECT_EQ(plan.world_size(), 1);
  ASSERT_EQ(plan.entries().size(), 4u);  // the Muon parameters; bias and embed are AdamW
  for (const meshmuon::PlanEntry& e : plan.entries()) {
    const bool stack = info[static_cast<size_t>(e.param)].expert_stack;
    EXPECT_EQ(e.strategy, stack ? meshmuon::Strategy::ExpertLocal : meshmuon::Strategy::Local) << e.param;
  }
  EXPECT_EQ(plan.total().bytes_sent_max, 0);
  EXPECT_EQ(plan.options().window, 1);
  EXPECT_FALSE(opt.last_stats().applied);  // before the first step
  EXPECT_EQ(opt.last_stats().step_seconds, 0);
  Tensors x(info, 3);
  x.make_grads(info, 1);
  ASSERT_TRUE(opt.step(x.pv, x.gv, logits_at(1)));
  const meshmuon::StepStats& stats = opt.last_stats();
  EXPECT_TRUE(stats.applied);
  EXPECT_GT(stats.step_seconds, 0);
  EXPECT_GT(stats.orthogonalize_seconds, 0);
  EXPECT_EQ(stats.bytes_sent, 0u);
  EXPECT_EQ(stats.chunks, static_cast<int>(plan.chunks().size()));
}

// MESHMUON_STRATEGY steers distributed plans only: LocalOptimizer does not read it (an invalid value
// would throw if it did).
TEST(LocalOptimizerEngine, IgnoresTheStrategyEnvironment) {
  ASSERT_EQ(setenv("MESHMUON_STRATEGY", "default:no_such_strategy", 1), 0);
  EXPECT_NO_THROW(meshmuon::LocalOptimizer(model_params(), model_groups()));
  unsetenv("MESHMUON_STRATEGY");
}

}  // namespace
