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

// A point in a CUDA device's queued work: a cudaEvent_t (as a pointer) recorded on the stream that
// writes some buffers. Empty: nothing to wait for (host memory, or work already complete). Backends
// record them (Backend::fence) and communicators wait for them (Communicator::order_after).
struct DeviceEvent {
  void* cuda_event = nullptr;
  bool empty() const { return cuda_event == nullptr; }
};

}  // namespace meshmuon
