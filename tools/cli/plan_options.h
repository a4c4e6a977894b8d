// Options shared by `meshmuon plan` and `meshmuon bench plan`: model, parallel layout and planner options.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "meshmuon/inventory.h"
#include "meshmuon/plan.h"

namespace meshmuon::cli {

inline constexpr const char* kDefaultParallel = "dp_shard=8";

struct PlanArgs {
  // `parallel` empty: presets use kDefaultParallel; a model file must place itself (its meshes) or
  // get --parallel, so no error ever quotes a layout the user did not type.
  std::string model = "llama3-8b", model_file, parallel, strategy = "auto";
  std::vector<std::string> pins;
  std::string comm_dtype = "fp32", machine = "h100", replica = "auto", schedule = "jordan", method = "symmetric", matmul_dtype = "fp32";
  int ns_steps = 5, window = 2;
  double chunk_mib = 1024;
  bool allow_inexact = false;
  const CLI::Option* parallel_option = nullptr;  // add_plan_args's: tells `--parallel ""` from no --parallel
};

void add_plan_args(CLI::App& cmd, PlanArgs& a);
void check_parallel_given(const PlanArgs& a);  // `--parallel ""`: std::invalid_argument saying what to give
Inventory make_inventory(const PlanArgs& a);
PlanOptions make_plan_options(const PlanArgs& a);  // reads MESHMUON_STRATEGY

}  // namespace meshmuon::cli
