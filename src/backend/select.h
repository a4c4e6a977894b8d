// Internal: the one place a backend is chosen by device name ("cpu", "cuda", "cuda:N": the option
// `device` of Optimizer, LocalOptimizer and ShardedParams), with the memory space the communicators
// stage through. Tests inject their own backend (the fake device backend of tests/support/) with
// ScopedEngineDevice, so the public headers stay clean.
#pragma once

#include <memory>
#include <string_view>

#include "backend/backend.h"
#include "backend/memory_space.h"

namespace meshmuon::detail {

struct EngineDevice {
  std::shared_ptr<Backend> backend;
  // Tells the communicators which pointers are the backend's device memory (single / mpi staging);
  // the host space for the cpu backend.
  std::shared_ptr<MemorySpace> space;
};

// The named device: "cpu" -> the cpu backend and the host space; "cuda" / "cuda:N" ->
// make_cuda_backend(N) and default_memory_space(). std::invalid_argument for any other name;
// meshmuon::Error where the cuda backend cannot run.
EngineDevice select_device(std::string_view device);
// The injected device while a ScopedEngineDevice lives on this thread, else select_device(device).
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

// Where the step's own memory (state without offload, chunk arenas, scratch) comes from.
inline MemoryKind step_memory(const Backend& b) {
  return b.capabilities().device_memory ? MemoryKind::Device : MemoryKind::Host;
}

}  // namespace meshmuon::detail
