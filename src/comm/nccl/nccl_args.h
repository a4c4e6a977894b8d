// Internal: the argument checks of make_nccl_communicator (comm_nccl.h), shared by the real
// communicator and the stand-in of builds without NCCL, so bad arguments get the same error in
// every build, before the build's own limits are reported.
#pragma once

#include "dmuon/comm_nccl.h"
#include "dmuon/error.h"

namespace dmuon::detail {

inline void check_nccl_args(int rank, int size, const CommExchange& exchange) {
  DMUON_CHECK(size > 0 && rank >= 0 && rank < size, "[nccl] make_nccl_communicator: rank ", rank, " is not in [0, ",
              size, "); pass this process's rank and the number of ranks");
  DMUON_CHECK(static_cast<bool>(exchange), "[nccl] make_nccl_communicator: the exchange function is empty");
}

}  // namespace dmuon::detail
