// Internal: the gram_allreduce strategy. A matrix sharded only along its long dim runs Newton–Schulz
// on its local slice; each step all-reduces the small s×s Gram matrix over the shard group (s = the
// short dim). Not bitwise layout-invariant: MPI's sum order differs from a single process's BLAS
// (docs/executor.md gives the tolerance the tests use).
#pragma once

#include <chrono>
#include <string>

#include "backend/backend.h"
#include "meshmuon/comm.h"
#include "meshmuon/orthogonalize.h"
#include "exec/routes.h"

namespace meshmuon::detail {

// Orthogonalizes `update` (this rank's slice of parameter `name`, layout L) in place, blocking, on
// the driving thread; `group` is the parameter's shard group, each Gram sum waited for up to `timeout`.
void run_gram(Backend& backend, Communicator& group, const ParamLayout& L, const std::string& name, const NsOptions& ns,
              float* update, DType comm_dtype, std::chrono::milliseconds timeout);

}  // namespace meshmuon::detail
