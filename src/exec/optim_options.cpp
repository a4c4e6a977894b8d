// The non-finite policy's names and group hyperparameter validation (the update rules' names:
// backend/cpu/kernels/update.cpp).
#include "meshmuon/optim_options.h"

#include <cmath>
#include <exception>
#include <stdexcept>
#include <string>

#include "core/enum_names.h"
#include "meshmuon/error.h"
#include "exec/param_groups.h"

namespace meshmuon {
namespace {

constexpr std::pair<NonFinitePolicy, std::string_view> kPolicies[] = {
    {NonFinitePolicy::Raise, "raise"}, {NonFinitePolicy::Skip, "skip"}};

}  // namespace

std::string_view to_string(NonFinitePolicy p) { return detail::name_of(kPolicies, p); }
NonFinitePolicy parse_non_finite_policy(std::string_view n) {
  return detail::parse_name(kPolicies, n, "[optim]", "non-finite policy");
}

void validate_group_options(const GroupOptions& o, size_t g) {
  auto in_unit = [&](double x, const char* field) {
    MESHMUON_CHECK(std::isfinite(x) && x >= 0 && x < 1, "[optim] group ", g, ": ", field, " ", x,
                " is outside [0, 1)");
  };
  MESHMUON_CHECK(to_string(o.algorithm) != "?", "[optim] group ", g, ": invalid algorithm");
  MESHMUON_CHECK(std::isfinite(o.lr) && o.lr >= 0, "[optim] group ", g, ": lr ", o.lr,
              " must be finite and >= 0");
  MESHMUON_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "[optim] group ", g,
              ": weight_decay ", o.weight_decay, " must be finite and >= 0");
  if (o.algorithm == Algorithm::AdamW) {
    in_unit(o.beta1, "beta1");
    in_unit(o.beta2, "beta2");
    MESHMUON_CHECK(std::isfinite(o.eps) && o.eps > 0, "[optim] group ", g, ": eps ", o.eps,
                " must be finite and > 0");
    return;
  }
  // No upper bound, as torch.optim.Muon (momentum) and Dion's NorMuon (muon_beta2): 1 keeps an EMA
  // (or NorMuon's v) where it is, and makes heavy-ball momentum a plain sum.
  auto rate = [&](double x, const char* field) {
    MESHMUON_CHECK(std::isfinite(x) && x >= 0, "[optim] group ", g, ": ", field, " ", x,
                   " must be finite and >= 0");
  };
  rate(o.momentum, "momentum");
  rate(o.normuon_beta2, "normuon_beta2");
  MESHMUON_CHECK(to_string(o.momentum_kind) != "?", "[optim] group ", g, ": invalid momentum_kind");
  MESHMUON_CHECK(to_string(o.lr_rule) != "?", "[optim] group ", g, ": invalid lr_rule");
  MESHMUON_CHECK(to_string(o.decay_lr) != "?", "[optim] group ", g, ": invalid decay_lr ", static_cast<int>(o.decay_lr),
              "; use unadjusted or adjusted");
  MESHMUON_CHECK(std::isfinite(o.qk_clip_threshold) && o.qk_clip_threshold >= 0, "[optim] group ", g,
              ": qk_clip_threshold ", o.qk_clip_threshold, " must be finite and >= 0 (0 = off)");
  MESHMUON_CHECK(o.num_heads >= 0, "[optim] group ", g, ": num_heads ", o.num_heads, " must be ≥ 0 (0 or 1 = off)");
  for (int64_t b : o.split_sizes)
    MESHMUON_CHECK(b > 0, "[optim] group ", g, ": split_sizes holds ", b, "; every block needs ≥ 1 row");
  MESHMUON_CHECK(o.split_sizes.empty() || o.num_heads <= 1, "[optim] group ", g, ": num_heads ", o.num_heads,
              " and split_sizes are both set; use num_heads for equal per-head blocks or split_sizes for uneven "
              "ones, not both");
  try {
    (void)make_schedule(o.ns);
  } catch (const std::invalid_argument& e) {
    detail::throw_invalid_argument(detail::concat("[optim] group ", g, ": ns options: ", e.what()));
  }
}

std::vector<int64_t> resolve_split(const GroupOptions& o, int64_t rows, std::string_view param) {
  if (o.algorithm != Algorithm::Muon) return {};
  if (!o.split_sizes.empty()) {
    int64_t sum = 0;
    for (int64_t b : o.split_sizes) sum += b;
    MESHMUON_CHECK(sum == rows, "[optim] parameter '", param, "': split_sizes sum to ", sum, " but its matrices have ", rows,
                " rows; the blocks must cover dim 0 (the output dim) exactly");
    return o.split_sizes.size() > 1 ? o.split_sizes : std::vector<int64_t>{};
  }
  if (o.num_heads <= 1) return {};
  MESHMUON_CHECK(rows % o.num_heads == 0, "[optim] parameter '", param, "': num_heads ", o.num_heads,
              " does not divide its ", rows, " rows; give split_sizes for uneven blocks or put it in another group");
  return std::vector<int64_t>(static_cast<size_t>(o.num_heads), rows / o.num_heads);
}

namespace detail {

std::vector<int> validate_param_groups(std::span<const ParamGroup> groups, size_t n,
                                       const std::function<std::string_view(size_t)>& name) {
  std::vector<int> group_of(n, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    validate_group_options(groups[g].options, g);
    for (size_t i : groups[g].params) {
      MESHMUON_CHECK(i < n, "[optim] group ", g, " lists parameter index ", i, " but there are ", n, " parameters");
      MESHMUON_CHECK(group_of[i] < 0, "[optim] parameter '", name(i), "' is in groups ", group_of[i], " and ", g,
                  "; put each parameter in exactly one group");
      group_of[i] = static_cast<int>(g);
    }
  }
  for (size_t i = 0; i < n; ++i)
    MESHMUON_CHECK(group_of[i] >= 0, "[optim] parameter '", name(i), "' is in no group; add it to a Muon or AdamW group");
  return group_of;
}

}  // namespace detail
}  // namespace meshmuon
