// A rank that stops answering mid-training: the last rank never calls its second step(); the others
// must get a meshmuon::Error naming a timed-out collective within the optimizer's timeout (1 s, no
// hang), agree on the verdict, and rank 0 ends the job with meshmuon::abort_all(42) (CTest expects 42).
// Run: mpirun -n 3 --oversubscribe build-exec/bin/optimizer_timeout_test; echo $?   (42)
#include <chrono>
#include <string>
#include <vector>

#include "meshmuon/optimizer.h"
#include "late_rank.h"

int main() {
  using namespace std::chrono;
  std::shared_ptr<meshmuon::Communicator> comm = meshmuon::make_mpi_communicator();
  const int rank = comm->rank(), size = comm->size();
  meshmuon::ModelDesc m{"timeout", {}};
  meshmuon::ParamSpec p;
  p.name = "w", p.shape = meshmuon::Shape{12, 8}, p.role = meshmuon::Role::Muon;
  m.params.push_back(p);
  meshmuon::ParallelConfig pc;
  pc.dp_shard = size;
  meshmuon::ParamGroup g;
  g.params = {0};
  meshmuon::OptimizerOptions o;
  o.timeout = milliseconds(1000);
  o.env_override = false;
  o.pins = meshmuon::StrategyRules::parse("default:owner_a2a");
  meshmuon::Optimizer opt(comm, meshmuon::apply_parallel(m, pc), {g}, o);
  std::vector<float> w(static_cast<size_t>(opt.local_shape(0).numel()), 1.0f), gr(w.size(), 0.25f);
  std::vector<meshmuon::TensorView> wv{meshmuon::TensorView(w.data(), opt.local_shape(0))};
  std::vector<meshmuon::TensorView> gv{meshmuon::TensorView(gr.data(), opt.local_shape(0))};
  opt.step(wv, gv);  // everyone answers once
  meshmuon::test::late_rank_test("optimizer_timeout_test", rank, size, [&] { opt.step(wv, gv); },
                              {"timed out", "rank " + std::to_string(rank)});
}
