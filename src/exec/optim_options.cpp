// The non-finite policy's names and group hyperparameter validation (the update rules' names:
// kernels/cpu/update.cpp).
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
  try {
    (void)make_schedule(o.ns);
  } catch (const std::invalid_argument& e) {
    detail::throw_invalid_argument(detail::concat("[optim] group ", g, ": ns options: ", e.what()));
  }
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
