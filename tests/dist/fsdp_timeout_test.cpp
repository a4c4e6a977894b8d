// A rank that stops answering: the last rank never calls reduce_grads(); the others must get a
// dmuon::Error naming their rank, the stage and the bucket within ShardedParamsOptions::timeout
// (1 s, no hang), agree on the verdict, and rank 0 ends the job with dmuon::abort_all(42).
// Run: mpirun -n 3 --oversubscribe build/bin/fsdp_timeout_test; echo $?   (42)
#include <chrono>
#include <string>

#include "dmuon/sharded_params.h"
#include "late_rank.h"

int main() {
  using namespace std::chrono;
  std::shared_ptr<dmuon::Communicator> comm = dmuon::make_mpi_communicator();
  const int rank = comm->rank(), size = comm->size();
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
  dmuon::test::late_rank_test("fsdp_timeout_test", rank, size, [&] { sp.reduce_grads(); },
                              {"timed out", "rank " + std::to_string(rank), "bucket 0", "shard stage"});
}
