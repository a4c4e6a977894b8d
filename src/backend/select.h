// Internal: the one place a backend is chosen by device name (a registered backend's name, or name:N
// for one with several devices: the option `device` of Optimizer, LocalOptimizer and ShardedParams),
// through the registry (registry.h), with the memory space the communicators stage through. Tests inject their own backend (the fake device backend of tests/support/) with
// ScopedEngineDevice, so the public headers stay clean.
#pragma once

#include <memory>
#include <string_view>

#include "backend/backend.h"
#include "backend/memory_space.h"
#include "backend/registry.h"

namespace meshmuon::detail {

// The named device: backend_registry().make(name, N) for "name" (N = 0) or "name:N" (a backend
// registered `indexed`). std::invalid_argument "[backend] option 'device' must be cpu, cuda or cuda:N
// (got '...')" (the registered names) for any other name; meshmuon::Error where the backend is
// missing from this build or cannot run here (the registry's reason).
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
inline MemoryKind step_memory(const DeviceServices& b) {
  return b.device_caps().device_memory ? MemoryKind::Device : MemoryKind::Host;
}

}  // namespace meshmuon::detail
