// `meshmuon plan`: the plan for a model on a mesh, per-strategy costs, and whole-model baselines.
// Example: meshmuon plan --model llama3-8b --parallel dp_shard=64 [--strategy auto] [--json]
#include <iostream>
#include <memory>

#include "commands.h"
#include "plan_options.h"

namespace meshmuon::cli {

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Show how each parameter's orthogonalization is distributed and what it costs");
  auto args = std::make_shared<PlanArgs>();
  auto as_json = std::make_shared<bool>(false);
  add_plan_args(*cmd, *args);
  cmd->add_flag("--json", *as_json, "Print JSON (docs/plan.md)");
  cmd->callback([args, as_json] {
    const Inventory inv = make_inventory(*args);
    const PlanOptions options = make_plan_options(*args);
    const Plan plan = make_plan(inv, options);
    const Strategy peers[] = {Strategy::OwnerA2A, Strategy::AllGather, Strategy::Agrs, Strategy::GramAllReduce};
    const std::vector<Baseline> baselines = plan_baselines(inv, options, peers);
    std::cout << (*as_json ? plan.to_json(baselines) : plan.to_string(baselines)) << "\n";
  });
}

}  // namespace meshmuon::cli
