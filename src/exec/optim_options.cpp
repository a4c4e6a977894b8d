// Names of the optimizer enums (CLI / JSON / Python spellings) and group hyperparameter validation.
#include "meshmuon/optim_options.h"

#include <cmath>
#include <exception>
#include <stdexcept>
#include <string>

#include "meshmuon/error.h"
#include "exec/param_groups.h"

namespace meshmuon {
namespace {

template <class E, size_t N>
std::string_view name_of(const std::pair<E, std::string_view> (&table)[N], E value) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "?";
}

template <class E, size_t N>
E parse_name(const std::pair<E, std::string_view> (&table)[N], std::string_view name,
             std::string_view what) {
  std::string choices;
  for (const auto& [v, n] : table) {
    if (n == name) return v;
    choices += choices.empty() ? "" : ", ";
    choices += n;
  }
  detail::throw_invalid_argument(detail::concat("[optim] unknown ", what, " '", name, "'; use ", choices));
}

constexpr std::pair<Algorithm, std::string_view> kAlgorithms[] = {{Algorithm::Muon, "muon"},
                                                                  {Algorithm::AdamW, "adamw"}};
constexpr std::pair<MomentumKind, std::string_view> kMomentumKinds[] = {
    {MomentumKind::Ema, "ema"}, {MomentumKind::HeavyBall, "heavy_ball"}};
constexpr std::pair<LrRule, std::string_view> kLrRules[] = {
    {LrRule::Original, "original"}, {LrRule::MatchRmsAdamw, "match_rms_adamw"}, {LrRule::None, "none"}};
constexpr std::pair<DecayLr, std::string_view> kDecayLrs[] = {{DecayLr::Unadjusted, "unadjusted"},
                                                              {DecayLr::Adjusted, "adjusted"}};
constexpr std::pair<NonFinitePolicy, std::string_view> kPolicies[] = {
    {NonFinitePolicy::Raise, "raise"}, {NonFinitePolicy::Skip, "skip"}};

}  // namespace

std::string_view to_string(Algorithm a) { return name_of(kAlgorithms, a); }
Algorithm parse_algorithm(std::string_view n) { return parse_name(kAlgorithms, n, "algorithm"); }
std::string_view to_string(MomentumKind k) { return name_of(kMomentumKinds, k); }
MomentumKind parse_momentum_kind(std::string_view n) {
  return parse_name(kMomentumKinds, n, "momentum kind");
}
std::string_view to_string(LrRule r) { return name_of(kLrRules, r); }
LrRule parse_lr_rule(std::string_view n) { return parse_name(kLrRules, n, "lr rule"); }
std::string_view to_string(DecayLr d) { return name_of(kDecayLrs, d); }
DecayLr parse_decay_lr(std::string_view n) { return parse_name(kDecayLrs, n, "decay_lr"); }
std::string_view to_string(NonFinitePolicy p) { return name_of(kPolicies, p); }
NonFinitePolicy parse_non_finite_policy(std::string_view n) {
  return parse_name(kPolicies, n, "non-finite policy");
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
  in_unit(o.momentum, "momentum");
  in_unit(o.normuon_beta2, "normuon_beta2");
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
