// Strategy names, glob matching and the MESHMUON_STRATEGY rule syntax.
#include "meshmuon/strategy.h"

#include <array>
#include <cstdlib>

#include "meshmuon/error.h"

namespace meshmuon {

namespace {
constexpr std::array<std::string_view, kNumStrategies> kNames = {
    "local", "owner_a2a", "allgather", "agrs", "gram_allreduce", "expert_local", "expert_subgroup"};
}

std::string_view to_string(Strategy s) { return kNames[static_cast<size_t>(s)]; }

Strategy parse_strategy(std::string_view name, std::string_view what) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<Strategy>(i);
  std::string list;
  for (std::string_view n : kNames) list += (list.empty() ? "" : ", ") + std::string(n);
  detail::throw_invalid_argument(detail::concat("[plan] ", what, ": unknown strategy '", name, "'; use one of ", list));
}

bool glob_match(std::string_view pattern, std::string_view name) {
  // iterative wildcard match with backtracking to the last '*'
  size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, mark = n;
    } else if (star != std::string_view::npos) {
      p = star + 1, n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::optional<Strategy> StrategyRules::match(std::string_view name, bool* by_pattern) const {
  if (by_pattern) *by_pattern = false;
  for (const StrategyRule& r : rules)
    if (glob_match(r.pattern, name)) {
      if (by_pattern) *by_pattern = true;
      return r.strategy;
    }
  return fallback;
}

std::string StrategyRules::to_string() const {
  std::string s;
  if (fallback) s = "default:" + std::string(meshmuon::to_string(*fallback));
  for (const StrategyRule& r : rules) s += (s.empty() ? "" : ";") + r.pattern + ":" + std::string(meshmuon::to_string(r.strategy));
  return s;
}

StrategyRules StrategyRules::parse(std::string_view text, std::string_view what) {
  StrategyRules out;
  while (!text.empty()) {
    const size_t semi = text.find(';');
    const std::string_view item = text.substr(0, semi);
    text = semi == std::string_view::npos ? std::string_view{} : text.substr(semi + 1);
    if (item.empty()) continue;
    const size_t colon = item.rfind(':');
    MESHMUON_CHECK(colon != std::string_view::npos && colon > 0, "[plan] ", what, ": item '", item,
                "' must be pattern:strategy (e.g. default:owner_a2a;*.experts.*:expert_local)");
    const std::string_view pattern = item.substr(0, colon);
    const Strategy s = parse_strategy(item.substr(colon + 1), detail::concat(what, " item '", item, "'"));
    if (pattern == "default") {
      MESHMUON_CHECK(!out.fallback, "[plan] ", what, ": 'default' is given twice");
      out.fallback = s;
    } else {
      out.rules.push_back({std::string(pattern), s});
    }
  }
  return out;
}

StrategyRules strategy_rules_from_env() {
  const char* v = std::getenv("MESHMUON_STRATEGY");
  return v ? StrategyRules::parse(v, "MESHMUON_STRATEGY") : StrategyRules{};
}

}  // namespace meshmuon
