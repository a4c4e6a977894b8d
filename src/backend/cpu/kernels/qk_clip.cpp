// QK-clip row scaling (MuonClip) for MHA, GQA and MLA projections, on any contiguous row range.
#include "meshmuon/qk_clip.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "meshmuon/error.h"

namespace meshmuon {
namespace {

constexpr struct {
  QkKind kind;
  std::string_view name;
} kKindNames[] = {{QkKind::Q, "q"},         {QkKind::K, "k"},           {QkKind::QNope, "q_nope"},
                  {QkKind::QPe, "q_pe"},    {QkKind::KNope, "k_nope"},  {QkKind::Kv, "kv"}};

bool key_side(QkKind k) { return k == QkKind::K || k == QkKind::KNope || k == QkKind::Kv; }

int64_t block_rows(const QkTag& t) {
  return t.kind == QkKind::Kv ? int64_t{t.head_dim} + t.v_dim : int64_t{t.head_dim};
}

// Smallest γ over the query heads that key-side head `head` serves (itself for query-side kinds).
double head_gamma(const QkTag& t, std::span<const float> logits, double tau, int64_t head) {
  if (!key_side(t.kind)) return qk_clip_gamma(logits[head], tau);
  const int64_t group = static_cast<int64_t>(logits.size()) / t.heads;
  double g = 1.0;
  for (int64_t q = head * group; q < (head + 1) * group; ++q) g = std::min(g, qk_clip_gamma(logits[q], tau));
  return g;
}

}  // namespace

std::string_view to_string(QkKind k) {
  for (const auto& e : kKindNames)
    if (e.kind == k) return e.name;
  return "?";
}

QkKind parse_qk_kind(std::string_view name) {
  for (const auto& e : kKindNames)
    if (e.name == name) return e.kind;
  MESHMUON_CHECK(false, "[qk_clip] unknown QK kind '", name, "'; use q, k, q_nope, q_pe, k_nope or kv");
  return QkKind::Q;
}

int64_t qk_tag_rows(const QkTag& t) { return int64_t{t.heads} * block_rows(t); }

void validate_qk_tag(const QkTag& t, std::string_view param, int64_t global_rows) {
  const std::string_view kind = to_string(t.kind);
  MESHMUON_CHECK(kind != "?", "[qk_clip] parameter '", param, "' has an invalid QK kind");
  MESHMUON_CHECK(t.heads > 0 && t.head_dim > 0, "[qk_clip] parameter '", param, "' (", kind,
              "): heads ", t.heads, " and head_dim ", t.head_dim, " must be > 0");
  MESHMUON_CHECK(t.rope_dim == 0 || t.kind == QkKind::Q, "[qk_clip] parameter '", param, "' (", kind,
              "): rope_dim is only for kind q (MLA wq_b); tag q_pe rows with kind q_pe instead");
  MESHMUON_CHECK(t.rope_dim >= 0 && t.rope_dim <= t.head_dim, "[qk_clip] parameter '", param,
              "': rope_dim ", t.rope_dim, " must be in [0, head_dim = ", t.head_dim, "]");
  MESHMUON_CHECK(t.v_dim == 0 || t.kind == QkKind::Kv, "[qk_clip] parameter '", param, "' (", kind,
              "): v_dim is only for kind kv (MLA wkv_b)");
  MESHMUON_CHECK(t.v_dim >= 0, "[qk_clip] parameter '", param, "': v_dim ", t.v_dim, " is negative");
  MESHMUON_CHECK(global_rows < 0 || global_rows == qk_tag_rows(t), "[qk_clip] parameter '", param,
              "' (", kind, ") has ", global_rows, " rows but its tag describes ", qk_tag_rows(t),
              " (heads ", t.heads, " x ", block_rows(t), " rows per head)");
}

void validate_qk_logits(const QkTag& t, std::span<const float> logits, std::string_view param) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (key_side(t.kind)) {
    MESHMUON_CHECK(n > 0 && n % t.heads == 0, "[qk_clip] parameter '", param, "' (layer ", t.layer,
                ", ", to_string(t.kind), " with ", t.heads, " key heads) got ", n,
                " query-head logits; give a positive multiple of ", t.heads);
  } else {
    MESHMUON_CHECK(n == t.heads, "[qk_clip] parameter '", param, "' (layer ", t.layer, ", ",
                to_string(t.kind), ") got ", n, " query-head logits; expected ", t.heads);
  }
  for (int64_t h = 0; h < n; ++h)
    MESHMUON_CHECK(std::isfinite(logits[h]), "[qk_clip] layer ", t.layer, ": max logit of head ", h,
                " is ", logits[h], "; logits must be finite");
}

double qk_clip_gamma(double max_logit, double threshold) {
  return max_logit > threshold ? threshold / max_logit : 1.0;
}

float qk_clip_row_factor(const QkTag& t, std::span<const float> logits, double tau, int64_t row) {
  const int64_t block = block_rows(t);
  const int64_t head = row / block, offset = row % block;
  const double g = head_gamma(t, logits, tau, head);
  switch (t.kind) {
    case QkKind::Q:
      return static_cast<float>(offset >= t.head_dim - t.rope_dim && t.rope_dim > 0 ? g : std::sqrt(g));
    case QkKind::QPe: return static_cast<float>(g);
    case QkKind::Kv: return offset < t.head_dim ? static_cast<float>(std::sqrt(g)) : 1.0f;
    case QkKind::K:
    case QkKind::QNope:
    case QkKind::KNope: return static_cast<float>(std::sqrt(g));
  }
  return 1.0f;
}

void qk_clip_rows(const QkTag& t, std::span<const float> logits, double tau, float* rows,
                  int64_t row_begin, int64_t row_end, int64_t cols) {
  validate_qk_tag(t, "<unnamed>");
  validate_qk_logits(t, logits, "<unnamed>");
  MESHMUON_CHECK(std::isfinite(tau) && tau > 0, "[qk_clip] threshold ", tau, " must be finite and > 0");
  MESHMUON_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= qk_tag_rows(t),
              "[qk_clip] row range [", row_begin, ", ", row_end, ") is outside the ",
              qk_tag_rows(t), " rows of the tagged parameter");
  MESHMUON_CHECK(cols >= 0, "[qk_clip] cols ", cols, " is negative");
  MESHMUON_CHECK(rows != nullptr || row_begin == row_end || cols == 0, "[qk_clip] rows is null");
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float f = qk_clip_row_factor(t, logits, tau, r);
    if (f == 1.0f) continue;
    float* row = rows + (r - row_begin) * cols;
    for (int64_t j = 0; j < cols; ++j) row[j] *= f;
  }
}

}  // namespace meshmuon
