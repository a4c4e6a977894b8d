// Built instead of nccl_loader.cpp, nccl_transport.cpp and comm_nccl.cpp when the build has no
// CUDA or no NCCL headers, so callers need no #ifdef: every way to make an nccl communicator throws
// meshmuon::Error naming the cause, and the transport registry lists nccl as missing with it.
#include <string>

#include "backend/registry.h"
#include "comm/nccl/nccl_args.h"
#include "comm/transport_registry.h"
#include "meshmuon/comm_nccl.h"
#include "meshmuon/error.h"

namespace meshmuon {
namespace {

// Why: no CUDA at all (the backend registry lists cuda as missing), or CUDA without the NCCL headers.
std::string why_missing() {
  if (!detail::backend_registry().why_missing("cuda").empty())
    return "meshmuon was built without CUDA; reconfigure with -DMESHMUON_WITH_CUDA=ON on a machine with the CUDA "
           "toolkit and nvidia-nccl-cu13, or use the mpi communicator";
  return "meshmuon was built without the NCCL headers (pip install nvidia-nccl-cu13, then reconfigure; the "
         "configure summary says what was missing); use the mpi communicator";
}

[[noreturn]] void unavailable() { detail::throw_error("[nccl] " + why_missing()); }

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, CommExchange exchange, int, std::string) {
  detail::check_nccl_args(rank, size, exchange);
  unavailable();
}
std::unique_ptr<Communicator> make_nccl_communicator() { unavailable(); }
bool nccl_available() { return false; }

namespace detail {
void register_nccl_transport(TransportRegistry& r) { r.add_missing("nccl", why_missing()); }
}  // namespace detail

}  // namespace meshmuon
