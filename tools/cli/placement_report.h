// `meshmuon plan --placement`: the planner's placement choice (sharded / owner / auto) per parameter,
// why, and the peak memory per rank it implies, beside the plan of the placed inventory.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "meshmuon/inventory.h"
#include "meshmuon/plan.h"

namespace meshmuon::cli {

struct PlacementReport {
  Inventory placed;              // the inventory with every owned matrix [Owned(r), Owned(s)]
  nlohmann::ordered_json json;   // mode, overlap, per parameter choice and why, memory per rank
  std::string text;              // the same as a table
};

// `mode`: sharded, owner or auto; `overlap`: fraction of forward / backward traffic hidden (0..1).
// `reduce`: how owned gradients reach their owner: "star" (ShardedParams: every gradient to the owner)
// or "scatter_gather" (meshmuon.torch.own above 2 ranks: reduce-scatter, then the sums to the owner).
PlacementReport placement_report(const Inventory& inv, const PlanOptions& o, const std::string& mode, double overlap,
                                 const std::string& reduce = "star");

}  // namespace meshmuon::cli
