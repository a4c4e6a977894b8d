// Internal: what the planner needs to know about one parameter's sharding, computed once per
// distinct (mesh, shape, placements) and shared by every parameter of that layout.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dmuon/inventory.h"

namespace dmuon::detail {

struct ShardTable {
  DimMask group_dims = 0, replica_dims = 0;
  int g = 1, r = 1;                 // group size (shard dims), replica groups
  std::vector<int64_t> numel;       // per group position: elements held
  int64_t units = 1, unit_numel = 0;
  // Per unit, its holders (positions with elements of it) and how many elements each holds (CSR).
  std::vector<int32_t> holder_offsets, holders;
  std::vector<int64_t> holder_elems;
  bool whole_units = true;          // every unit held whole by at most one position
  bool long_dim_only = false;       // 2-D, g > 1, shard dims only cut the Gram side's long dim
  std::vector<int32_t> rank_of;     // [j·g + k] -> world rank of replica j, position k
  int rank(int j, int k) const { return rank_of[static_cast<size_t>(j) * g + k]; }
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

}  // namespace dmuon::detail
