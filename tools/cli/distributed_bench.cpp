#include "distributed_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "meshmuon/comm.h"
#include "meshmuon/error.h"

namespace meshmuon::cli {

std::string bench_backend(const std::string& backend) {
  if (!backend.empty()) return backend;
  return std::getenv("OMPI_COMM_WORLD_SIZE") ? "mpi" : "single";
}

double upper_median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double slowest(Communicator& c, double x) {
  c.all_reduce(OutBuffer(&x, CommType::I64, 1), ReduceOp::Max, "bench max").wait();
  return x;
}

void run_distributed(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    if (std::getenv("OMPI_COMM_WORLD_SIZE") && mpi_available()) {  // a broken job cannot finalize
      std::fprintf(stderr, "meshmuon: error: %s\n", e.what());
      abort_all(1);
    }
    throw;
  }
}

}  // namespace meshmuon::cli
