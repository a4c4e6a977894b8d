// Internal: whether a communicator can carry the memory of an engine's backend.
#pragma once

#include <string_view>

#include "backend/device_services.h"
#include "meshmuon/comm.h"

namespace meshmuon::detail {

// meshmuon::Error (invalid_argument) when the backend keeps its buffers on a device and `comm` cannot
// carry device memory (Communicator::device_buffers): `who` prefixes the message ("[optim]"; empty:
// none). Local, and the same text on every rank (the device's index is left out; the
// communicator's capability is agreed when it is made).
void check_comm_carries_device(const DeviceServices& backend, const Communicator& comm, std::string_view who);

}  // namespace meshmuon::detail
