// `dmuon`: the command-line front end (info, bench, plan). The only place where errors become exit
// codes: 2 for bad input (std::invalid_argument), 1 for run-time failures.
#include <cstdio>
#include <exception>
#include <stdexcept>

#include "commands.h"
#include "core/cpu_features.h"
#include "dmuon/version.h"

int main(int argc, char** argv) {
  // The CLI links OpenBLAS only through libdmuon's run-time loader, but re-executing with the core
  // type set also covers a BLAS that something else pulled in at start-up.
  dmuon::detail::reexec_with_blas_environment(argv);
  CLI::App app{"dmuon: Muon-family optimizers on sharded parameters"};
  app.set_version_flag("--version", std::string(dmuon::kVersion));
  app.require_subcommand(1);
  dmuon::cli::add_info_command(app);
  auto* bench = app.add_subcommand("bench", "Benchmarks: time, rates and ratios to a baseline measured in the same run");
  bench->require_subcommand(1);
  dmuon::cli::add_bench_ns_command(*bench);
  dmuon::cli::add_plan_command(app);
  dmuon::cli::add_bench_plan_command(*bench);
  dmuon::cli::add_bench_step_command(*bench);
  dmuon::cli::add_bench_fsdp_command(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "dmuon: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dmuon: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
