// `meshmuon plan`: the plan for a model on a mesh, per-strategy costs, and whole-model baselines.
// Example: meshmuon plan --model llama3-8b --parallel dp_shard=64 [--strategy auto] [--json [--detail]]
//
// --json prints a summary by default: the plan's totals per strategy and per rank (max / mean), its
// options and fingerprint, and the Muon parameters grouped into classes (same mesh, shape,
// placements, strategy, decision), which costs one make_plan. --detail adds every entry and the
// whole-model baselines (four more plans; the text table always shows them).
#include <iostream>
#include <map>
#include <memory>
#include <tuple>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "placement_report.h"
#include "plan_options.h"

namespace meshmuon::cli {
namespace {

// The plan's JSON without entries and baselines, plus its parameter classes in first-seen order.
std::string summary_json(const Plan& plan) {
  auto j = nlohmann::ordered_json::parse(plan.to_json());
  j.erase("entries");
  j.erase("baselines");
  const Inventory& inv = plan.inventory();
  using Key = std::tuple<int, std::string, std::string, int, int>;
  std::map<Key, size_t> index;
  nlohmann::ordered_json classes = nlohmann::ordered_json::array();
  for (const PlanEntry& e : plan.entries()) {
    const ParamSpec& p = inv.params[static_cast<size_t>(e.param)];
    std::string pl;
    for (const Placement& x : p.placements) pl += (pl.empty() ? "" : ",") + meshmuon::to_string(x);
    const Key key{e.mesh, p.shape.to_string(), pl, static_cast<int>(e.strategy), static_cast<int>(e.decision)};
    const auto [it, fresh] = index.try_emplace(key, classes.size());
    if (fresh) {
      classes.push_back({{"first", p.name}, {"params", 0}, {"shape", std::get<1>(key)}, {"placements", pl},
                         {"mesh", inv.mesh_names[static_cast<size_t>(e.mesh)]}, {"strategy", meshmuon::to_string(e.strategy)},
                         {"decision", meshmuon::to_string(e.decision)}, {"unit_flops", e.unit_flops}});
    }
    auto& c = classes[it->second];
    c["params"] = c["params"].get<int>() + 1;
  }
  j["num_classes"] = classes.size();
  j["classes"] = std::move(classes);
  j["detail"] = "entries and baselines: meshmuon plan --json --detail";
  return j.dump(2);
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Show how each parameter's orthogonalization is distributed and what it costs");
  auto args = std::make_shared<PlanArgs>();
  auto as_json = std::make_shared<bool>(false);
  auto detail = std::make_shared<bool>(false);
  auto placement = std::make_shared<std::string>("sharded");
  auto overlap = std::make_shared<double>(-1.0);  // -1: the machine profile's fwd_bwd_overlap
  auto reduce = std::make_shared<std::string>("star");
  add_plan_args(*cmd, *args);
  cmd->add_option("--placement", *placement,
                  "sharded (as placed), owner (Muon matrices whole on one rank each) or auto (owner where the "
                  "placement cost model predicts it faster); FSDP / HSDP meshes only")
      ->capture_default_str();
  cmd->add_option("--overlap", *overlap,
                  "With --placement: fraction of forward / backward traffic hidden behind compute (default: the "
                  "machine profile's fwd_bwd_overlap: 0.8 on the GPU profiles, measured on cpu and calibrated ones)");
  cmd->add_option("--reduce", *reduce,
                  "With --placement: how owned gradients reach their owner: star (the C++ ShardedParams: every "
                  "rank's gradient to the owner) or scatter_gather (meshmuon.torch.own above 2 ranks: reduce-scatter, "
                  "then the sums to the owner; the same bits)")
      ->capture_default_str();
  cmd->add_flag("--json", *as_json, "Print JSON (docs/plan.md): a summary, per strategy and per parameter class");
  cmd->add_flag("--detail", *detail, "With --json: every entry and the whole-model baselines (four more plans)");
  cmd->callback([args, as_json, detail, placement, overlap, reduce] {
    Inventory inv = make_inventory(*args);
    const PlanOptions options = make_plan_options(*args);
    const bool placed = *placement != "sharded";
    PlacementReport report;
    if (placed) {
      report = placement_report(inv, options, *placement, *overlap, *reduce);
      inv = report.placed;  // owned matrices: one holder each, planned `local`
    }
    const Plan plan = make_plan(inv, options);
    if (*as_json && !*detail) {
      auto j = nlohmann::ordered_json::parse(summary_json(plan));
      if (placed) j["placement"] = report.json;
      std::cout << j.dump(2) << "\n";
      return;
    }
    const Strategy peers[] = {Strategy::OwnerA2A, Strategy::AllGather, Strategy::Agrs, Strategy::GramAllReduce};
    const std::vector<Baseline> baselines = plan_baselines(inv, options, peers);
    if (*as_json) {
      auto j = nlohmann::ordered_json::parse(plan.to_json(baselines));
      if (placed) j["placement"] = report.json;
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << plan.to_string(baselines) << "\n";
      if (placed) std::cout << report.text;
    }
  });
}

}  // namespace meshmuon::cli
