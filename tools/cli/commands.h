// Subcommands of the `meshmuon` CLI; each lives in its own <name>_command.cpp and registers itself on
// the parent it is given. Callbacks throw; only main() turns exceptions into exit codes.
#pragma once

#include <CLI/CLI.hpp>

namespace meshmuon::cli {

void add_info_command(CLI::App& app);
void add_bench_ns_command(CLI::App& bench);
void add_plan_command(CLI::App& app);
void add_bench_plan_command(CLI::App& bench);
void add_bench_step_command(CLI::App& bench);
void add_bench_fsdp_command(CLI::App& bench);
void add_bench_calibrate_command(CLI::App& bench);

}  // namespace meshmuon::cli
