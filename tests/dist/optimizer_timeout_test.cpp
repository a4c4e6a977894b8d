// A rank that stops answering mid-training: the last rank never calls its second step(); the others
// must get a dmuon::Error naming a timed-out collective within the optimizer's timeout (1 s, no
// hang), agree on the verdict, and rank 0 ends the job with dmuon::abort_all(42) (CTest expects 42).
// Run: mpirun -n 3 --oversubscribe build-exec/bin/optimizer_timeout_test; echo $?   (42)
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "dmuon/error.h"
#include "dmuon/optimizer.h"

int main() {
  using namespace std::chrono;
  std::shared_ptr<dmuon::Communicator> comm = dmuon::make_mpi_communicator();
  const int rank = comm->rank(), size = comm->size(), late = size - 1;
  MPI_Comm waiters = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank == late ? MPI_UNDEFINED : 0, rank, &waiters);
  dmuon::ModelDesc m{"timeout", {}};
  dmuon::ParamSpec p;
  p.name = "w", p.shape = dmuon::Shape{12, 8}, p.role = dmuon::Role::Muon;
  m.params.push_back(p);
  dmuon::ParallelConfig pc;
  pc.dp_shard = size;
  dmuon::ParamGroup g;
  g.params = {0};
  dmuon::OptimizerOptions o;
  o.timeout = milliseconds(1000);
  o.env_override = false;
  o.pins = dmuon::StrategyRules::parse("default:owner_a2a");
  dmuon::Optimizer opt(comm, dmuon::apply_parallel(m, pc), {g}, o);
  std::vector<float> w(static_cast<size_t>(opt.local_shape(0).numel()), 1.0f), gr(w.size(), 0.25f);
  std::vector<dmuon::TensorView> wv{dmuon::TensorView(w.data(), opt.local_shape(0))};
  std::vector<dmuon::TensorView> gv{dmuon::TensorView(gr.data(), opt.local_shape(0))};
  opt.step(wv, gv);  // everyone answers once
  if (rank == late) {
    std::this_thread::sleep_for(seconds(100));  // stops answering; ended by rank 0's abort
    return 1;
  }
  int failures = 0;
  const auto start = steady_clock::now();
  std::string msg;
  try {
    opt.step(wv, gv);
  } catch (const dmuon::Error& e) {
    msg = e.what();
  }
  const double waited = duration<double>(steady_clock::now() - start).count();
  if (msg.find("timed out") == std::string::npos || msg.find("rank " + std::to_string(rank)) == std::string::npos) {
    std::fprintf(stderr, "[rank %d] FAILED: expected a timeout error, got '%s'\n", rank, msg.c_str());
    ++failures;
  }
  if (waited > 10) {
    std::fprintf(stderr, "[rank %d] FAILED: the timeout took %.1f s\n", rank, waited);
    ++failures;
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, waiters);
  if (rank == 0) {
    std::printf("optimizer_timeout_test: %d failure(s); '%s' after %.2f s; ending the job\n", total, msg.c_str(), waited);
    std::fflush(stdout);
    dmuon::abort_all(total == 0 ? 42 : 1);
  }
  std::this_thread::sleep_for(seconds(100));
  return 1;
}
