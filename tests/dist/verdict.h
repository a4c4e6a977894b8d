// The end of a distributed test program with its own main: every rank's failure count is
// max-reduced, so every rank exits non-zero when any rank failed; a job that cannot even agree (a
// broken communicator) is ended through abort_all, since MPI could not finalize.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "meshmuon/comm.h"

namespace meshmuon::test {

// Returns the process exit code: 0 when no rank failed, 1 otherwise. Rank 0 prints "<what>: ok|FAILED".
inline int agree_verdict(Communicator& comm, int failures, const std::string& what) {
  int32_t failed = failures > 0 ? 1 : 0;
  try {
    comm.all_reduce(OutBuffer(&failed, CommType::I32, 1), ReduceOp::Max, "verdict").wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] no verdict: %s\n", comm.rank(), e.what());
    abort_all(1);
  }
  if (comm.rank() == 0) std::printf("%s: %s\n", what.c_str(), failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}

}  // namespace meshmuon::test
