// QK-clip (MuonClip, Kimi K2 report Algorithm 1): after the update, scale the query / key rows of an
// attention layer whose max pre-softmax logit exceeded a threshold (REFERENCE.md section 2).
//
// Per layer the caller gives S_h, the max logit of each QUERY head h over the batch. With threshold
// τ > 0: γ_h = τ / S_h when S_h > τ, else 1. Row blocks are per head, in head order, along dim 0 of
// the 2-D weight [rows, cols] (torch Linear [out, in]).
// Kinds (names as in CLI / JSON / Python):
//   "q"      rows = heads·head_dim. rope_dim = 0: all rows × sqrt γ_h. rope_dim > 0 (MLA wq_b): in
//            each head block the LAST rope_dim rows (q_pe) × γ_h, the first head_dim − rope_dim
//            (q_nope) × sqrt γ_h.
//   "k"      key heads, rows = heads·head_dim with heads = key heads. GQA: with Q query heads,
//            G = Q / heads must be an integer; key head j serves query heads [j·G, (j+1)·G) and takes
//            the SMALLEST γ of its group (so no query head's logit can stay above τ): × sqrt γ_min.
//   "q_nope" rows = heads·head_dim, × sqrt γ_h.
//   "q_pe"   rows = heads·head_dim, × γ_h.
//   "k_nope" rows = heads·head_dim, × sqrt γ (key-side: group-min rule as "k" when Q > heads).
//   "kv"     MLA wkv_b: blocks of head_dim + v_dim rows per head: the first head_dim rows (k_nope)
//            × sqrt γ (key-side group-min rule), the last v_dim rows (values) untouched.
// The shared rotary key (k_pe) and value projections are never tagged, so never scaled.
// Query-side kinds ("q", "q_nope", "q_pe") need exactly `heads` logits; key-side kinds ("k",
// "k_nope", "kv") need a positive multiple of `heads`.
// Factors are computed in double (γ, sqrt γ) and rounded once to fp32; rows are multiplied in fp32,
// rows with factor 1 are not touched.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "meshmuon/export.h"

namespace meshmuon {

enum class QkKind { Q, K, QNope, QPe, KNope, Kv };
MESHMUON_API std::string_view to_string(QkKind k);
MESHMUON_API QkKind parse_qk_kind(std::string_view name);  // throws std::invalid_argument

struct QkTag {
  int layer = 0;
  QkKind kind = QkKind::Q;
  int heads = 0;     // query heads for q / q_nope / q_pe, key heads for k / k_nope / kv
  int head_dim = 0;  // rows per head block (for kv: the k_nope rows of a block)
  int rope_dim = 0;  // "q" only: trailing q_pe rows per head block (0 ≤ rope_dim ≤ head_dim)
  int v_dim = 0;     // "kv" only: trailing value rows per head block
};

// Rows of the whole parameter the tag describes (heads · block size).
MESHMUON_API int64_t qk_tag_rows(const QkTag& tag);

// Throws std::invalid_argument naming `param` when the tag is inconsistent (heads or head_dim ≤ 0,
// rope_dim outside [0, head_dim] or set on another kind, v_dim < 0 or set on another kind) or, when
// global_rows ≥ 0, when it does not match qk_tag_rows(tag).
MESHMUON_API void validate_qk_tag(const QkTag& tag, std::string_view param, int64_t global_rows = -1);

// Throws std::invalid_argument naming `param` and the layer when `logits` has the wrong length for the
// tag (see above) or holds a non-finite value.
MESHMUON_API void validate_qk_logits(const QkTag& tag, std::span<const float> logits,
                                  std::string_view param);

// γ for one max logit: τ / S when S > τ, else 1 (double). Requires τ > 0.
MESHMUON_API double qk_clip_gamma(double max_logit, double threshold);

// The fp32 factor QK-clip multiplies global row `row` of the tagged parameter by.
MESHMUON_API float qk_clip_row_factor(const QkTag& tag, std::span<const float> logits, double threshold,
                                   int64_t row);

// Scales the LOCAL rows [row_begin, row_end) (global row indices of the tagged parameter) in place.
// `rows` points at row row_begin of a row-major block of (row_end − row_begin) × cols fp32 values,
// so a shard holding any contiguous row range can be clipped on its own and gives the same bits as
// clipping the whole parameter. Validates tag and logits first (see above); throws
// std::invalid_argument for threshold ≤ 0 or non-finite, a negative or out-of-range row range, or
// cols < 0. Nothing is modified when it throws.
MESHMUON_API void qk_clip_rows(const QkTag& tag, std::span<const float> logits, double threshold,
                            float* rows, int64_t row_begin, int64_t row_end, int64_t cols);

}  // namespace meshmuon
