// Built instead of src/comm/mpi/ when MESHMUON_WITH_MPI=OFF, so callers need no #ifdef (mlx style).
#include <cstdio>
#include <cstdlib>

#include "comm/staging.h"
#include "comm/transport_registry.h"
#include "meshmuon/comm.h"
#include "meshmuon/error.h"

namespace meshmuon {

std::unique_ptr<Communicator> make_mpi_communicator() {
  detail::throw_error("[mpi] meshmuon was built without MPI; reconfigure with -DMESHMUON_WITH_MPI=ON "
                      "(apt-get install libopenmpi-dev) or use the single backend");
}

std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<detail::MemorySpace>, detail::StagingOptions) {
  return make_mpi_communicator();
}

bool mpi_available() { return false; }

namespace detail {
void register_mpi_transport(TransportRegistry& r) {
  r.add_missing("mpi", "meshmuon was built without MPI; reconfigure with -DMESHMUON_WITH_MPI=ON (apt-get install "
                       "libopenmpi-dev) or use the single backend");
}
}  // namespace detail

void abort_all(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace meshmuon
