// MPI lifecycle for the mpi backend: init on first use (MPI_THREAD_SERIALIZED), finalize at exit only
// if meshmuon initialized MPI and no collective is stuck, bf16 reduction ops, abort_all.
#include "comm/mpi/mpi_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "meshmuon/bf16.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace detail {
namespace {

// bf16 has no MPI type: it travels as MPI_UINT16_T and reduces through these user ops, rounding to
// bf16 after each addition (what a bf16 accumulator does).
template <class F>
void bf16_apply(void* in, void* inout, int* len, F f) {
  const auto* a = static_cast<const BFloat16*>(in);
  auto* b = static_cast<BFloat16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(f(bf16_to_float(a[i]), bf16_to_float(b[i])));
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_apply(in, inout, len, [](float x, float y) { return x + y; });
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_apply(in, inout, len, [](float x, float y) { return x != x || x > y ? x : y; });
}
void bf16_min(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_apply(in, inout, len, [](float x, float y) { return x != x || x < y ? x : y; });
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MpiRuntime& rt = mpi_runtime();
  if (rt.stuck > 0) {
    // MPI_Finalize would wait for collectives that will never complete.
    std::fprintf(stderr, "[mpi] rank %d: not finalizing MPI: %d collective(s) still posted after a timeout\n",
                 rt.world_rank, rt.stuck);
    return;
  }
  for (MPI_Op& op : rt.bf16_ops)
    if (op != MPI_OP_NULL) MPI_Op_free(&op);
  MPI_Finalize();
}

MpiRuntime init_runtime() {
  MpiRuntime rt;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  MESHMUON_CHECK_RUNTIME(!finalized, "[mpi] MPI was already finalized; create meshmuon communicators before MPI_Finalize");
  if (!initialized) {
    MESHMUON_CHECK_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &rt.thread_level));
    rt.we_initialized = true;
    std::atexit(finalize_at_exit);
  } else {
    MESHMUON_CHECK_MPI(MPI_Query_thread(&rt.thread_level));
  }
  // An application that initialized MPI itself with FUNNELED must make every meshmuon call from its
  // main thread; below FUNNELED, even a compute thread beside MPI is not allowed.
  MESHMUON_CHECK_RUNTIME(rt.thread_level >= MPI_THREAD_FUNNELED, "[mpi] MPI runs at thread level ", rt.thread_level,
                      "; meshmuon needs MPI_THREAD_SERIALIZED (or FUNNELED with every call on the main "
                      "thread): initialize with MPI_Init_thread");
  MESHMUON_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rt.world_rank));
  MESHMUON_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &rt.world_size));
  MESHMUON_CHECK_MPI(MPI_Op_create(bf16_sum, 1, &rt.bf16_ops[static_cast<int>(ReduceOp::Sum)]));
  MESHMUON_CHECK_MPI(MPI_Op_create(bf16_max, 1, &rt.bf16_ops[static_cast<int>(ReduceOp::Max)]));
  MESHMUON_CHECK_MPI(MPI_Op_create(bf16_min, 1, &rt.bf16_ops[static_cast<int>(ReduceOp::Min)]));
  return rt;
}

}  // namespace

MpiRuntime& mpi_runtime() {
  static MpiRuntime rt = init_runtime();
  return rt;
}

MPI_Datatype mpi_datatype(CommType t) {
  switch (t) {
    case CommType::F32: return MPI_FLOAT;
    case CommType::BF16: return MPI_UINT16_T;
    case CommType::I32: return MPI_INT32_T;
    case CommType::I64: return MPI_INT64_T;
    case CommType::U64: return MPI_UINT64_T;
    case CommType::U8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, CommType t) {
  if (t == CommType::BF16) return mpi_runtime().bf16_ops[static_cast<int>(op)];
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

void mpi_fail(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "error %d", code);
  int rank = -1, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw_error(concat("[mpi] rank ", rank, ": ", call, " failed: ", text));
}

}  // namespace detail

bool mpi_available() { return true; }

void abort_all(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace meshmuon
