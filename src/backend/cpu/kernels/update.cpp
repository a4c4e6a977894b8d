// Names of the update rules' enums (update.h): algorithm, momentum kind, LR rule, the decay's lr;
// the CLI / JSON / Python spellings.
#include "meshmuon/update.h"

#include "core/enum_names.h"

namespace meshmuon {
namespace {

constexpr std::pair<Algorithm, std::string_view> kAlgorithms[] = {{Algorithm::Muon, "muon"},
                                                                  {Algorithm::AdamW, "adamw"}};
constexpr std::pair<MomentumKind, std::string_view> kMomentumKinds[] = {
    {MomentumKind::Ema, "ema"}, {MomentumKind::HeavyBall, "heavy_ball"}};
constexpr std::pair<LrRule, std::string_view> kLrRules[] = {
    {LrRule::Original, "original"}, {LrRule::MatchRmsAdamw, "match_rms_adamw"}, {LrRule::None, "none"}};
constexpr std::pair<DecayLr, std::string_view> kDecayLrs[] = {{DecayLr::Unadjusted, "unadjusted"},
                                                              {DecayLr::Adjusted, "adjusted"}};

}  // namespace

using detail::name_of;
using detail::parse_name;

std::string_view to_string(Algorithm a) { return name_of(kAlgorithms, a); }
Algorithm parse_algorithm(std::string_view n) { return parse_name(kAlgorithms, n, "[optim]", "algorithm"); }
std::string_view to_string(MomentumKind k) { return name_of(kMomentumKinds, k); }
MomentumKind parse_momentum_kind(std::string_view n) {
  return parse_name(kMomentumKinds, n, "[optim]", "momentum kind");
}
std::string_view to_string(LrRule r) { return name_of(kLrRules, r); }
LrRule parse_lr_rule(std::string_view n) { return parse_name(kLrRules, n, "[optim]", "lr rule"); }
std::string_view to_string(DecayLr d) { return name_of(kDecayLrs, d); }
DecayLr parse_decay_lr(std::string_view n) { return parse_name(kDecayLrs, n, "[optim]", "decay_lr"); }

}  // namespace meshmuon
