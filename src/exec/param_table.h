// Internal: what an optimizer's construction fixed about its parameters and groups (read-only
// during a step): each parameter's group, each group's algorithm and NorMuon switch, whether it has
// a gram_allreduce parameter, and what a step checks the caller's buffers against.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "meshmuon/tensor.h"
#include "meshmuon/update.h"

namespace meshmuon::detail {

struct ParamTable {
  std::vector<int> group_of;          // per parameter
  std::vector<Algorithm> algorithm;   // per group
  std::vector<bool> normuon;          // per group: Muon with NorMuon
  std::vector<bool> param_normuon;    // per parameter: its group's
  std::vector<std::pair<int64_t, std::vector<int64_t>>> split;  // per group: (num_heads, split_sizes) at construction
  std::vector<int> gram_param;        // per group: a parameter on gram_allreduce (no MuonEq / Muon+), or -1
  std::vector<std::string> names;     // per parameter (error messages)
  std::vector<Shape> local_shapes;    // per parameter: this rank's box's shape

  size_t group(size_t param) const { return static_cast<size_t>(group_of[param]); }
  size_t size() const { return group_of.size(); }
};

}  // namespace meshmuon::detail
