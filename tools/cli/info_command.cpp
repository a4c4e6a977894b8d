// `meshmuon info [--json]`: version, BLAS library, core and threads, the CPU, and what runs the bf16
// products there (native oneDNN, meshmuon's widened products, or oneDNN's emulation) with their cost
// relative to fp32 measured now, what ns_matmul_dtype "auto" picks, and the backends and transports
// this build registered (backend/registry.h, comm/transport_registry.h) with why a missing one is
// missing.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "backend/registry.h"
#include "comm/transport_registry.h"
#include "commands.h"
#include "core/cpu_features.h"
#include "meshmuon/blas.h"
#include "meshmuon/orthogonalize.h"
#include "meshmuon/version.h"

namespace meshmuon::cli {
namespace {

// name -> "" (available) or why it is missing, in registration order.
template <class Registry>
std::vector<std::pair<std::string, std::string>> registered(const Registry& r) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& name : r.names()) out.emplace_back(name, r.why_missing(name));
  return out;
}

nlohmann::json entries_json(const std::vector<std::pair<std::string, std::string>>& entries) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [name, why] : entries)
    j.push_back({{"name", name}, {"available", why.empty()}, {"why_missing", why}});
  return j;
}

void print_entries(const char* label, const std::vector<std::pair<std::string, std::string>>& entries) {
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [name, why] = entries[i];
    std::printf("%-11s%s%s%s\n", i == 0 ? label : "", name.c_str(), why.empty() ? "" : "  (missing: ", why.empty() ? "" : (why + ")").c_str());
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show the version, the BLAS meshmuon computes with, the CPU and its bf16 products");
  auto as_json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *as_json, "Print JSON");
  cmd->callback([as_json] {
    const BlasInfo info = blas_info();
    const detail::CpuBf16 cpu_bf16 = detail::cpu_bf16_support();
    const std::string cpu = detail::cpu_model_name();
    const Bf16ProductsInfo bf16 = bf16_products_info();
    Bf16Cost cost;
    if (bf16.error.empty()) cost = measure_bf16_cost();
    const std::string auto_dtype(to_string(auto_matmul_dtype()));
    const auto backends = registered(detail::backend_registry());
    const auto transports = registered(detail::transport_registry());
    if (*as_json) {
      nlohmann::json j = {{"version", std::string(kVersion)}, {"blas_library", info.library},
                          {"blas_core", info.corename}, {"blas_config", info.config},
                          {"openblas_coretype", info.coretype_env}, {"blas_core_ok", info.coretype_ok},
                          {"blas_threads", info.threads}, {"cpu_model", cpu},
                          {"bf16_native", cpu_bf16.native}, {"avx512_bf16", cpu_bf16.avx512_bf16},
                          {"amx_bf16", cpu_bf16.amx_bf16}, {"bf16_products", bf16.kind},
                          {"bf16_kernel", bf16.kernel}, {"bf16_reason", bf16.reason},
                          {"bf16_forced", bf16.forced}, {"bf16_error", bf16.error},
                          {"bf16_over_fp32", bf16.error.empty() ? nlohmann::json(cost.bf16_over_fp32) : nlohmann::json()},
                          {"auto_matmul_dtype", auto_dtype}, {"backends", entries_json(backends)},
                          {"transports", entries_json(transports)}};
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::printf("meshmuon %s\n", std::string(kVersion).c_str());
    std::printf("BLAS      %s\n", info.library.c_str());
    std::printf("core      %s%s\n", info.corename.c_str(), info.coretype_ok ? "" : "  (slow: set OPENBLAS_CORETYPE)");
    std::printf("config    %s\n", info.config.c_str());
    std::printf("threads   %d (meshmuon splits each product into tiles; the BLAS runs one thread per tile)\n", info.threads);
    std::printf("cpu       %s (bf16 in hardware: %s)\n", cpu.c_str(), detail::cpu_bf16_features(cpu_bf16).c_str());
    if (!bf16.error.empty()) {
      std::printf("bf16      cannot run: %s\n", bf16.error.c_str());
    } else {
      std::printf("bf16      %s: %s\n", bf16.kind.c_str(), bf16.kernel.c_str());
      std::printf("          why: %s\n", bf16.reason.c_str());
      std::printf("          measured now: %.2fx the fp32 time (%dx%d Newton-Schulz, one thread)\n", cost.bf16_over_fp32,
                  cost.size, cost.size);
    }
    std::printf("auto      ns_matmul_dtype auto = %s here\n", auto_dtype.c_str());
    print_entries("backends", backends);
    print_entries("transports", transports);
  });
}

}  // namespace meshmuon::cli
