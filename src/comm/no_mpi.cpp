// Built instead of src/comm/mpi/ when DMUON_WITH_MPI=OFF, so callers need no #ifdef (mlx style).
#include <cstdio>
#include <cstdlib>

#include "comm/staging.h"
#include "dmuon/comm.h"
#include "dmuon/error.h"

namespace dmuon {

std::unique_ptr<Communicator> make_mpi_communicator() {
  detail::throw_error("[mpi] dmuon was built without MPI; reconfigure with -DDMUON_WITH_MPI=ON "
                      "(apt-get install libopenmpi-dev) or use the single backend");
}

std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<detail::MemorySpace>, detail::StagingOptions) {
  return make_mpi_communicator();
}

bool mpi_available() { return false; }

void abort_all(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace dmuon
