// Process-wide MPI state for the mpi backend: lifecycle, the broken-after-timeout flag, type and
// op mapping, and MESHMUON_CHECK_MPI. Internal: only src/comm/mpi includes mpi.h (through mpi_api.h:
// libmpi is loaded at run time, and every MPI call goes through its table).
#pragma once

#include "comm/mpi/mpi_api.h"

#include "meshmuon/comm.h"

namespace meshmuon::detail {

struct MpiRuntime {
  int world_rank = 0;
  int world_size = 1;
  int thread_level = MPI_THREAD_SINGLE;
  bool we_initialized = false;  // then meshmuon finalizes MPI at exit
  bool broken = false;          // a wait timed out: no new collectives, no MPI_Finalize while stuck
  int stuck = 0;                // collectives still posted after their wait timed out
  MPI_Op bf16_ops[3] = {nullptr, nullptr, nullptr};  // indexed by ReduceOp (null: not created)
};

// Loads libmpi (mpi_api()) and initializes MPI on first use (see make_mpi_communicator's contract).
MpiRuntime& mpi_runtime();

MPI_Datatype mpi_datatype(CommType t);
MPI_Op mpi_op(ReduceOp op, CommType t);

// Throws meshmuon::Error "[mpi] rank R: <call> failed: <MPI error string>".
[[noreturn]] void mpi_fail(const char* call, int code);

}  // namespace meshmuon::detail

// MESHMUON_CHECK_MPI(api.Ibarrier(comm, &req)): throws meshmuon::Error naming the call, the MPI error
// string and the world rank when the call does not return MPI_SUCCESS (communicators made by meshmuon
// use MPI_ERRORS_RETURN, so failures come back here instead of aborting).
#define MESHMUON_CHECK_MPI(expr)                                                 \
  do {                                                                        \
    const int meshmuon_mpi_rc_ = (expr);                                         \
    if (meshmuon_mpi_rc_ != MPI_SUCCESS) ::meshmuon::detail::mpi_fail(#expr, meshmuon_mpi_rc_); \
  } while (0)
