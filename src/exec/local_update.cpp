// Internal: the local update passes (local_update.h).
#include "exec/local_update.h"

#include <algorithm>
#include <vector>

#include "meshmuon/update.h"

namespace meshmuon::detail {

void LocalUpdate::momentum(std::span<const UpdateTarget> targets) {
  std::vector<Backend::MomentumTensor> tensors;
  tensors.reserve(targets.size());
  for (const UpdateTarget& t : targets) {
    const size_t i = static_cast<size_t>(t.param);
    const ParamLayout& L = layouts_[i];
    if (L.local_numel == 0) continue;
    if (!in_.active[i]) {  // no gradient: the momentum stays, zeros travel
      backend_.zero(t.update, static_cast<size_t>(L.local_numel) * sizeof(float));  // stream-ordered, no host wait
      continue;
    }
    const GroupOptions& o = options(t.param);
    tensors.push_back({{o.momentum_kind, o.momentum, o.nesterov}, state_.data(i, StateKey::Momentum), in_.grads[i], t.update});
  }
  backend_.momentum_multi(tensors, comm_dtype_);
}

void LocalUpdate::apply(std::span<const UpdateTarget> targets) {
  std::vector<Backend::ApplyTensor> tensors;
  tensors.reserve(targets.size());
  for (const UpdateTarget& t : targets) {
    const ParamLayout& L = layouts_[static_cast<size_t>(t.param)];
    if (L.local_numel == 0) continue;
    const GroupOptions& o = options(t.param);
    float* param = in_.params[static_cast<size_t>(t.param)].f32();
    if (L.split.empty()) {
      tensors.push_back({{o.lr, adjusted_lr(o.lr, o.lr_rule, L.rows, L.cols), o.weight_decay, o.cautious_wd, o.decay_lr},
                         param, t.update, L.local_numel});
      continue;
    }
    // row blocks: each block's LR rule reads the block's shape; the local shard's rows of each block
    // are contiguous runs (row-major), and neighbouring runs with the same lr merge into one tensor
    const int nd = L.shape.ndim();
    const IndexSet& rows = L.box.dims[static_cast<size_t>(nd - 2)];
    const int64_t lc = L.box.dims[static_cast<size_t>(nd - 1)].size();
    const int64_t experts = L.expert ? L.box.dims[0].size() : 1;
    const size_t first = tensors.size();
    int64_t at = 0;
    for (int64_t e = 0; e < experts; ++e)
      for (const Range& r : rows.ranges()) {
        int64_t block_begin = 0;
        for (int64_t b : L.split) {
          const int64_t lo = std::max(r.begin, block_begin), hi = std::min(r.end, block_begin + b);
          block_begin += b;
          if (lo >= hi) continue;
          const double lr_b = adjusted_lr(o.lr, o.lr_rule, b, L.cols);
          const int64_t n = (hi - lo) * lc;
          if (tensors.size() > first && tensors.back().o.adjusted_lr == lr_b && tensors.back().update + tensors.back().n == t.update + at)
            tensors.back().n += n;
          else
            tensors.push_back({{o.lr, lr_b, o.weight_decay, o.cautious_wd, o.decay_lr}, param + at, t.update + at, n});
          at += n;
        }
      }
  }
  backend_.apply_multi(tensors);
  for (const UpdateTarget& t : targets) {  // QK-clip after the update, on the tagged parameters
    const ParamLayout& L = layouts_[static_cast<size_t>(t.param)];
    const ParamSpec& p = inventory_.params[static_cast<size_t>(t.param)];
    const GroupOptions& o = options(t.param);
    if (L.local_numel == 0 || o.qk_clip_threshold <= 0 || !p.qk) continue;
    // QK-clip scales whole rows: each contiguous range of local rows on its own (StridedShard has several)
    float* w = in_.params[static_cast<size_t>(t.param)].f32();
    const int64_t lc = L.box.dims[1].size();
    int64_t pos = 0;
    for (const Range& r : L.box.dims[0].ranges()) {
      backend_.qk_clip_rows(*p.qk, in_.qk_logits->at(p.qk->layer), o.qk_clip_threshold, w + pos * lc, r.begin, r.end, lc);
      pos += r.size();
    }
  }
}

void LocalUpdate::adamw(int64_t chunk_bytes) {
  std::vector<std::vector<size_t>> batches;
  int64_t bytes = 0;
  for (size_t i = 0; i < in_.active.size(); ++i) {
    if (table_.algorithm[table_.group(i)] != Algorithm::AdamW || !in_.active[i]) continue;
    const int64_t numel = layouts_[i].local_numel;
    if (numel == 0) continue;
    const int64_t b = 2 * numel * static_cast<int64_t>(sizeof(float));  // exp_avg, exp_avg_sq
    if (batches.empty() || bytes + b > chunk_bytes) batches.emplace_back(), bytes = 0;
    batches.back().push_back(i), bytes += b;
  }
  for (size_t k = 0; k < batches.size(); ++k) {
    state_.acquire(batches[k]);
    if (k + 1 < batches.size()) state_.prefetch(batches[k + 1]);
    std::vector<Backend::AdamWTensor> tensors;  // one multi-tensor call per batch
    tensors.reserve(batches[k].size());
    for (size_t i : batches[k]) {
      const GroupOptions& o = in_.options_of(table_, i);
      tensors.push_back({{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, state_.steps(i)}, in_.params[i].f32(), in_.grads[i],
                         state_.data(i, StateKey::ExpAvg), state_.data(i, StateKey::ExpAvgSq)});
    }
    backend_.adamw_multi(tensors);
    state_.release(batches[k]);
  }
}

}  // namespace meshmuon::detail
