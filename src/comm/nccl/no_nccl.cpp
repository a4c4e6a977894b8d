// Built instead of nccl_loader.cpp, nccl_transport.cpp and comm_nccl.cpp when the build has no
// CUDA or no NCCL headers, so callers need no #ifdef: every way to make an nccl communicator throws
// meshmuon::Error naming the cause.
#include "comm/nccl/nccl_args.h"
#include "meshmuon/comm_nccl.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

[[noreturn]] void unavailable() {
#ifdef MESHMUON_HAVE_CUDA
  detail::throw_error("[nccl] meshmuon was built without the NCCL headers (pip install nvidia-nccl-cu13, then "
                      "reconfigure; the configure summary says what was missing); use the mpi communicator");
#else
  detail::throw_error("[nccl] meshmuon was built without CUDA; reconfigure with -DMESHMUON_WITH_CUDA=ON on a machine "
                      "with the CUDA toolkit and nvidia-nccl-cu13, or use the mpi communicator");
#endif
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, CommExchange exchange, int, std::string) {
  detail::check_nccl_args(rank, size, exchange);
  unavailable();
}
std::unique_ptr<Communicator> make_nccl_communicator() { unavailable(); }
bool nccl_available() { return false; }

}  // namespace meshmuon
