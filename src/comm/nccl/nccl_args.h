// Internal: the argument checks of make_nccl_communicator (comm_nccl.h), shared by the real
// communicator and the stand-in of builds without NCCL, so bad arguments get the same error in
// every build, before the build's own limits are reported.
#pragma once

#include "meshmuon/comm_nccl.h"
#include "meshmuon/error.h"

namespace meshmuon::detail {

inline void check_nccl_args(int rank, int size, const CommExchange& exchange) {
  MESHMUON_CHECK(size > 0 && rank >= 0 && rank < size, "[nccl] make_nccl_communicator: rank ", rank, " is not in [0, ",
              size, "); pass this process's rank and the number of ranks");
  MESHMUON_CHECK(static_cast<bool>(exchange), "[nccl] make_nccl_communicator: the exchange function is empty");
}

}  // namespace meshmuon::detail
