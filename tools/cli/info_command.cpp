// `dmuon info [--json]`: version, BLAS library and core type, thread count, the CPU and whether its
// bf16 products are native (avx512_bf16 / amx_bf16) or emulated (slower than fp32).
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "core/cpu_features.h"
#include "dmuon/blas.h"
#include "dmuon/version.h"

namespace dmuon::cli {
namespace {

std::string bf16_line(const detail::CpuBf16& bf16) {
  if (bf16.native) {
    std::string how = bf16.avx512_bf16 ? "avx512_bf16" : "";
    if (bf16.amx_bf16) how += how.empty() ? "amx_bf16" : ", amx_bf16";
    return "native (" + how + "): ns_matmul_dtype bf16 runs ~2.4x the fp32 rate";
  }
  return std::string("emulated") + (bf16.assumed_absent ? " (DMUON_ASSUME_NO_NATIVE_BF16=1)" : "") +
         ": no avx512_bf16 / amx_bf16, bf16 products are emulated, slower than fp32; keep "
         "ns_matmul_dtype fp32";
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show the version, the BLAS dmuon computes with and the CPU's bf16 support");
  auto as_json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *as_json, "Print JSON");
  cmd->callback([as_json] {
    const BlasInfo info = blas_info();
    const detail::CpuBf16 bf16 = detail::cpu_bf16_support();
    const std::string cpu = detail::cpu_model_name();
    if (*as_json) {
      nlohmann::json j = {{"version", std::string(kVersion)}, {"blas_library", info.library},
                          {"blas_core", info.corename}, {"blas_config", info.config},
                          {"openblas_coretype", info.coretype_env}, {"blas_core_ok", info.coretype_ok},
                          {"blas_threads", info.threads}, {"cpu_model", cpu},
                          {"bf16_native", bf16.native}, {"avx512_bf16", bf16.avx512_bf16},
                          {"amx_bf16", bf16.amx_bf16}, {"bf16_assumed_absent", bf16.assumed_absent}};
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::printf("dmuon %s\n", std::string(kVersion).c_str());
    std::printf("BLAS      %s\n", info.library.c_str());
    std::printf("core      %s%s\n", info.corename.c_str(), info.coretype_ok ? "" : "  (slow: set OPENBLAS_CORETYPE)");
    std::printf("config    %s\n", info.config.c_str());
    std::printf("threads   %d\n", info.threads);
    std::printf("cpu       %s\n", cpu.c_str());
    std::printf("bf16      %s\n", bf16_line(bf16).c_str());
  });
}

}  // namespace dmuon::cli
