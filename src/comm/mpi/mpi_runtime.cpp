// MPI lifecycle for the mpi backend (libmpi loaded at run time: mpi_api.h): init on first use (MPI_THREAD_SERIALIZED), finalize at exit only
// if meshmuon initialized MPI and no collective is stuck, bf16 reduction ops, abort_all.
#include "comm/mpi/mpi_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "comm/transport_registry.h"
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
  const MpiApi& api = mpi_api();  // loaded: registered after MPI_Init_thread
  int finalized = 0;
  api.Finalized(&finalized);
  if (finalized) return;
  MpiRuntime& rt = mpi_runtime();
  if (rt.stuck > 0) {
    // MPI_Finalize would wait for collectives that will never complete.
    std::fprintf(stderr, "[mpi] rank %d: not finalizing MPI: %d collective(s) still posted after a timeout\n",
                 rt.world_rank, rt.stuck);
    return;
  }
  for (MPI_Op& op : rt.bf16_ops)
    if (op != nullptr && op != api.OP_NULL) api.Op_free(&op);
  api.Finalize();
}

MpiRuntime init_runtime() {
  const MpiApi& api = mpi_api();  // throws, naming what was tried, where no Open MPI loads
  MpiRuntime rt;
  int initialized = 0, finalized = 0;
  api.Initialized(&initialized);
  api.Finalized(&finalized);
  MESHMUON_CHECK_RUNTIME(!finalized, "[mpi] MPI was already finalized; create meshmuon communicators before MPI_Finalize");
  if (!initialized) {
    MESHMUON_CHECK_MPI(api.Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &rt.thread_level));
    rt.we_initialized = true;
    std::atexit(finalize_at_exit);
  } else {
    MESHMUON_CHECK_MPI(api.Query_thread(&rt.thread_level));
  }
  // An application that initialized MPI itself with FUNNELED must make every meshmuon call from its
  // main thread; below FUNNELED, even a compute thread beside MPI is not allowed.
  MESHMUON_CHECK_RUNTIME(rt.thread_level >= MPI_THREAD_FUNNELED, "[mpi] MPI runs at thread level ", rt.thread_level,
                      "; meshmuon needs MPI_THREAD_SERIALIZED (or FUNNELED with every call on the main "
                      "thread): initialize with MPI_Init_thread");
  MESHMUON_CHECK_MPI(api.Comm_rank(api.COMM_WORLD, &rt.world_rank));
  MESHMUON_CHECK_MPI(api.Comm_size(api.COMM_WORLD, &rt.world_size));
  MESHMUON_CHECK_MPI(api.Op_create(bf16_sum, 1, &rt.bf16_ops[static_cast<int>(ReduceOp::Sum)]));
  MESHMUON_CHECK_MPI(api.Op_create(bf16_max, 1, &rt.bf16_ops[static_cast<int>(ReduceOp::Max)]));
  MESHMUON_CHECK_MPI(api.Op_create(bf16_min, 1, &rt.bf16_ops[static_cast<int>(ReduceOp::Min)]));
  return rt;
}

}  // namespace

MpiRuntime& mpi_runtime() {
  static MpiRuntime rt = init_runtime();
  return rt;
}

MPI_Datatype mpi_datatype(CommType t) {
  const MpiApi& api = mpi_api();
  switch (t) {
    case CommType::F32: return api.FLOAT;
    case CommType::BF16: return api.UINT16_T;
    case CommType::I32: return api.INT32_T;
    case CommType::I64: return api.INT64_T;
    case CommType::U64: return api.UINT64_T;
    case CommType::U8: return api.UINT8_T;
  }
  return api.DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, CommType t) {
  if (t == CommType::BF16) return mpi_runtime().bf16_ops[static_cast<int>(op)];
  const MpiApi& api = mpi_api();
  switch (op) {
    case ReduceOp::Sum: return api.SUM;
    case ReduceOp::Max: return api.MAX;
    case ReduceOp::Min: return api.MIN;
  }
  return api.OP_NULL;
}

void mpi_fail(const char* call, int code) {
  // The call as MESHMUON_CHECK_MPI spelled it ("api.Ibarrier(...)"), named as MPI names it.
  std::string what = call;
  if (what.rfind("api.", 0) == 0) what = "MPI_" + what.substr(4);
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  int rank = -1;
  const MpiApi* api = mpi_api_if_loaded();
  if (api == nullptr || api->Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "error %d", code);
  if (api != nullptr) {
    int initialized = 0, finalized = 0;
    api->Initialized(&initialized);
    api->Finalized(&finalized);
    if (initialized && !finalized) api->Comm_rank(api->COMM_WORLD, &rank);
  }
  throw_error(concat("[mpi] rank ", rank, ": ", what, " failed: ", text));
}

}  // namespace detail

// True in a build with the mpi backend, whether or not libmpi can be loaded here (that is known when
// make_mpi_communicator first needs it).
bool mpi_available() { return true; }

namespace detail {
void register_mpi_transport(TransportRegistry& r) {
  r.add("mpi", [] { return make_mpi_communicator(); });
}
}  // namespace detail

// Works whether or not libmpi is loaded: MPI_Abort only where MPI is in the process and running.
void abort_all(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (const detail::MpiApi* api = detail::mpi_api_if_loaded()) {
    int initialized = 0, finalized = 0;
    api->Initialized(&initialized);
    api->Finalized(&finalized);
    if (initialized && !finalized) api->Abort(api->COMM_WORLD, code);
  }
  std::_Exit(code);
}

}  // namespace meshmuon
