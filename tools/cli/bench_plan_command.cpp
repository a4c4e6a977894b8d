// `meshmuon bench plan`: planning speed and memory at scale (target: deepseek-v3 at 1,024 ranks in
// < 1 s and < 1 GiB), with the same model at 8 ranks timed in the same run as the baseline.
// Example: meshmuon bench plan --model deepseek-v3 --parallel dp_shard=1024 --repeat 5 [--json]
// --grid: every combination of dp_replicate {1, 8} x tp {1, 8} x ep {1, 8, 64} at worlds 2^14, 2^17
// and 2^20 (dp_shard fills the rest), the median per shape and, per combination, the growth exponent
// of the time in the world size (log(t(2^20) / t(2^14)) / log(64); 1.0 is linear).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "plan_options.h"

namespace meshmuon::cli {
namespace {

double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux reports KiB
}

std::string fmt_hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Best and median seconds of `repeat` make_plan calls.
std::pair<double, double> time_plans(const Inventory& inv, const PlanOptions& o, int repeat, uint64_t& fp) {
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const Plan plan = make_plan(inv, o);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    fp = plan.fingerprint();
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

// The grid (see the top of the file): one line per shape, a growth line per combination.
void run_grid(const PlanArgs& args, int repeat, bool as_json) {
  const PlanOptions options = make_plan_options(args);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  const int worlds[] = {1 << 14, 1 << 17, 1 << 20};
  if (!as_json)
    std::printf("bench plan --grid: %s, make_plan median of %d\n%12s %9s %4s %4s %9s %11s %8s\n", args.model.c_str(), repeat,
                "dp_replicate", "dp_shard", "tp", "ep", "ranks", "median ms", "chunks");
  double worst = 0;
  for (int rep : {1, 8})
    for (int tp : {1, 8})
      for (int ep : {1, 8, 64}) {
        double first = 0, last = 0;
        for (int world : worlds) {
          ParallelConfig c{rep, world / (rep * tp), tp, ep};
          if (ep > 1 && (ep % tp != 0 || c.dp_shard % (ep / tp) != 0)) continue;
          PlanArgs a = args;
          a.parallel = to_string(c);
          const Inventory inv = make_inventory(a);
          uint64_t fp = 0;
          const auto [best, median] = time_plans(inv, options, repeat, fp);
          const Plan plan = make_plan(inv, options);
          worst = std::max(worst, median);
          if (first == 0) first = median;
          last = median;
          if (as_json) {
            rows.push_back({{"parallel", a.parallel}, {"world_size", inv.world_size()}, {"plan_seconds_best", best},
                            {"plan_seconds_median", median}, {"num_chunks", plan.chunks().size()},
                            {"fingerprint", fmt_hex(fp)}});
          } else {
            std::printf("%12d %9d %4d %4d %9d %11.1f %8zu\n", rep, c.dp_shard, tp, ep, inv.world_size(), median * 1e3,
                        plan.chunks().size());
          }
        }
        if (!as_json && first > 0)
          std::printf("%41s growth 2^14 -> 2^20: time x%.1f for ranks x64 (exponent %.2f)\n", "", last / first,
                      std::log(last / first) / std::log(64.0));
      }
  const double rss = max_rss_mib();
  if (as_json) {
    nlohmann::ordered_json j = {{"model", args.model}, {"shapes", rows}, {"worst_plan_seconds_median", worst},
                                {"max_rss_mib", rss}, {"target_met", worst < 1.0}};
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("worst median %.1f ms, peak RSS %.1f MiB; target (every shape < 1 s): %s\n", worst * 1e3, rss,
              worst < 1.0 ? "met" : "NOT met");
}

}  // namespace

void add_bench_plan_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("plan", "Time make_plan (and its peak memory) at a given scale");
  auto args = std::make_shared<PlanArgs>();
  args->model = "deepseek-v3";
  auto repeat = std::make_shared<int>(5);
  auto as_json = std::make_shared<bool>(false);
  auto grid = std::make_shared<bool>(false);
  add_plan_args(*cmd, *args);
  cmd->add_option("--repeat", *repeat, "Plans timed (best and median reported)")->capture_default_str();
  cmd->add_flag("--json", *as_json, "Print JSON");
  cmd->add_flag("--grid", *grid,
                "Time every dp_replicate {1,8} x tp {1,8} x ep {1,8,64} at 2^14, 2^17 and 2^20 ranks (--parallel is ignored)");
  cmd->callback([args, repeat, as_json, grid] {
    if (*grid) return run_grid(*args, std::max(1, *repeat), *as_json);
    check_parallel_given(*args);
    if (args->parallel.empty() && args->model_file.empty()) args->parallel = "dp_shard=1024";  // bench's preset default
    const double rss0 = max_rss_mib();
    const PlanOptions options = make_plan_options(*args);
    PlanArgs small = *args;
    small.parallel = "dp_shard=8";
    // a model file that places itself has no smaller layout to compare with: it is its own baseline
    const bool own_layout = !args->model_file.empty() && args->parallel.empty();
    const Inventory base_inv = own_layout ? make_inventory(*args) : make_inventory(small);
    uint64_t fp_base = 0, fp = 0;
    const auto [base_best, base_median] = time_plans(base_inv, options, std::max(1, *repeat), fp_base);
    const Inventory inv = make_inventory(*args);
    const auto [best, median] = time_plans(inv, options, std::max(1, *repeat), fp);
    const double rss = max_rss_mib();
    const Plan plan = make_plan(inv, options);
    const bool ok = median < 1.0 && rss < 1024.0;
    if (*as_json) {
      nlohmann::ordered_json j = {{"model", inv.model}, {"world_size", inv.world_size()},
                                  {"num_params", inv.params.size()}, {"plan_seconds_best", best},
                                  {"plan_seconds_median", median}, {"baseline_world_size", base_inv.world_size()},
                                  {"baseline_plan_seconds_median", base_median},
                                  {"ratio_to_baseline", base_median > 0 ? median / base_median : 0.0},
                                  {"max_rss_mib", rss}, {"max_rss_mib_before", rss0},
                                  {"num_chunks", plan.chunks().size()}, {"target_met", ok}};
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::printf("bench plan: %s, %zu parameters\n", inv.model.c_str(), inv.params.size());
    std::printf("  %5d ranks (baseline): best %8.2f ms  median %8.2f ms\n", base_inv.world_size(), base_best * 1e3, base_median * 1e3);
    std::printf("  %5d ranks           : best %8.2f ms  median %8.2f ms  (%.1fx the baseline)\n", inv.world_size(),
                best * 1e3, median * 1e3, base_median > 0 ? median / base_median : 0.0);
    std::printf("  peak RSS %.1f MiB (%.1f MiB before planning); %zu chunks\n", rss, rss0, plan.chunks().size());
    std::printf("  target (< 1 s, < 1 GiB): %s\n", ok ? "met" : "NOT met");
  });
}

}  // namespace meshmuon::cli
