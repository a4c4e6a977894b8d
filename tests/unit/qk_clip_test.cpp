// QK-clip row scaling for MHA, GQA (group-min rule) and MLA (q with rope rows, q_pe, kv with value
// rows), checked against per-head loops written here, and local row ranges against the whole
// parameter. Run: build/bin/qk_clip_test
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "meshmuon/qk_clip.h"
#include "test_support.h"

namespace {

using meshmuon::QkKind;
using meshmuon::QkTag;

using meshmuon::test::randn;

double gamma_of(float s, double tau) { return s > tau ? tau / s : 1.0; }

// Expected matrix: per head block, per row role, the factor applied to every column.
// role(h, offset) returns the power of γ: 0 (untouched), 1 (× γ) or 0.5 (× sqrt γ).
template <class Role>
std::vector<float> expected(const std::vector<float>& w, int heads, int block, int cols,
                            const std::vector<double>& gamma_per_head, Role role) {
  std::vector<float> out = w;
  for (int h = 0; h < heads; ++h) {
    for (int off = 0; off < block; ++off) {
      const double power = role(off);
      if (power == 0.0) continue;
      const float f = static_cast<float>(power == 1.0 ? gamma_per_head[h] : std::sqrt(gamma_per_head[h]));
      for (int c = 0; c < cols; ++c) out[(h * block + off) * cols + c] = w[(h * block + off) * cols + c] * f;
    }
  }
  return out;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  if (!a.empty()) EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

const double kTau = 100.0;
const std::vector<float> kLogits4 = {50.0f, 120.0f, 99.5f, 400.0f};  // γ = 1, 5/6, 1, 1/4

TEST(QkClip, MhaQueryAndKeyRowsTimesSqrtGamma) {
  const int heads = 4, hd = 3, cols = 5;
  std::vector<double> g;
  for (float s : kLogits4) g.push_back(gamma_of(s, kTau));
  for (QkKind kind : {QkKind::Q, QkKind::K, QkKind::QNope, QkKind::KNope}) {
    const QkTag tag{0, kind, heads, hd};
    std::vector<float> w = randn(heads * hd * cols, 1);
    const auto want = expected(w, heads, hd, cols, g, [](int) { return 0.5; });
    meshmuon::qk_clip_rows(tag, kLogits4, kTau, w.data(), 0, heads * hd, cols);
    expect_bitwise(w, want);
  }
  // Heads at or below τ are untouched (bitwise), above τ they change (negative control).
  std::vector<float> w = randn(heads * hd * cols, 2), w0 = w;
  meshmuon::qk_clip_rows({0, QkKind::Q, heads, hd}, kLogits4, kTau, w.data(), 0, heads * hd, cols);
  for (int c = 0; c < hd * cols; ++c) EXPECT_EQ(w[c], w0[c]);
  for (int c = hd * cols; c < 2 * hd * cols; ++c) EXPECT_NE(w[c], w0[c]);
}

TEST(QkClip, QPeTimesGamma) {
  const int heads = 4, hd = 2, cols = 3;
  std::vector<double> g;
  for (float s : kLogits4) g.push_back(gamma_of(s, kTau));
  std::vector<float> w = randn(heads * hd * cols, 3);
  const auto want = expected(w, heads, hd, cols, g, [](int) { return 1.0; });
  meshmuon::qk_clip_rows({0, QkKind::QPe, heads, hd}, kLogits4, kTau, w.data(), 0, heads * hd, cols);
  expect_bitwise(w, want);
}

TEST(QkClip, GqaKeyHeadTakesSmallestGammaOfItsGroup) {
  // 8 query heads, 2 key heads: key head j serves query heads [4j, 4j + 4).
  const std::vector<float> logits = {10, 150, 120, 90, 300, 101, 20, 30};
  const int kheads = 2, hd = 4, cols = 6;
  const std::vector<double> gmin = {kTau / 150.0, kTau / 300.0};
  std::vector<float> w = randn(kheads * hd * cols, 4), w0 = w;
  const auto want = expected(w, kheads, hd, cols, gmin, [](int) { return 0.5; });
  meshmuon::qk_clip_rows({0, QkKind::K, kheads, hd}, logits, kTau, w.data(), 0, kheads * hd, cols);
  expect_bitwise(w, want);
  // Negative control: the first head of each group (or the mean) would give other values.
  const std::vector<double> gfirst = {1.0, kTau / 300.0 * 1.0001};
  const auto other = expected(w0, kheads, hd, cols, gfirst, [](int) { return 0.5; });
  EXPECT_NE(std::memcmp(other.data(), w.data(), w.size() * 4), 0);
  // Query heads of the same layer still use their own γ.
  std::vector<float> q = randn(8 * hd * cols, 5);
  std::vector<double> gq;
  for (float s : logits) gq.push_back(gamma_of(s, kTau));
  const auto want_q = expected(q, 8, hd, cols, gq, [](int) { return 0.5; });
  meshmuon::qk_clip_rows({0, QkKind::Q, 8, hd}, logits, kTau, q.data(), 0, 8 * hd, cols);
  expect_bitwise(q, want_q);
}

TEST(QkClip, MlaQueryWithRopeRowsAndKvWithValueRows) {
  const int heads = 4, cols = 7;
  std::vector<double> g;
  for (float s : kLogits4) g.push_back(gamma_of(s, kTau));
  // wq_b: head_dim 5 = 3 q_nope rows (× sqrt γ) then 2 q_pe rows (× γ).
  std::vector<float> q = randn(heads * 5 * cols, 6);
  const auto want_q = expected(q, heads, 5, cols, g, [](int off) { return off >= 3 ? 1.0 : 0.5; });
  meshmuon::qk_clip_rows({0, QkKind::Q, heads, 5, 2}, kLogits4, kTau, q.data(), 0, heads * 5, cols);
  expect_bitwise(q, want_q);
  // wkv_b: blocks of head_dim 3 k_nope rows (× sqrt γ) then v_dim 4 value rows (untouched).
  std::vector<float> kv = randn(heads * 7 * cols, 7), kv0 = kv;
  const auto want_kv = expected(kv, heads, 7, cols, g, [](int off) { return off < 3 ? 0.5 : 0.0; });
  meshmuon::qk_clip_rows({0, QkKind::Kv, heads, 3, 0, 4}, kLogits4, kTau, kv.data(), 0, heads * 7, cols);
  expect_bitwise(kv, want_kv);
  for (int h = 0; h < heads; ++h)  // value rows bitwise untouched, even for clipped heads
    for (int r = 3; r < 7; ++r)
      for (int c = 0; c < cols; ++c) EXPECT_EQ(kv[(h * 7 + r) * cols + c], kv0[(h * 7 + r) * cols + c]);
  // The shared rotary key k_pe has no kind: it can only be left untagged (never scaled).
  EXPECT_THROW(meshmuon::parse_qk_kind("k_pe"), std::invalid_argument);
}

struct RangeCase {
  QkTag tag;
  std::vector<float> logits;
};

TEST(QkClip, LocalRowRangesMatchTheWholeParameter) {
  const std::vector<float> l8 = {10, 150, 120, 90, 300, 101, 20, 30};
  const RangeCase cases[] = {{{0, QkKind::Q, 4, 3}, kLogits4},      {{0, QkKind::Q, 4, 5, 2}, kLogits4},
                             {{0, QkKind::K, 2, 4}, l8},            {{0, QkKind::QPe, 4, 2}, kLogits4},
                             {{0, QkKind::KNope, 4, 3}, kLogits4},  {{0, QkKind::Kv, 4, 3, 0, 4}, kLogits4}};
  const int cols = 5;
  std::mt19937 rng(9);
  for (const RangeCase& c : cases) {
    const int rows = static_cast<int>(meshmuon::qk_tag_rows(c.tag));
    const std::vector<float> w0 = randn(rows * cols, 10);
    std::vector<float> whole = w0;
    meshmuon::qk_clip_rows(c.tag, c.logits, kTau, whole.data(), 0, rows, cols);
    for (int trial = 0; trial < 20; ++trial) {
      int r0 = static_cast<int>(rng() % (rows + 1)), r1 = static_cast<int>(rng() % (rows + 1));
      if (r0 > r1) std::swap(r0, r1);
      std::vector<float> shard(w0.begin() + r0 * cols, w0.begin() + r1 * cols);
      meshmuon::qk_clip_rows(c.tag, c.logits, kTau, shard.data(), r0, r1, cols);
      const std::vector<float> want(whole.begin() + r0 * cols, whole.begin() + r1 * cols);
      expect_bitwise(shard, want);
    }
  }
}

TEST(QkClip, RejectsBadInputsWithoutTouchingRows) {
  std::vector<float> w = randn(12 * 2, 11);
  const std::vector<float> w0 = w;
  const QkTag q{3, QkKind::Q, 4, 3};
  EXPECT_THROW(meshmuon::qk_clip_rows(q, std::vector<float>{1, 2, 3}, kTau, w.data(), 0, 12, 2),
               std::invalid_argument);  // wrong logits length for query heads
  EXPECT_THROW(meshmuon::qk_clip_rows({3, QkKind::K, 4, 3}, std::vector<float>{1, 2, 3, 4, 5, 6}, kTau,
                                   w.data(), 0, 12, 2),
               std::invalid_argument);  // 6 query heads cannot share 4 key heads
  EXPECT_THROW(meshmuon::qk_clip_rows(q, std::vector<float>{1, NAN, 3, 4}, kTau, w.data(), 0, 12, 2),
               std::invalid_argument);
  EXPECT_THROW(meshmuon::qk_clip_rows(q, kLogits4, 0.0, w.data(), 0, 12, 2), std::invalid_argument);
  EXPECT_THROW(meshmuon::qk_clip_rows(q, kLogits4, kTau, w.data(), 4, 13, 2), std::invalid_argument);
  EXPECT_THROW(meshmuon::qk_clip_rows(q, kLogits4, kTau, w.data(), 5, 4, 2), std::invalid_argument);
  EXPECT_THROW(meshmuon::qk_clip_rows({3, QkKind::K, 4, 3, 1}, kLogits4, kTau, w.data(), 0, 12, 2),
               std::invalid_argument);  // rope_dim on a key tag
  EXPECT_THROW(meshmuon::qk_clip_rows({3, QkKind::Q, 4, 3, 4}, kLogits4, kTau, w.data(), 0, 12, 2),
               std::invalid_argument);  // rope_dim > head_dim
  expect_bitwise(w, w0);
  EXPECT_THROW(meshmuon::validate_qk_tag(q, "layers.3.attn.wq", 13), std::invalid_argument);
  try {
    meshmuon::validate_qk_tag(q, "layers.3.attn.wq", 13);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layers.3.attn.wq"), std::string::npos) << e.what();
  }
}

TEST(QkClip, KindNamesRoundTrip) {
  for (QkKind k : {QkKind::Q, QkKind::K, QkKind::QNope, QkKind::QPe, QkKind::KNope, QkKind::Kv})
    EXPECT_EQ(meshmuon::parse_qk_kind(meshmuon::to_string(k)), k);
  EXPECT_EQ(meshmuon::to_string(QkKind::QNope), "q_nope");
  EXPECT_EQ(meshmuon::to_string(QkKind::Kv), "kv");
  EXPECT_DOUBLE_EQ(meshmuon::qk_clip_gamma(200.0, 100.0), 0.5);
  EXPECT_DOUBLE_EQ(meshmuon::qk_clip_gamma(100.0, 100.0), 1.0);
}

}  // namespace
