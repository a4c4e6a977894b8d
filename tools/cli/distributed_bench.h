// What the distributed benchmarks (`bench step`, `bench fsdp`) share: the default communicator
// backend, the upper median of timings, and how a communication error ends a job under mpirun.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "meshmuon/comm.h"

namespace meshmuon::cli {

// `backend` when given, else "mpi" under mpirun (OMPI_COMM_WORLD_SIZE set) and "single" outside.
std::string bench_backend(const std::string& backend);

// The element at size/2 of the sorted timings (the upper median); 0 when empty.
double upper_median(std::vector<double> v);

// COLLECTIVE: the largest x over the ranks of `c` (x >= 0; exact: its bits are max-reduced as int64).
double slowest(Communicator& c, double x);

// Runs a distributed benchmark. A meshmuon::Error under mpirun (a timeout or broken collective) is
// printed and ends the whole job through abort_all(1): MPI could not finalize after it. Elsewhere
// (and for other exceptions) the error propagates to main().
void run_distributed(const std::function<void()>& body);

}  // namespace meshmuon::cli
