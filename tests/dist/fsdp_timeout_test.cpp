// A rank that stops answering: the last rank never calls reduce_grads(); the others must get a
// dmuon::Error naming their rank, the stage and the bucket within ShardedParamsOptions::timeout
// (1 s, no hang), agree on the verdict, and rank 0 ends the job with dmuon::abort_all(42).
// Run: mpirun -n 3 --oversubscribe build/bin/fsdp_timeout_test; echo $?   (42)
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "dmuon/error.h"
#include "dmuon/sharded_params.h"

int main() {
  using namespace std::chrono;
  std::shared_ptr<dmuon::Communicator> comm = dmuon::make_mpi_communicator();
  const int rank = comm->rank(), size = comm->size(), late = size - 1;
  MPI_Comm waiters = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank == late ? MPI_UNDEFINED : 0, rank, &waiters);
  dmuon::ParamSpec p;
  p.name = "w", p.shape = dmuon::Shape{12, 8}, p.role = dmuon::Role::Muon;
  dmuon::ShardedParamsOptions o;
  o.timeout = milliseconds(1000);
  o.bucket_bytes = 0;
  auto comms = std::make_shared<dmuon::MeshCommunicators>(comm);
  dmuon::ShardedParams sp(comms, dmuon::Mesh::parse("dp_shard=" + std::to_string(size)), {p}, o);
  sp.unshard();
  sp.reshard();
  sp.reduce_grads();  // everyone answers once
  if (rank == late) {
    std::this_thread::sleep_for(seconds(100));  // stops answering; ended by rank 0's abort
    return 1;
  }
  int failures = 0;
  const auto start = steady_clock::now();
  std::string msg;
  try {
    sp.reduce_grads();
  } catch (const dmuon::Error& e) {
    msg = e.what();
  }
  const double waited = duration<double>(steady_clock::now() - start).count();
  for (const std::string& want : std::vector<std::string>{"timed out", "rank " + std::to_string(rank), "bucket 0", "shard stage"})
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
    std::printf("fsdp_timeout_test: %d failure(s); '%s' after %.2f s; ending the job\n", total, msg.c_str(), waited);
    std::fflush(stdout);
    dmuon::abort_all(total == 0 ? 42 : 1);
  }
  std::this_thread::sleep_for(seconds(100));
  return 1;
}
