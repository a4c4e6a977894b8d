// Options shared by `meshmuon plan` and `meshmuon bench plan` (docs/plan.md lists them).
#include "plan_options.h"

#include "meshmuon/error.h"

namespace meshmuon::cli {

void add_plan_args(CLI::App& cmd, PlanArgs& a) {
  cmd.add_option("--model", a.model, "Preset: gpt2-124m, nanochat-d20, llama3-8b, llama3-70b, qwen3-30b-a3b, deepseek-v3")
      ->capture_default_str();
  cmd.add_option("--model-file", a.model_file, "Model JSON file (docs/model-format.md); overrides --model");
  a.parallel_option = cmd.add_option("--parallel", a.parallel,
                 std::string("dp_replicate=R,dp_shard=S,tp=T,ep=E, each from 1 to 1048576 (2^20) ranks in all ") +
                     "[presets: " + kDefaultParallel + " (bench plan: dp_shard=1024); a model file: its own meshes]");
  cmd.add_option("--strategy", a.strategy, "auto (cost model) or a strategy for every parameter it can run")
      ->capture_default_str();
  cmd.add_option("--pin", a.pins, "PATTERN:STRATEGY user pin (repeatable; highest precedence)");
  cmd.add_option("--comm-dtype", a.comm_dtype, "fp32 or bf16")->capture_default_str();
  cmd.add_option("--machine", a.machine, "h100, h200 (NVLink shard groups, InfiniBand replicas), h100-ib, h200-ib (shard groups across nodes), cpu, or a JSON file of measured constants (docs/plan.md; `meshmuon bench calibrate --out` writes one)")->capture_default_str();
  cmd.add_option("--replica", a.replica, "HSDP replicas: auto, duplicate or split")->capture_default_str();
  cmd.add_option("--schedule", a.schedule, "jordan, you, polar_express, cans, aol, deepseekv4, cubic5")->capture_default_str();
  cmd.add_option("--method", a.method, "plain, symmetric, gram")->capture_default_str();
  cmd.add_option("--matmul-dtype", a.matmul_dtype, "Newton–Schulz product operands: fp32 or bf16 (the flop rate the cost model uses)")
      ->capture_default_str();
  cmd.add_option("--ns-steps", a.ns_steps, "Newton–Schulz steps")->capture_default_str();
  cmd.add_option("--chunk-mib", a.chunk_mib, "Cap on a chunk's buffer MiB per rank")->capture_default_str();
  cmd.add_option("--window", a.window, "Chunks in flight")->capture_default_str();
  cmd.add_flag("--allow-inexact", a.allow_inexact, "Let the cost model pick gram_allreduce (not bitwise layout-invariant)");
}

void check_parallel_given(const PlanArgs& a) {
  MESHMUON_CHECK(!a.parallel.empty() || a.parallel_option == nullptr || a.parallel_option->count() == 0,
                 "[plan] --parallel is empty; give dp_replicate=R,dp_shard=S,tp=T,ep=E (any of them, e.g. "
                 "--parallel dp_shard=8), or leave --parallel out (a preset then takes its default layout, a "
                 "model file its own meshes)");
}

Inventory make_inventory(const PlanArgs& a) {
  check_parallel_given(a);
  if (!a.model_file.empty()) {
    if (a.parallel.empty()) return load_inventory_file(a.model_file, nullptr);
    const ParallelConfig config = parse_parallel(a.parallel);
    return load_inventory_file(a.model_file, &config);
  }
  return apply_parallel(preset_model(a.model), parse_parallel(a.parallel.empty() ? kDefaultParallel : a.parallel));
}

PlanOptions make_plan_options(const PlanArgs& a) {
  PlanOptions o;
  o.comm_dtype = parse_dtype(a.comm_dtype, "--comm-dtype");
  o.machine = MachineProfile::resolve(a.machine);
  o.replica = parse_replica_mode(a.replica);
  o.ns.schedule = parse_schedule(a.schedule);
  o.ns.method = parse_ns_method(a.method);
  o.ns.steps = a.ns_steps;
  o.ns.matmul_dtype = parse_dtype(a.matmul_dtype, "--matmul-dtype");
  MESHMUON_CHECK(o.ns.matmul_dtype == DType::F32 || o.ns.matmul_dtype == DType::BF16, "[plan] --matmul-dtype is '",
                 a.matmul_dtype, "'; use fp32 or bf16");
  // chunk_bytes is int64: bound the MiB so the conversion cannot overflow (2^40 MiB = 1 EiB)
  MESHMUON_CHECK(a.chunk_mib > 0 && a.chunk_mib <= 1099511627776.0, "[plan] --chunk-mib is ", a.chunk_mib,
              "; give a positive number of at most 1099511627776 (2^40)");
  o.chunk_bytes = static_cast<int64_t>(a.chunk_mib * 1024 * 1024);
  o.window = a.window;
  o.exact = !a.allow_inexact;
  std::string rules;
  if (a.strategy != "auto") rules = "default:" + a.strategy;
  for (const std::string& p : a.pins) rules += (rules.empty() ? "" : ";") + p;
  o.pins = StrategyRules::parse(rules, "--strategy / --pin");
  o.env_override = strategy_rules_from_env();
  return o;
}

}  // namespace meshmuon::cli
