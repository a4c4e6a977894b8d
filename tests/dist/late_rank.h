// The "rank that stops answering" harness of the timeout tests (optimizer, fsdp): every rank calls
// late_rank_test after its warm-up; the last rank then stops answering (sleeps until the abort), the
// others run `stalled` (a collective the late rank never joins) and must get a meshmuon::Error that
// contains every string of `wants` within 10 s (no hang); they agree on the verdict and rank 0 ends
// the job with meshmuon::abort_all(42) on success, 1 on failure (CTest expects 42).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "meshmuon/comm.h"
#include "meshmuon/error.h"

namespace meshmuon::test {

[[noreturn]] inline void late_rank_test(const char* name, int rank, int size, const std::function<void()>& stalled,
                                        const std::vector<std::string>& wants) {
  using namespace std::chrono;
  const int late = size - 1;
  MPI_Comm waiters = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank == late ? MPI_UNDEFINED : 0, rank, &waiters);
  if (rank == late) {
    std::this_thread::sleep_for(seconds(100));  // stops answering; ended by rank 0's abort
    std::_Exit(1);
  }
  int failures = 0;
  const auto start = steady_clock::now();
  std::string msg;
  try {
    stalled();
  } catch (const meshmuon::Error& e) {
    msg = e.what();
  }
  const double waited = duration<double>(steady_clock::now() - start).count();
  for (const std::string& want : wants)
    if (msg.find(want) == std::string::npos) {
      std::fprintf(stderr, "[rank %d] FAILED: expected '%s' in the error, got '%s'\n", rank, want.c_str(), msg.c_str());
      ++failures;
    }
  if (waited > 10) {
    std::fprintf(stderr, "[rank %d] FAILED: the timeout took %.1f s\n", rank, waited);
    ++failures;
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, waiters);
  if (rank == 0) {
    std::printf("%s: %d failure(s); '%s' after %.2f s; ending the job\n", name, total, msg.c_str(), waited);
    std::fflush(stdout);
    meshmuon::abort_all(total == 0 ? 42 : 1);
  }
  std::this_thread::sleep_for(seconds(100));  // rank 0's abort ends every rank
  std::_Exit(1);
}

}  // namespace meshmuon::test
