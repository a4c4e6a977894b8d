// Internal: what the planner needs to know about one parameter's sharding, computed once per
// distinct (mesh, shape, placements) and shared by every parameter of that layout.
//
// Size: O(g + r + holders) for a group of g positions and r replica groups (never g·r, never
// world²); building it costs O(holders · shard dims) local boxes, not one per group position.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshmuon/inventory.h"

namespace meshmuon::detail {

// The most (expert, group position) pieces one expert stack may split into; the planner enumerates
// every piece, so a stack past this is refused with an error naming it instead of exhausting memory.
inline constexpr int64_t kMaxPlanPieces = int64_t{1} << 28;

struct ShardTable {
  DimMask group_dims = 0, replica_dims = 0;
  int g = 1, r = 1;                 // group size (shard dims), replica groups
  std::vector<int64_t> numel;       // per group position: elements held
  int64_t units = 1, unit_numel = 0;
  // Per unit, its holders (positions with elements of it, increasing) and how many elements each
  // holds (CSR).
  std::vector<int64_t> holder_offsets;
  std::vector<int32_t> holders;
  std::vector<int64_t> holder_elems;
  std::vector<int64_t> unit_held;   // per unit: the elements its holders hold (the sum of its row)
  bool whole_units = true;          // every unit held whole by at most one position
  bool long_dim_only = false;       // 2-D, g > 1, shard dims only cut the Gram side's long dim
  // World rank of replica group j, position k: replica_base[j] + group_offset[k] (the two dim sets
  // are disjoint, so row-major ranks add).
  std::vector<int32_t> replica_base, group_offset;
  int rank(int j, int k) const { return replica_base[static_cast<size_t>(j)] + group_offset[static_cast<size_t>(k)]; }
};

// Builds and caches tables for one inventory (not thread-safe; one per make_plan call).
class ShardTables {
 public:
  explicit ShardTables(const Inventory& inv) : inv_(inv) {}
  const ShardTable& get(int param);
  // The table of the parameter's NorMuon state tensor (normuon_state_shape, same placements).
  const ShardTable& get_state(int param);

 private:
  const Inventory& inv_;
  std::map<std::string, std::shared_ptr<ShardTable>> cache_;
  std::vector<std::shared_ptr<ShardTable>> by_param_, state_by_param_;
};

}  // namespace meshmuon::detail
