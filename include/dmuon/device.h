// Where memory lives and kernels run: a device kind and index. Tensor views and backend buffers carry
// one; the CPU is the default everywhere.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "dmuon/export.h"

namespace dmuon {

enum class DeviceKind : unsigned char { Cpu, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU
  friend bool operator==(const Device&, const Device&) = default;
};

DMUON_API std::string to_string(const Device& d);  // "cpu", "cuda:0"

// The device a name gives: "cpu", "cuda" (= cuda:0) or "cuda:N" (N a non-negative decimal);
// nullopt for anything else. The options that name a device (OptimizerOptions::device, ...) use it.
DMUON_API std::optional<Device> parse_device(std::string_view name);

}  // namespace dmuon
