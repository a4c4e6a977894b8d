// Internal: which backend (and which memory space, for the communicators) an engine runs on.
// OptimizerOptions::device names it ("cpu", "cuda", "cuda:N"); tests inject their own backend (the
// fake device backend of tests/support/) with ScopedEngineDevice, so the public headers stay clean.
#pragma once

#include <memory>
#include <string_view>

#include "backend/backend.h"
#include "comm/memory_space.h"
#include "dmuon/comm.h"

namespace dmuon::detail {

struct EngineDevice {
  std::shared_ptr<Backend> backend;
  // Tells the communicators which pointers are the backend's device memory (single / mpi staging);
  // the host space for the cpu backend.
  std::shared_ptr<MemorySpace> space;
};

// The injected device while a ScopedEngineDevice lives on this thread, else the named one:
// "cpu" -> the cpu backend and the host space; "cuda" / "cuda:N" -> make_cuda_backend(N) and
// default_memory_space(). dmuon::Error (invalid_argument) for any other name.
EngineDevice resolve_engine_device(std::string_view device);

// Test hook: engines constructed on this thread while it lives use `d` whatever options.device says.
class ScopedEngineDevice {
 public:
  explicit ScopedEngineDevice(EngineDevice d);
  ~ScopedEngineDevice();
  ScopedEngineDevice(const ScopedEngineDevice&) = delete;
  ScopedEngineDevice& operator=(const ScopedEngineDevice&) = delete;

 private:
  EngineDevice previous_;
  bool had_previous_ = false;
};

// dmuon::Error (invalid_argument) when the backend keeps its buffers on a device and `comm` cannot
// carry device memory (Communicator::device_buffers): `who` prefixes the message ("[optim]"; empty:
// none). Local, and the same text on every rank (the device's index is left out; the
// communicator's capability is agreed when it is made).
void check_comm_carries_device(const Backend& backend, const Communicator& comm, std::string_view who);

// Where the step's own memory (state without offload, chunk arenas, scratch) comes from.
inline MemoryKind step_memory(const Backend& b) {
  return b.capabilities().device_memory ? MemoryKind::Device : MemoryKind::Host;
}

}  // namespace dmuon::detail
