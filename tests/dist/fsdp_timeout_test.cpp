// A rank that stops answering: the last rank never calls reduce_grads(); the others must get a
// meshmuon::Error naming their rank, the stage and the bucket within ShardedParamsOptions::timeout
// (1 s, no hang), agree on the verdict, and rank 0 ends the job with meshmuon::abort_all(42).
// Run: mpirun -n 3 --oversubscribe build/bin/fsdp_timeout_test; echo $?   (42)
#include <chrono>
#include <string>

#include "meshmuon/sharded_params.h"
#include "late_rank.h"

int main() {
  using namespace std::chrono;
  std::shared_ptr<meshmuon::Communicator> comm = meshmuon::make_mpi_communicator();
  const int rank = comm->rank(), size = comm->size();
  meshmuon::ParamSpec p;
  p.name = "w", p.shape = meshmuon::Shape{12, 8}, p.role = meshmuon::Role::Muon;
  meshmuon::ShardedParamsOptions o;
  o.timeout = milliseconds(1000);
  o.bucket_bytes = 0;
  auto comms = std::make_shared<meshmuon::MeshCommunicators>(comm);
  meshmuon::ShardedParams sp(comms, meshmuon::Mesh::parse("dp_shard=" + std::to_string(size)), {p}, o);
  sp.unshard();
  sp.reshard();
  sp.reduce_grads();  // everyone answers once
  meshmuon::test::late_rank_test("fsdp_timeout_test", rank, size, [&] { sp.reduce_grads(); },
                              {"timed out", "rank " + std::to_string(rank), "bucket 0", "shard stage"});
}
