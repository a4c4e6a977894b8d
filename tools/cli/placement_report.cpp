// `meshmuon plan --placement`: runs the planner's placement choice (src/plan/owner_placement.h) on
// every FSDP / HSDP mesh of the inventory and reports it per parameter, with peak memory per rank.
#include "placement_report.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "meshmuon/error.h"
#include "plan/owner_placement.h"

namespace meshmuon::cli {
namespace {

std::string mib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

PlacementReport placement_report(const Inventory& inv, const PlanOptions& o, const std::string& mode_text, double overlap,
                                 const std::string& reduce) {
  const detail::PlacementMode mode = detail::parse_placement_mode(mode_text);
  MESHMUON_CHECK(reduce == "star" || reduce == "scatter_gather", "[plan] --reduce '", reduce,
                 "': use star (ShardedParams: every gradient to the owner) or scatter_gather (meshmuon.torch.own: "
                 "reduce-scatter, then the sums to the owner)");
  const bool sg = reduce == "scatter_gather";
  if (overlap < 0) overlap = o.machine.fwd_bwd_overlap;  // not given: the profile's
  MESHMUON_CHECK(overlap >= 0 && overlap <= 1, "[plan] --overlap must be in [0, 1], got ", overlap);
  std::vector<detail::PlacementChoice> choices(inv.params.size()), sharded(inv.params.size());
  std::vector<double> bytes(static_cast<size_t>(inv.world_size()), 0.0), bytes_sharded = bytes;
  // pass 1: per mesh of dp dims only, the choice and the bytes per rank; other meshes stay as placed
  for (size_t m = 0; m < inv.meshes.size(); ++m) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < inv.params.size(); ++i)
      if (static_cast<size_t>(inv.params[i].mesh) == m) idx.push_back(i);
    std::vector<ParamSpec> ps;
    for (size_t i : idx) ps.push_back(inv.params[i]);
    int R = 1, S = 1;
    if (!detail::dp_mesh_sizes(inv.meshes[m], R, S)) {
      for (size_t i : idx)
        choices[i].why = sharded[i].why = "mesh '" + inv.meshes[m].to_string() + "' has dims other than dp_shard / dp_replicate: as placed";
      continue;
    }
    const auto c = detail::choose_placements(ps, R, S, o, mode, overlap, sg);
    const auto c0 = detail::choose_placements(ps, R, S, o, detail::PlacementMode::Sharded, overlap, sg);
    const auto b = detail::placement_bytes_per_rank(ps, R, S, c), b0 = detail::placement_bytes_per_rank(ps, R, S, c0);
    for (size_t k = 0; k < idx.size(); ++k) choices[idx[k]] = c[k], sharded[idx[k]] = c0[k];
    for (size_t r = 0; r < bytes.size(); ++r) bytes[r] += b[r], bytes_sharded[r] += b0[r];
  }
  PlacementReport rep;
  rep.placed = detail::apply_placements(inv, choices);
  // pass 2: the report
  const auto peak = std::max_element(bytes.begin(), bytes.end());
  const double mean = std::accumulate(bytes.begin(), bytes.end(), 0.0) / static_cast<double>(bytes.size());
  const double peak0 = *std::max_element(bytes_sharded.begin(), bytes_sharded.end());
  int owned = 0;
  nlohmann::ordered_json params = nlohmann::ordered_json::array();
  std::string rows;
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const ParamSpec& p = inv.params[i];
    const detail::PlacementChoice& c = choices[i];
    owned += c.owned;
    nlohmann::ordered_json e{{"param", p.name}, {"shape", p.shape.to_string()}, {"placement", c.owned ? "owner" : "sharded"}};
    if (c.owned) e["owner"] = c.owner;
    if (c.eligible) {
      e["predicted_seconds"] = {{"owner", c.owner_cost.seconds}, {"sharded", c.sharded_cost.seconds}};
      e["step_bytes"] = {{"owner", c.owner_cost.step_bytes}, {"sharded", c.sharded_cost.step_bytes}};
      e["fwd_bwd_bytes"] = {{"owner", c.owner_cost.fwd_bwd_bytes}, {"sharded", c.sharded_cost.fwd_bwd_bytes}};
      e["peak_bytes"] = {{"owner", c.owner_cost.peak_bytes}, {"sharded", c.sharded_cost.peak_bytes}};
    }
    e["why"] = c.why;
    params.push_back(std::move(e));
    char line[160];
    std::snprintf(line, sizeof line, "  %-36s %-14s %-8s %5s  ", p.name.c_str(), p.shape.to_string().c_str(),
                  c.owned ? "owner" : "sharded", c.owned ? std::to_string(c.owner).c_str() : "-");
    rows += line + c.why + "\n";
  }
  rep.json = {{"mode", detail::to_string(mode)},
              {"overlap", overlap},
              {"reduce", reduce},
              {"owned", owned},
              {"memory_per_rank", {{"max_bytes", *peak}, {"max_rank", peak - bytes.begin()}, {"mean_bytes", mean},
                                   {"sharded_max_bytes", peak0}}},
              {"params", std::move(params)}};
  rep.text = "placement: " + std::string(detail::to_string(mode)) + " (" + std::to_string(owned) + " matrices owned, " +
             std::to_string(static_cast<int>(overlap * 100 + 0.5)) + "% of forward / backward traffic hidden, " + reduce +
             " reduction to the owner)\n" +
             "  parameter                            shape          placement owner  why\n" + rows +
             "memory per rank (fp32 masters + optimizer state): max " + mib(*peak) + " (rank " +
             std::to_string(peak - bytes.begin()) + "), mean " + mib(mean) + "; all sharded: max " + mib(peak0) + "\n";
  return rep;
}

}  // namespace meshmuon::cli
