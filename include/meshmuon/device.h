// Where memory lives and kernels run: a device kind and index. Tensor views and backend buffers carry
// one; the CPU is the default everywhere.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "meshmuon/export.h"

namespace meshmuon {

enum class DeviceKind : unsigned char { Cpu, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU
  friend bool operator==(const Device&, const Device&) = default;
};

MESHMUON_API std::string to_string(const Device& d);  // "cpu", "cuda:0"

// The device a name gives: "cpu", "cuda" (= cuda:0) or "cuda:N" (N a non-negative decimal);
// nullopt for anything else. The options that name a device (OptimizerOptions::device, ...) use it.
MESHMUON_API std::optional<Device> parse_device(std::string_view name);

// A point in a device's queued work: an opaque handle, the device API's event (as a pointer) recorded
// on the stream that writes some buffers; only the backend that recorded it and the transports of
// the same device read it. Empty: nothing to wait for (host memory, or work already complete).
// Backends record them (Backend::fence) and communicators wait for them (Communicator::order_after).
struct DeviceEvent {
  void* handle = nullptr;
  bool empty() const { return handle == nullptr; }
};

}  // namespace meshmuon
