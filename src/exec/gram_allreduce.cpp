// Internal: the gram_allreduce strategy. A matrix sharded only along its long dim runs Newton–Schulz
// on its local slice; each step all-reduces the small s×s Gram matrix over the shard group (s = the
// short dim). Not bitwise layout-invariant: MPI's sum order differs from a single process's BLAS
// (docs/executor.md gives the tolerance the tests use).
#include <string>

#include "dmuon/error.h"
#include "exec/executor.h"

namespace dmuon::detail {

void run_gram(Optimizer::Impl& s, const StepInputs& in, int entry, float* update) {
  const PlanEntry& e = s.plan.entries()[static_cast<size_t>(entry)];
  const ParamLayout& L = s.routes.layouts[static_cast<size_t>(e.param)];
  const GroupOptions& o = in.options[static_cast<size_t>(s.group_of[static_cast<size_t>(e.param)])];
  const GroupKey key{e.mesh, e.group_dims};
  size_t gi = 0;
  while (!(s.routes.group_keys[gi] == key)) ++gi;
  Communicator& comm = *s.group_comms[gi];
  const Shape local = L.box.shape();
  const bool wide = L.rows <= L.cols;  // Gram side: rows (wide) or cols (tall)
  const std::string base = "param '" + s.plan.inventory().params[static_cast<size_t>(e.param)].name + "' gram step ";
  // the backend runs the iteration; each step's s×s Gram matrix is summed over the shard group here
  const GramReduce reduce = [&](float* a, size_t count, int step, DeviceEvent ready) {
    comm.order_after(ready);  // nccl: on the device; a staging or host communicator waits here
    Work w = comm.all_reduce(OutBuffer(a, CommType::F32, count), ReduceOp::Sum, base + std::to_string(step));
    wait_work(s, w);
  };
  s.backend->gram_newton_schulz(o.ns, update, local[0], local[1], wide, wide ? L.rows : L.cols, reduce,
                                s.options.comm_dtype);
}

}  // namespace dmuon::detail
