// `meshmuon`: the command-line front end (info, bench, plan). The only place where errors become exit
// codes: 2 for bad input (std::invalid_argument), 1 for run-time failures.
#include <cstdio>
#include <exception>
#include <stdexcept>

#include "commands.h"
#include "core/cpu_features.h"
#include "meshmuon/version.h"

int main(int argc, char** argv) {
  // The CLI links OpenBLAS only through libmeshmuon's run-time loader, but re-executing with the core
  // type set also covers a BLAS that something else pulled in at start-up.
  meshmuon::detail::reexec_with_blas_environment(argv);
  CLI::App app{"meshmuon: Muon-family optimizers on sharded parameters"};
  app.set_version_flag("--version", std::string(meshmuon::kVersion));
  app.require_subcommand(1);
  meshmuon::cli::add_info_command(app);
  auto* bench = app.add_subcommand("bench", "Benchmarks: time, rates and ratios to a baseline measured in the same run");
  bench->require_subcommand(1);
  meshmuon::cli::add_bench_ns_command(*bench);
  meshmuon::cli::add_plan_command(app);
  meshmuon::cli::add_bench_plan_command(*bench);
  meshmuon::cli::add_bench_step_command(*bench);
  meshmuon::cli::add_bench_fsdp_command(*bench);
  meshmuon::cli::add_bench_calibrate_command(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "meshmuon: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshmuon: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
