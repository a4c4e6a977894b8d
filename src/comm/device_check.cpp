// Internal: device_check.h.
#include "comm/device_check.h"

#include <string>

#include "meshmuon/error.h"

namespace meshmuon::detail {

void check_comm_carries_device(const DeviceServices& backend, const Communicator& comm, std::string_view who) {
  if (!backend.device_caps().device_memory || comm.device_buffers()) return;
  // The device kind without its index: the same text on every rank (agreements compare it).
  std::string kind = to_string(Device{backend.device().kind, 0});
  kind = kind.substr(0, kind.find(':'));
  throw_invalid_argument(concat(who, who.empty() ? "" : " ", "the engine runs on ", kind,
                                " (its buffers are device memory) but communicator '", comm.name(), "' (backend '",
                                comm.backend(), "') carries host memory only: pass make_single_communicator(\"", kind,
                                "\") for one rank, make_nccl_communicator(), or make_mpi_communicator() on a machine "
                                "where the GPU is visible (it stages through pinned memory); or run the engine on the "
                                "cpu"));
}

}  // namespace meshmuon::detail
