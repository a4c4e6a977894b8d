// Strategies: how one parameter's orthogonalization is distributed (a closed enum; the names are the
// same in CLI, MESHMUON_STRATEGY, logs and JSON). docs/plan.md has the table; DESIGN.md "Strategies".
//
//   local            2-D matrix held whole by every rank that holds it: orthogonalize in place.
//   owner_a2a        one owner per matrix (per expert for stacks): all-to-all shards to the owner,
//                    owner orthogonalizes, all-to-all the result back.
//   allgather        every rank of the shard group all-gathers the whole parameter and computes it
//                    redundantly (Moonlight's Distributed Muon).
//   agrs             all-gather the matrix, its owner computes, reduce-scatter back (xtuner).
//   gram_allreduce   matrix sharded along its long dim only: all-reduce the small Gram matrix every
//                    Newton–Schulz step; not bitwise layout-invariant (sum order).
//   expert_local     expert stack whose local shards hold whole experts: batched, no communication.
//   expert_subgroup  expert stack with experts split over a few ranks: each expert's holders
//                    all-gather it and compute it redundantly (xtuner).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshmuon/export.h"

namespace meshmuon {

enum class Strategy : uint8_t { Local, OwnerA2A, AllGather, Agrs, GramAllReduce, ExpertLocal, ExpertSubgroup };
inline constexpr int kNumStrategies = 7;

MESHMUON_API std::string_view to_string(Strategy s);
// Throws std::invalid_argument naming `what` and listing the names.
MESHMUON_API Strategy parse_strategy(std::string_view name, std::string_view what = "strategy");

// Glob match on parameter names: '*' any run of characters (dots included), '?' one character.
MESHMUON_API bool glob_match(std::string_view pattern, std::string_view name);

// Strategy rules, as in MESHMUON_STRATEGY="default:owner_a2a;*.experts.*:expert_local":
// `;`-separated `pattern:strategy` items; the first pattern that matches a name wins; `default`
// applies to names no pattern matches.
struct StrategyRule {
  std::string pattern;
  Strategy strategy = Strategy::OwnerA2A;
};
struct MESHMUON_API StrategyRules {
  std::vector<StrategyRule> rules;   // patterns, in order
  std::optional<Strategy> fallback;  // the `default:` item

  bool empty() const { return rules.empty() && !fallback; }
  // The matching strategy; `*by_pattern` tells whether a pattern (not `default`) matched.
  std::optional<Strategy> match(std::string_view name, bool* by_pattern = nullptr) const;
  std::string to_string() const;  // the canonical text form
  // Throws std::invalid_argument naming `what` (e.g. "MESHMUON_STRATEGY") on a malformed item.
  static StrategyRules parse(std::string_view text, std::string_view what = "strategy rules");
};

// The rules of the MESHMUON_STRATEGY environment variable (empty when unset). The planner itself never
// reads the environment; callers pass these in PlanOptions::env_override.
MESHMUON_API StrategyRules strategy_rules_from_env();

}  // namespace meshmuon
