// Internal: where buffers live, for the components that must not touch device memory from the
// host. A MemorySpace answers "is this pointer device memory?" and copies between device memory and
// pinned host memory it allocates. The communicators that move host memory only (mpi, single) stage
// device buffers through one (comm/staging.h). A device backend registers its own (registry.h: the
// cuda backend's is cudart's, backend/cuda/cuda_memory_space.cpp); the host one says no pointer is
// device memory; tests supply their own (tests/dist/comm_staging_test.cpp marks ranges of an
// inaccessible mapping as "device", so MPI touching them directly would fault).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "meshmuon/device.h"

namespace meshmuon::detail {

class MemorySpace {
 public:
  virtual ~MemorySpace();
  virtual std::string_view name() const = 0;  // "host", a device backend's name, or a test's name
  // True when some pointer may be device memory in this process (a device is present). A
  // communicator stages when this is true on any of its ranks (agreed at creation).
  virtual bool has_devices() const = 0;
  // True when [p, p + bytes) is device memory that MPI must not touch. Never throws.
  virtual bool is_device(const void* p) const = 0;
  // Pinned (page-locked) host memory for staging; free_pinned never throws.
  virtual void* alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p) noexcept = 0;
  // Synchronous copies: when they return the destination holds the data.
  virtual void copy_to_host(void* host, const void* device, size_t bytes) = 0;
  virtual void copy_to_device(void* device, const void* host, size_t bytes) = 0;
  // Waits on the host until the device work recorded in `e` (a DeviceEvent of this space's device,
  // not empty) has run. meshmuon::Error "[<who>] ..." on a device error. The default (a space without
  // a device) refuses any event: nothing in this process can have recorded one.
  virtual void wait_on_host(DeviceEvent e, std::string_view who);
  // std::invalid_argument "<who>: this process sees ..." when `index` names no device of this space
  // that the process sees. The default (one device, or none): only index 0.
  virtual void check_device_index(int index, std::string_view who) const;
};

// No device memory: is_device is always false, pinned memory is plain aligned heap memory.
std::shared_ptr<MemorySpace> host_memory_space();
// The first registered device backend's space whose device is usable here (registry.h), else the
// host one. A failing device probe (no driver, no device) gives the host one: CPU-only runs never
// notice a device.
std::shared_ptr<MemorySpace> default_memory_space();
// Waits on the host until the device work recorded in `e` has run (an empty event returns at once;
// else default_memory_space()->wait_on_host): Communicator::order_after for transports that cannot
// wait on the device. meshmuon::Error "[<who>] ..." on a device error, or a non-empty event in a
// process without a device.
void wait_on_host(DeviceEvent e, std::string_view who);

}  // namespace meshmuon::detail
