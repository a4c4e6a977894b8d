// `dmuon info [--json]`: version, BLAS library and core type, thread count.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "dmuon/blas.h"
#include "dmuon/version.h"

namespace dmuon::cli {

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show the version and the BLAS dmuon computes with");
  auto as_json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *as_json, "Print JSON");
  cmd->callback([as_json] {
    const BlasInfo info = blas_info();
    if (*as_json) {
      nlohmann::json j = {{"version", std::string(kVersion)}, {"blas_library", info.library},
                          {"blas_core", info.corename}, {"blas_config", info.config},
                          {"openblas_coretype", info.coretype_env}, {"blas_core_ok", info.coretype_ok},
                          {"blas_threads", info.threads}};
      std::cout << j.dump(2) << "\n";
      return;
    }
    std::printf("dmuon %s\n", std::string(kVersion).c_str());
    std::printf("BLAS      %s\n", info.library.c_str());
    std::printf("core      %s%s\n", info.corename.c_str(), info.coretype_ok ? "" : "  (slow: set OPENBLAS_CORETYPE)");
    std::printf("config    %s\n", info.config.c_str());
    std::printf("threads   %d\n", info.threads);
  });
}

}  // namespace dmuon::cli
