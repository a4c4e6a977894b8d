// Internal: the gram_allreduce strategy (gram_allreduce.h).
#include "exec/gram_allreduce.h"

namespace meshmuon::detail {

void run_gram(Backend& backend, Communicator& group, const ParamLayout& L, const std::string& name, const NsOptions& ns,
              float* update, DType comm_dtype, std::chrono::milliseconds timeout) {
  const Shape local = L.box.shape();
  const bool wide = L.rows <= L.cols;  // Gram side: rows (wide) or cols (tall)
  const std::string base = "param '" + name + "' gram step ";
  // the backend runs the iteration; each step's s×s Gram matrix is summed over the shard group here
  const GramReduce reduce = [&](float* a, size_t count, int step, DeviceEvent ready) {
    group.order_after(ready);  // nccl: on the device; a staging or host communicator waits here
    Work w = group.all_reduce(OutBuffer(a, CommType::F32, count), ReduceOp::Sum, base + std::to_string(step));
    w.wait(timeout);
  };
  backend.gram_newton_schulz(ns, update, local[0], local[1], wide, wide ? L.rows : L.cols, reduce, comm_dtype);
}

}  // namespace meshmuon::detail
