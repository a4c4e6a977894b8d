// Internal: the backend registry, the one place a backend is found by name. Each backend's unit pair
// registers it: X.cpp (the backend built) adds a factory, no_X.cpp (the build lacks its dependency)
// adds the reason it is missing, so callers need no #ifdef and `meshmuon info` can say why. The
// device names of the options (OptimizerOptions::device, ...) are a registered name, or name:N for a
// backend with several devices ("cuda:1"); select_device (select.h) resolves them here.
//
// The fixed list of built-in registrations is in registry.cpp (explicit calls, not static
// initializers: libmeshmuon_static would drop an unreferenced registering object). Tests register
// more at run time (tests/support/delegate_backend.h) and remove them again.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/memory_space.h"

namespace meshmuon::detail {

class Backend;  // backend.h: the registry names it only, so the communicators that ask it for device
                // names (comm/single) depend on the device side (memory_space.h) alone

// A backend of an engine and the memory space its communicators stage through (single / mpi).
struct EngineDevice {
  std::shared_ptr<Backend> backend;
  // Tells the communicators which pointers are the backend's device memory (single / mpi staging);
  // the host space for the cpu backend.
  std::shared_ptr<MemorySpace> space;
};

// Makes the backend of device `index` (0 for a backend of one device). May throw meshmuon::Error when
// the device cannot run here (no driver, index out of range), naming the cause.
using BackendFactory = std::function<EngineDevice(int index)>;
// The process's memory space of a device kind: nullptr when no such device is usable here (a failing
// probe: CPU-only runs never notice the device).
using SpaceProbe = std::function<std::shared_ptr<MemorySpace>()>;

class BackendRegistry {
 public:
  // Registers `name` (replacing an entry of that name). `indexed`: the device name takes ":N"
  // ("cuda:1"); else only the bare name is a device. `space`: the device's memory space probe, or
  // empty for a backend whose buffers are host memory. `label`: the device's name in messages ("no
  // usable CUDA device"); the name when empty.
  void add(std::string name, BackendFactory make, bool indexed = false, SpaceProbe space = {}, std::string label = {});
  // Registers `name` as missing from this build (no_X.cpp), with the reason and what to do.
  void add_missing(std::string name, std::string why, bool indexed = false, std::string label = {});
  void remove(std::string_view name);  // tests: unregisters a backend they added

  // Every registered name, available or missing, in registration order ("cpu", "cuda", ...).
  std::vector<std::string> names() const;
  // "" when `name` is registered and available; its reason when registered missing; "not registered
  // (registered: ...)" for any other name.
  std::string why_missing(std::string_view name) const;
  // The backend `name` on device `device_index`. std::invalid_argument for an unregistered name;
  // meshmuon::Error "[<name>] <why missing>" for a missing one; the factory's error otherwise.
  EngineDevice make(std::string_view name, int device_index) const;
  // True when `name` is available and, for a backend with a memory-space probe, the probe finds its
  // device here (false for a missing or unregistered name): whether make(name, 0) can run here.
  bool device_found(std::string_view name) const;
  // The first usable device memory space of the registered backends, nullptr when none.
  std::shared_ptr<MemorySpace> device_space() const;
  // "cpu, cuda or cuda:N": the device names the options accept, for error messages.
  std::string device_names() const;
  // A device name the options accept, split: "name" -> {name, 0}, "name:N" -> {name, N} for an indexed
  // backend (N >= 0, digits only); std::nullopt for anything else (the callers raise, naming their
  // option and device_names()).
  struct DeviceName {
    std::string name;
    int index = 0;
  };
  std::optional<DeviceName> parse(std::string_view device) const;
  bool registered(std::string_view name) const;  // available or missing
  bool indexed(std::string_view name) const;     // false for an unregistered name
  std::string label(std::string_view name) const;  // the label given at registration, else the name

 private:
  struct Entry {
    std::string name;
    BackendFactory make;  // empty when missing
    bool indexed = false;
    SpaceProbe space;
    std::string why;  // non-empty when missing
    std::string label;
  };
  const Entry* find(std::string_view name) const;  // mu_ held

  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

BackendRegistry& backend_registry();

// The registrations of the built-in backends: each defined by its backend's unit pair.
void register_cpu_backend(BackendRegistry& r);   // cpu/cpu_backend.cpp (always built)
void register_cuda_backend(BackendRegistry& r);  // cuda/cuda_registration.cpp, or no_cuda.cpp

// The cuda backend's factory (the registry's "cuda" entry; tests and `bench` call it directly):
// meshmuon::Error "[cuda] ..." where it cannot run (no_cuda.cpp: the build has no CUDA).
std::shared_ptr<Backend> make_cuda_backend(int device);

}  // namespace meshmuon::detail
